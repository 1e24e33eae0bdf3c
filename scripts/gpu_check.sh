#!/usr/bin/env bash
# The GPU check of issue 30, for a session with one NVIDIA GPU (H100/H200; torch 2.11+ with CUDA;
# no streamlit/plotly needed): every variant profiled on the GPU at world sizes 1, 2 and 4
# (ranks sharing the GPU over gloo) and at world size 1 on NCCL, in bf16 and fp32; verify on the
# GPU; the tests marked `gpu`; allreduce on the GPU. Small model, few steps: the whole script fits
# one call of 9 minutes (each step has its own timeout, and steps are skipped, said so, once
# BUDGET_S is spent). It prints a compact summary at the end; logs and runs are under $OUT.
#
#   bash scripts/gpu_check.sh            # from the repository root
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dpcore-gpu-check}
BUDGET_S=${BUDGET_S:-480}
mkdir -p "$OUT/logs" "$OUT/runs"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
SUMMARY=()

step() {  # step NAME TIMEOUT_S COMMAND...: run it, log it, one summary line
  local name=$1 limit=$2; shift 2
  local used=$(( $(date +%s) - START ))
  if (( used + 20 > BUDGET_S )); then SUMMARY+=("$(printf '%-26s SKIPPED (budget spent: %ss)' "$name" "$used")"); return; fi
  (( limit > BUDGET_S - used )) && limit=$(( BUDGET_S - used ))
  local t0=$(date +%s) rc=0
  timeout "$limit" "$@" >"$OUT/logs/$name.log" 2>&1 || rc=$?
  local status=ok; (( rc != 0 )) && status="FAILED rc=$rc"; (( rc == 124 )) && status="TIMED OUT after ${limit}s"
  local info; info=$(grep -m1 '^dpcore: ' "$OUT/logs/$name.log" | cut -c9-150)
  (( rc != 0 )) && info="$(grep -v '^\s*$' "$OUT/logs/$name.log" | tail -n 1 | cut -c1-150)"
  SUMMARY+=("$(printf '%-26s %-22s %4ss  %s' "$name" "$status" "$(( $(date +%s) - t0 ))" "$info")")
}

python - <<'PY' 2>&1 | tee "$OUT/logs/host.log"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "GPUs", torch.cuda.device_count(),
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
      "bf16", torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
      "nccl", torch.distributed.is_nccl_available())
PY

SMALL=(--model mlp --width 256 --batch-size 16 --steps 3 --warmup 1 --profile-steps 1
       --calibration-steps 0 --progress json --out "$OUT/runs")
step profile-gloo-bf16-ws124 200 python -m dpcore profile --device cuda --backend gloo --dtype bf16 \
     --variants all --world-sizes 1,2,4 --run-id gloo-bf16 "${SMALL[@]}"
step profile-gloo-fp32-ws124 150 python -m dpcore profile --device cuda --backend gloo --dtype fp32 \
     --variants all --world-sizes 1,2,4 --no-trace --run-id gloo-fp32 "${SMALL[@]}"
step profile-nccl-bf16-ws1 80 python -m dpcore profile --device cuda --backend nccl --dtype bf16 \
     --variants all --world-sizes 1 --run-id nccl-bf16 "${SMALL[@]}"
step profile-nccl-fp32-ws1 80 python -m dpcore profile --device cuda --backend nccl --dtype fp32 \
     --variants all --world-sizes 1 --no-trace --run-id nccl-fp32 "${SMALL[@]}"
step verify-cuda-bf16-ws2 90 python -m dpcore verify --device cuda --dtype bf16 --world-size 2
step verify-cuda-fp32-ws2 90 python -m dpcore verify --device cuda --dtype fp32 --world-size 2
step pytest-gpu 150 python -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors tests/write tests/contract
step allreduce-cuda-gloo 60 python -m dpcore allreduce --device cuda --backend gloo --world-sizes 2 \
     --sizes 4KB,1MB --repeats 5 --progress json --out "$OUT/runs" --run-id ar-gloo
step allreduce-cuda-nccl 60 python -m dpcore allreduce --device cuda --backend nccl --world-sizes 1 \
     --algos native --sizes 4KB,1MB --repeats 5 --progress json --out "$OUT/runs" --run-id ar-nccl
# the read side on what the GPU just wrote: the GPU ledger, overlap, the per-job table, and the
# what-if from a world-size-1 NCCL job to 8 and 64 GPUs on an NVLink preset (issue 32)
step gpu-ledger-gloo-bf16 60 python -m dpcore gpu "$OUT/runs/gloo-bf16"
step analyze-nccl-bf16 60 python -m dpcore analyze "$OUT/runs/nccl-bf16"
step summarize-gloo-fp32 30 python -m dpcore summarize "$OUT/runs/gloo-fp32"
step whatif-ws1-nvlink 60 python -m dpcore whatif "$OUT/runs/nccl-bf16" --job torch_ddp-ws1-b25 \
     --world-sizes 8,64 --fabric nvlink-h100
step whatif-ws1-csv 60 python -m dpcore whatif "$OUT/runs/nccl-bf16" --job bucketed-ws1-b25 \
     --world-sizes 2,8 --fabric nvlink-h100,ib-ndr400 --csv

echo
echo "== steps ($(( $(date +%s) - START )) s in all; logs in $OUT/logs)"
printf '%s\n' "${SUMMARY[@]}"
echo
echo "== verify"
for f in "$OUT"/logs/verify-*.log; do [ -f "$f" ] && { echo "-- $(basename "$f" .log)"; grep -E 'DIFFERS|error|skipped|match|lossy' "$f" | awk '{print $1, $3, $4, $5, $6, $7}' | head -20; }; done
echo
echo "== read side (tails)"
for n in gpu-ledger-gloo-bf16 analyze-nccl-bf16 whatif-ws1-nvlink whatif-ws1-csv; do
  [ -f "$OUT/logs/$n.log" ] && { echo "-- $n"; head -c 2500 "$OUT/logs/$n.log" | head -n 30; }
done
echo
echo "== gpu tests"
tail -n 3 "$OUT/logs/pytest-gpu.log" 2>/dev/null
echo
echo "== runs (job statuses from run.json; collectives of the sharded jobs from collectives.csv)"
python - "$OUT/runs" <<'PY'
import csv, json, sys
from collections import Counter
from pathlib import Path
for run in sorted(Path(sys.argv[1]).iterdir()):
    meta_path = run / "run.json"
    if not meta_path.is_file():
        continue
    meta = json.loads(meta_path.read_text())
    env, cfg, jobs = meta.get("environment", {}), meta.get("config", {}), meta.get("jobs", [])
    counts = Counter(j.get("status") for j in jobs)
    print(f"{run.name}: {meta.get('status')} | {env.get('device')}/{env.get('backend')} "
          f"{env.get('devices')} | dtype {cfg.get('dtype')} tf32 {cfg.get('tf32')} | "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=str)))
    for j in jobs:
        if j.get("status") in ("failed", "skipped"):
            why = str(j.get("error") or j.get("skip_reason") or "").strip().splitlines()
            print(f"   {j['id']}: {j['status']}: {why[-1][:160] if why else ''}")
    shared = sorted({j["id"] for j in jobs if j.get("gpus_shared")})
    if shared:
        print(f"   gpus_shared: {len(shared)} job(s), e.g. {shared[0]}")
    coll = run / "collectives.csv"
    if coll.is_file():
        ops: dict[str, Counter] = {}
        with coll.open() as fh:
            for row in csv.DictReader(fh):
                if row.get("job_id", "").split("-")[0] in ("fsdp", "torch_fsdp", "zero1", "torch_zero1"):
                    ops.setdefault(row["job_id"], Counter())[row.get("op", "?")] += 1
        for jid, c in sorted(ops.items()):
            print(f"   {jid}: " + ", ".join(f"{op} {n}" for op, n in sorted(c.items())))
PY
