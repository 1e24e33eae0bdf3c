#!/usr/bin/env bash
# Regenerate the sample runs committed under profiles/ (CPU, gloo, 1-2 ranks; a few minutes).
# They give every dashboard view data on a fresh clone:
#   profiles/sample-train      every variant at world sizes 1 and 2, plus a short bucket sweep;
#                              Adam, so the Memory view shows what ZeRO-1 and FSDP save; an fp16
#                              comm-hook job beside each 2-rank torch_ddp job (Compression); the
#                              what-if calibration of every 2-rank bucketed/torch_ddp job (What-if);
#                              live.csv, every rank's step rows as they came (Live)
#   profiles/sample-allreduce  the all-reduce bandwidth benchmark at 2 ranks
#   profiles/sample-hang       one 2-rank job whose rank 1 stops at a step: the flight recorders
#                              and stacks under hang/ (Hang)
# OUT=folder writes them elsewhere (e.g. to compare before replacing the committed ones).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-profiles}"
mkdir -p "$OUT"
rm -rf "$OUT/sample-train" "$OUT/sample-allreduce" "$OUT/sample-hang"
# The bucket sweep must show the trade: the mlp at width 256 has 3.77 MiB of gradients (15 layers
# of 257 KiB + a 10 KiB head), so --bucket-mb 0.25, 1, 2 and the default 25 make 30, 5, 3 and 1
# bucket(s) for `bucketed` and 15, 4, 2, 1 for torch_ddp (dpcore/contract/buckets.py); 4 MB and up
# would all be one bucket, which is why the old sweep 1,4 (+25) showed no trade.
# One traced step per job keeps the traces (the bulk of the samples) small enough for the repository.
python -m dpcore profile --run-id sample-train --model mlp --width 256 --variants all --optimizer adam \
  --world-sizes 1,2 --steps 10 --warmup 3 --profile-steps 1 --bucket-mb 25 --bucket-sweep 0.25,1,2 \
  --comm-hook none,fp16 --calibration-steps 2 --progress none --out "$OUT"
python -m dpcore allreduce --run-id sample-allreduce --algos native,ring,naive,central \
  --world-sizes 2 --sizes 1KB,16KB,256KB,1MB,4MB,16MB --progress none --out "$OUT"
# The hang: rank 1 sleeps at the first all-reduce of timed step 2, so rank 0 waits in it; the job
# is declared hung after 5 s without a step and fails. profile exits 1 on a failed job, hence || true.
python -m dpcore profile --run-id sample-hang --model mlp --width 64 --variants flat --world-sizes 2 \
  --steps 4 --warmup 1 --no-trace --calibration-steps 0 --inject-hang 1:2:sleep --hang-timeout 5 \
  --timeout 60 --progress none --out "$OUT" || true
du -sh "$OUT/sample-train" "$OUT/sample-allreduce" "$OUT/sample-hang"
