"""The acceptance test of dpcore on a lent GPU: one call, about 8 minutes on one H200.

    python3 scripts/gpu_check.py                 # from the repository root (gpu_check.sh does it)
    python3 scripts/gpu_check.py --device cpu    # the same checks on CPU/gloo (a dry run)
    python3 scripts/gpu_check.py --only gloo-collectives,fsdp-allgather-bytes

Exit 0 when every check passed, else 1 with one ``FAIL: <check>: <why>`` line per failed
check (a check not run because the time budget was spent fails too, saying so); each check's
line is printed, and the files below rewritten, as it finishes. What each
check asserts (with ``--device cpu`` the GPU is the CPU and NCCL is gloo):

- ``host``: a CUDA GPU is present, NCCL is available, the GPU computes bf16 in hardware and
  ``--dtype auto`` resolves to bf16 on it.
- ``gloo-collectives``: two ranks sharing the GPU over gloo run every collective the capability
  table (``dpcore.contract.config.GLOO_CUDA_MISSING``) says gloo does on CUDA tensors, with the
  right values, in float32 and bfloat16.
- ``gloo-send-recv``: send/recv of a CUDA tensor over gloo, in its own processes: the table
  says gloo lacks it, so it must fail (error, crash or wrong values); it working means the table
  refuses variants for nothing.
- ``profile-nccl-{bf16,fp32}``: every variant at world size 1 on NCCL completes (data_parallel
  may skip: it needs 2 GPUs).
- ``profile-gloo-shared``: every variant at world sizes 2 and 4, ranks sharing the GPU over gloo,
  bf16: all complete, FSDPs included, except those the table refuses (send/recv) and
  data_parallel.
- ``fsdp-allgather-bytes``: fsdp and torch_fsdp at world size 2 (gloo on the GPU) all-gather
  exactly half the bytes per step in bf16 that they do in fp32 (collectives.csv).
- ``calibration-clock``: torch_ddp and bucketed at world size 2 (gloo on the GPU) with 2
  calibration steps: in run.json's ``whatif_calibration`` every all-reduce ends and is launched
  after backward began and before its own end (launches, ends and backward's edges on one
  scale: the stream's, through CUDA events).
- ``verify-bf16``: ``verify --device cuda --dtype bf16`` exits 0 (every variant matches).
- ``powersgd``: torch_ddp with the PowerSGD hook completes on CUDA (2 ranks sharing the GPU
  over gloo: a hook needs 2+ ranks, NCCL one GPU each) and on the CPU of this GPU host (gloo).
- ``record-torchrun``: ``examples/record_ddp.py`` under torchrun, one rank on NCCL: a complete
  run whose environment says device cuda.
- ``trace-handler``: ``dpcore.trace_handler`` in a bf16 CUDA loop writes a run on device cuda.
- ``torchrun-profile``: ``profile`` under torchrun, one rank on NCCL, completes.
- ``backward-end``: one rank of DDP whose comm hook's future completes 1 s late (DDP waits
  for it inside ``backward()``): backward's phase, marked by ``BackwardEnd`` on the recorder's
  clock (CUDA events), leaves the wait out (under 1 s) and grad sync holds it (0.75 s or more).

Every dpcore command runs in a child process that cannot import streamlit or plotly (they are
set to None in ``sys.modules``), so a command path that imports them fails here, on the CPU
too. At most five files are written under ``--out`` (default ``$OUT``): ``gpu_check.txt`` (what
was printed), ``checks.json``, ``logs.tar.gz`` (each command's output), ``runs.tar.gz``
(run.json, steps.csv and collectives.csv of every run; no traces) and ``measured.jsonl``: one
JSON line per probe outcome (each collective of the gloo probes, as each rank learns it) and per
check verdict, appended and flushed as each is known, so a crash (of a probe's rank, or of the
whole call when its time is up) loses nothing measured before it.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcore.contract.config import GLOO_CUDA_MISSING, SINGLE_PROCESS, VARIANTS, gloo_cuda_refusal  # noqa: E402

#: the child that runs a dpcore command without streamlit and plotly
#: (under ``__main__`` only: the ranks a command spawns import this file again as __mp_main__)
GUARD = textwrap.dedent("""\
    import sys
    if __name__ == "__main__":
        sys.modules.update({"streamlit": None, "plotly": None})
        sys.argv[0] = "dpcore"
        from dpcore.cli import run_cli
        raise SystemExit(run_cli())
""")

#: a small, quick training job (the checks are about what runs, not how fast)
SMALL = ["--model", "mlp", "--width", "256", "--batch-size", "16", "--steps", "3", "--warmup", "1",
         "--calibration-steps", "0", "--progress", "none", "--no-trace"]

#: collectives gloo is asked to run on the GPU's tensors, and what each must produce
COLLECTIVES = ("broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
               "reduce_scatter_tensor", "gather", "scatter", "all_to_all_single", "barrier")


@dataclass
class Env:
    """Where the checks run: ``device`` cuda (a GPU; NCCL for one rank) or cpu (dry: gloo)."""

    device: str
    work: Path
    deadline: float
    logs: dict[str, str] = field(default_factory=dict)
    runs: list[Path] = field(default_factory=list)
    #: what the checks measured, printed after the verdicts
    notes: list[str] = field(default_factory=list)
    #: ``measured.jsonl`` under --out: every probe outcome and check verdict, appended as known
    measured: Path | None = None

    def __post_init__(self) -> None:
        (self.work / "dpcore_guarded.py").write_text(GUARD)

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def one_rank_backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, cmd: list[str], timeout: float) -> tuple[int, str]:
        """Run ``cmd`` (its output logged under ``name``); rc 124 when it ran past ``timeout``
        or the budget. A command that runs past it is ended with everything it started
        (:func:`run_bounded`): ranks left behind would hold the GPU through the next checks."""
        limit = max(1.0, min(timeout, self.left()))
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "PYTHONUNBUFFERED": "1"}
        rc, out = run_bounded(cmd, limit, env)
        self.logs[name] = f"$ {' '.join(cmd)}\n[rc {rc}]\n{out}"
        return rc, out

    def dpcore(self, name: str, args: list[str], timeout: float) -> tuple[int, str]:
        return self.run(name, [sys.executable, str(self.work / "dpcore_guarded.py"), *args], timeout)


#: after a command's time is up: seconds between SIGTERM and SIGKILL of its session, and the most
#: spent reading what is left of its output after the SIGKILL
TERM_GRACE_S = 5.0


def _text(raw: Any) -> str:
    return raw if isinstance(raw, str) else (raw or b"").decode(errors="replace")


def run_bounded(cmd: list[str], limit: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``cmd`` in a session of its own, output and errors together; (rc, output), rc 124
    when it ran past ``limit`` s. Then its whole session gets SIGTERM (torchrun passes it on to
    its workers, which it starts in sessions of their own), TERM_GRACE_S later SIGKILL: the
    ranks a ``profile`` or a probe spawned end with it instead of running on, orphaned, on the
    GPU and the CPUs the next checks need (``subprocess.run`` kills the direct child only)."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, errors="replace", start_new_session=True)
    try:
        out, _ = p.communicate(timeout=limit)
        return p.returncode, out
    except subprocess.TimeoutExpired as exc:
        out = _text(exc.output)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:  # the session is gone already
            pass
        try:
            out = p.communicate(timeout=TERM_GRACE_S)[0]
            break
        except subprocess.TimeoutExpired as exc:  # output read so far is kept
            out = _text(exc.output) or out
    else:  # a process outside the session still holds the output open: stop reading it
        if p.stdout:
            p.stdout.close()
        try:
            p.wait(TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    return 124, f"{out}\n[gpu_check: killed after {limit:.0f} s]"


# -- what a run must hold (pure: tested on CPU with synthetic runs) -------------------------------

def allowed_skip(variant: str, world_size: int, backend: str, device: str, gpus: int) -> bool:
    """May this job be skipped here? data_parallel without 2 GPUs; what gloo lacks on CUDA."""
    if variant == "data_parallel" and gpus < 2:
        return True
    return world_size > 1 and gloo_cuda_refusal(variant, backend, device) is not None


def run_failures(run: Path, variants: list[str], world_sizes: list[int], gpus: int,
                 dtype: str | None = None) -> list[str]:
    """What is wrong with profile run ``run``: not complete, the wrong dtype, a job missing,
    failed, or skipped where it should run (:func:`allowed_skip`). A multi-process variant
    needs a job at each of ``world_sizes``; a one-process variant one job at any."""
    meta_path = run / "run.json"
    if not meta_path.is_file():
        return [f"no run.json in {run}"]
    meta = json.loads(meta_path.read_text())
    env, jobs = meta.get("environment", {}), meta.get("jobs", [])
    bad: list[str] = []
    if meta.get("status") != "complete":
        bad.append(f"run status {meta.get('status')!r}")
    if dtype and meta.get("config", {}).get("dtype") != dtype:
        bad.append(f"dtype {meta.get('config', {}).get('dtype')!r}, not {dtype}")
    backend, device = env.get("backend", "?"), env.get("device", "?")
    for v in variants:
        for ws in world_sizes:
            mine = [j for j in jobs if j.get("variant") == v and j.get("world_size") == ws]
            if v in SINGLE_PROCESS:  # profile plans these once: single at 1, the others at the largest
                if ws != world_sizes[-1]:
                    continue
                mine = [j for j in jobs if j.get("variant") == v]
            if not mine:
                bad.append(f"no {v} job at world size {ws}" if v not in SINGLE_PROCESS else f"no {v} job")
            for j in mine:
                status = j.get("status")
                if status == "complete":
                    continue
                why = str(j.get("skip_reason") or j.get("error") or "").strip().splitlines()
                if status == "skipped" and allowed_skip(v, ws, backend, device, gpus):
                    continue
                bad.append(f"{j.get('id')} {status}: {why[-1][:160] if why else 'no reason given'}")
    return bad


def allgather_bytes_per_step(collectives_csv: Path) -> dict[str, float]:
    """job id -> all-gathered bytes per step of rank 0 (mean over the steps that have any)."""
    per: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    with collectives_csv.open() as fh:
        for row in csv.DictReader(fh):
            if row.get("op") == "all_gather" and row.get("rank") == "0":
                per[row["job_id"]][int(row["step"])] += int(row["bytes"])
    return {job: sum(steps.values()) / len(steps) for job, steps in per.items() if steps}


def half_bytes_failures(fp32: dict[str, float], bf16: dict[str, float], jobs: list[str]) -> list[str]:
    """Each of ``jobs`` must all-gather exactly half the bytes in bf16 that it does in fp32."""
    bad = []
    for job in jobs:
        a, b = fp32.get(job), bf16.get(job)
        if not a or not b:
            bad.append(f"{job}: no all-gathers (fp32 {a}, bf16 {b})")
        elif abs(b * 2 - a) > 1e-9 * a:
            bad.append(f"{job}: bf16 all-gathers {b / 2**20:.2f} MiB per step, fp32 {a / 2**20:.2f} MiB "
                       f"(ratio {b / a:.3f}, want 0.5)")
    return bad


#: how far apart two edges of one calibration step may be placed (ms): its phase marks and its
#: collectives are put on the host clock through two anchors, each known to within half the two
#: host reads around it (microseconds on an idle GPU)
CAL_TOL_MS = 1.0


def calibration_failures(run: Path, variants: list[str], tol_ms: float = CAL_TOL_MS) -> list[str]:
    """The what-if calibration of each job of ``variants`` in ``run`` is on one time scale:
    every all-reduce ends, and is launched no earlier than backward began (it is launched from
    backward's hook) and no later than its own end. On a GPU job backward's edges and the ends
    are the stream's times; a launch on the host's would read before backward began wherever
    the host ran ahead of the GPU. One line per job, with the first offending all-reduce."""
    meta_path = run / "run.json"
    if not meta_path.is_file():
        return [f"no run.json in {run}"]
    jobs = json.loads(meta_path.read_text()).get("jobs", [])
    bad: list[str] = []
    for v in variants:
        mine = [j for j in jobs if j.get("variant") == v and j.get("status") == "complete"]
        if not mine:
            bad.append(f"no complete {v} job")
        for j in mine:
            cal = j.get("whatif_calibration")
            if not isinstance(cal, dict) or not cal.get("data"):
                err = cal.get("error") if isinstance(cal, dict) else None
                bad.append(f"{j.get('id')}: no calibration" + (f" ({err})" if err else ""))
                continue
            wrong, n = [], 0
            for plan in cal["data"]:
                for st in plan.get("steps", []):
                    b0, b1 = st.get("bwd_start_ms"), st.get("bwd_end_ms")
                    for i, (s, e) in enumerate(zip(st.get("launch_ms", []), st.get("end_ms", []))):
                        n += 1
                        if e is None or s is None:
                            wrong.append(f"rank {st.get('rank')} step {st.get('step')} all-reduce {i}: no end")
                        elif s < b0 - tol_ms or s > e + tol_ms:
                            wrong.append(f"rank {st.get('rank')} step {st.get('step')} all-reduce {i}: launched "
                                         f"{s - b0:+.3f} ms after backward began, ended {e - s:+.3f} ms after "
                                         f"the launch (backward {b1 - b0:.3f} ms)")
            if not n:
                bad.append(f"{j.get('id')}: no all-reduce in its calibration")
            elif wrong:
                bad.append(f"{j.get('id')}: {len(wrong)} of {n} calibration all-reduces off the scale of "
                           f"backward's edges, e.g. {wrong[0]}")
    return bad


def run_env(run: Path) -> dict[str, Any]:
    """run.json's status and environment of the run in ``run`` ({} when there is none)."""
    p = run / "run.json"
    if not p.is_file():
        return {}
    meta = json.loads(p.read_text())
    return {"status": meta.get("status"), **meta.get("environment", {})}


def find_runs(out: Path) -> list[Path]:
    return sorted(p.parent for p in out.glob("*/run.json"))


# -- the probes, run as their own processes ------------------------------------------------------

def merge_ranks(per_rank: dict[int, dict[str, str]], world: int = 0,
                keys: list[str] | None = None) -> dict[str, str]:
    """One outcome per collective from every rank's: 'ok' only where each rank got the known
    answer, else the first rank's that did not, naming it (a receiving rank's wrong values are
    the collective's: a send that returned proves nothing about what arrived). A rank (of
    ``world``, else of those up to the highest seen) without an outcome for a collective (of
    ``keys``, else of those seen) makes it 'rank r: no result': it crashed or hung before."""
    out: dict[str, str] = {k: "ok" for k in keys or []}
    for rank in sorted(per_rank):
        for key, outcome in per_rank[rank].items():
            if out.get(key, "ok") == "ok":
                out[key] = outcome if outcome == "ok" else f"rank {rank}: {outcome}"
    ranks = range(max(world, max(per_rank, default=-1) + 1))
    for key, outcome in out.items():
        lacking = [r for r in ranks if key not in per_rank.get(r, {})]
        if outcome == "ok" and lacking:
            out[key] = f"rank {lacking[0]}: no result"
    return out


#: the file under --out that every probe outcome and check verdict is appended to as it is known
MEASURED = "measured.jsonl"

#: fault injection for the tests: ``<rank>:<key>`` makes that rank abort as it reaches that
#: collective (a crash, as gloo's SIGABRT), to show that what was measured before it is kept
CRASH_ENV = "DPCORE_GPU_CHECK_CRASH"


def probe_keys(what: str) -> list[str]:
    """The collectives a probe runs, in order: ``<name>[<dtype>]``."""
    if what == "send_recv":
        return ["send_recv[float32]"]
    return [f"{name}[{dtype}]" for dtype in ("float32", "bfloat16") for name in COLLECTIVES]


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to ``path`` and flush it to the OS at once: a process that crashes
    (or is killed) after this call has lost nothing of it."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none when it is absent); a line cut off by a crash is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _probe_rank(rank: int, world: int, store: str, device: str, what: str, log: str) -> None:
    """One rank of a gloo group over ``device`` tensors: each collective of ``what`` once, its
    outcome ('ok', 'wrong values', or the error) appended to ``log`` as it is known (a JSON
    line: probe, rank, key, outcome), so a crash in a later collective loses none of them."""
    import datetime as dt

    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(0)  # every rank shares the one GPU, as profile's do
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=dt.timedelta(seconds=60))
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    crash = os.environ.get(CRASH_ENV, "")
    names = ("send_recv",) if what == "send_recv" else COLLECTIVES
    for dtype in ((torch.float32,) if what == "send_recv" else (torch.float32, torch.bfloat16)):
        for name in names:
            key = f"{name}[{str(dtype).removeprefix('torch.')}]"
            if crash == f"{rank}:{key}":
                os.abort()
            try:
                ok = _one_collective(name, rank, world, dev, dtype)
                if device == "cuda":  # an asynchronous CUDA error is this collective's
                    torch.cuda.synchronize()
                outcome = "ok" if ok else "wrong values"
            except Exception as exc:  # noqa: BLE001 - the outcome is what is reported
                outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            append_line(Path(log), {"probe": what, "rank": rank, "key": key, "outcome": outcome})
    dist.destroy_process_group()


def _one_collective(name: str, rank: int, world: int, dev: Any, dtype: Any) -> bool:
    """Run collective ``name`` once; True when every rank's result is the known answer."""
    import torch
    import torch.distributed as dist

    def full(value: float, n: int = 4) -> torch.Tensor:
        return torch.full((n,), float(value), device=dev, dtype=dtype)

    def same(t: torch.Tensor, want: torch.Tensor) -> bool:
        return bool(torch.equal(t.float().cpu(), want.float().cpu()))

    mine = full(rank + 1)
    total = world * (world + 1) / 2
    if name == "broadcast":
        t = mine.clone()
        dist.broadcast(t, src=0)
        return same(t, full(1))
    if name == "all_reduce":
        t = mine.clone()
        dist.all_reduce(t)
        return same(t, full(total))
    if name == "reduce":
        t = mine.clone()
        dist.reduce(t, dst=0)
        return rank != 0 or same(t, full(total))
    if name == "all_gather":
        outs = [full(0) for _ in range(world)]
        dist.all_gather(outs, mine)
        return all(same(o, full(r + 1)) for r, o in enumerate(outs))
    if name == "all_gather_into_tensor":
        o = full(0, 4 * world)
        dist.all_gather_into_tensor(o, mine)
        return same(o, torch.cat([full(r + 1) for r in range(world)]))
    if name == "reduce_scatter_tensor":
        o = full(0)
        dist.reduce_scatter_tensor(o, torch.cat([full(r + 1) for r in range(world)]))
        return same(o, full((rank + 1) * world))
    if name == "gather":
        into = [full(0) for _ in range(world)] if rank == 0 else None
        dist.gather(mine, gather_list=into, dst=0)
        return rank != 0 or all(same(o, full(r + 1)) for r, o in enumerate(into or []))
    if name == "scatter":
        o = full(0)
        dist.scatter(o, scatter_list=[full(r + 1) for r in range(world)] if rank == 0 else None, src=0)
        return same(o, full(rank + 1))
    if name == "all_to_all_single":
        o = full(0, world)
        dist.all_to_all_single(o, torch.arange(world, device=dev, dtype=dtype) + 10 * rank)
        return same(o, torch.tensor([10.0 * r + rank for r in range(world)]))
    if name == "barrier":
        dist.barrier()
        return True
    if name == "send_recv":
        if rank == 0:
            dist.send(full(7), dst=1)
            return True
        t = full(0)
        dist.recv(t, src=0)
        return same(t, full(7))
    raise ValueError(name)


def probe_outcomes(log: Path, what: str) -> dict[str, str]:
    """The merged outcomes of probe ``what`` from the lines its ranks appended to ``log``."""
    per_rank: dict[int, dict[str, str]] = {}
    for line in read_lines(log):
        if line.get("probe") == what:
            per_rank.setdefault(int(line["rank"]), {})[str(line["key"])] = str(line["outcome"])
    return merge_ranks(per_rank, world=2, keys=probe_keys(what)) if per_rank else {}


def probe_main(device: str, what: str, result_file: str, log: str | None = None) -> int:
    """``--probe``: spawn two ranks that share the GPU over gloo; each appends every outcome to
    ``log`` as it is known (:func:`_probe_rank`; default: a file beside ``result_file``).
    ``result_file`` gets them merged (:func:`merge_ranks`) also when a rank crashed: the
    collectives measured before the crash keep their outcomes, the rest read 'no result'.
    Exit 1 when a rank crashed."""
    import torch.multiprocessing as mp

    log_path = Path(log) if log else Path(f"{result_file}.jsonl")
    crashed = ""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(_probe_rank, args=(2, str(Path(tmp) / "store"), device, what, str(log_path)), nprocs=2)
        except Exception as exc:  # noqa: BLE001 - a crashed rank is an outcome, said below
            crashed = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    merged = probe_outcomes(log_path, what)
    if crashed:
        merged = {k: f"{v} ({crashed})" if v.endswith(": no result") else v for k, v in merged.items()}
    Path(result_file).write_text(json.dumps(merged, indent=1))
    return 1 if crashed else 0


# -- the checks ----------------------------------------------------------------------------------

def check_host(env: Env) -> list[str]:
    code = textwrap.dedent(f"""\
        import json, sys
        sys.modules.update({{"streamlit": None, "plotly": None}})
        import torch
        from dpcore.write.training.precision import gpu_computes_bf16, resolve_dtype
        cuda = torch.cuda.is_available()
        print(json.dumps({{"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(),
            "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "capability": list(torch.cuda.get_device_capability()) if cuda else None,
            "bf16_hw": gpu_computes_bf16(), "auto": resolve_dtype("auto", "{env.device}"),
            "nccl": torch.distributed.is_nccl_available()}}))
    """)
    rc, out = env.run("host", [sys.executable, "-c", code], 60)
    if rc != 0:
        return [f"rc {rc}: {_last_line(out)}"]
    info = json.loads(out.strip().splitlines()[-1])
    env.note(f"host: torch {info['torch']} cuda {info['cuda']} {info['gpus']} GPU(s) {info['names']} "
          f"capability {info['capability']} bf16 in hardware {info['bf16_hw']} auto={info['auto']} "
          f"nccl {info['nccl']}")
    if env.device != "cuda":
        return [] if info["auto"] == "fp32" else [f"--dtype auto on the CPU resolved to {info['auto']}"]
    bad = []
    if info["gpus"] < 1:
        bad.append("no CUDA GPU")
    if not info["nccl"]:
        bad.append("NCCL is not available")
    if info["capability"] and info["capability"][0] >= 8 and (not info["bf16_hw"] or info["auto"] != "bf16"):
        bad.append(f"a GPU of capability {info['capability']}: bf16 in hardware {info['bf16_hw']}, "
                   f"auto {info['auto']}")
    return bad


def _probe(env: Env, name: str, what: str, timeout: float) -> tuple[int, dict[str, str]]:
    """Run probe ``what``: its ranks append each outcome to ``measured.jsonl`` under --out as
    they go, so a probe cut short (a crashed rank, its time up) still gives what it measured."""
    result = env.work / f"{name}.json"
    log = env.measured or env.work / f"{name}.jsonl"
    rc, _ = env.run(name, [sys.executable, str(Path(__file__).resolve()), "--probe", what,
                           "--device", env.device, "--probe-out", str(result), "--probe-log", str(log)],
                    timeout)
    return rc, (json.loads(result.read_text()) if result.is_file() else probe_outcomes(log, what))


def check_gloo_collectives(env: Env) -> list[str]:
    rc, got = _probe(env, "gloo-collectives", "collectives", 120)
    if not got:
        return [f"the probe wrote nothing (rc {rc}): {_last_line(env.logs['gloo-collectives'])}"]
    env.note("gloo collectives on " + env.device + ": " + ", ".join(f"{k} {v}" for k, v in got.items()))
    return [f"{k}: {v}" for k, v in got.items() if v != "ok"]


def check_gloo_send_recv(env: Env) -> list[str]:
    rc, got = _probe(env, "gloo-send-recv", "send_recv", 60)
    outcome = got.get("send_recv[float32]", f"no result (rc {rc}: the ranks crashed or hung)")
    env.note(f"gloo send/recv on {env.device}: {outcome}")
    if env.device != "cuda":
        return [] if outcome == "ok" else [f"send/recv on CPU tensors: {outcome}"]
    if outcome == "ok":
        refused = ", ".join(v for v, why in GLOO_CUDA_MISSING.items() if "send/recv" in why)
        return [f"send/recv works on CUDA tensors over gloo, yet the table refuses {refused} for it"]
    return []


def _profile(env: Env, name: str, args: list[str], timeout: float) -> tuple[int, Path]:
    out = env.work / "runs"
    rc, _ = env.dpcore(name, ["profile", *args, *SMALL, "--out", str(out), "--run-id", name], timeout)
    env.runs.append(out / name)
    return rc, out / name


def _gpus(env: Env) -> int:
    return 1 if env.device == "cuda" else 0


def _profile_check(env: Env, name: str, backend: str, dtype: str, world_sizes: list[int],
                   timeout: float) -> list[str]:
    rc, run = _profile(env, name, ["--device", env.device, "--backend", backend, "--dtype", dtype,
                                   "--variants", "all", "--world-sizes", ",".join(map(str, world_sizes))],
                       timeout)
    bad = run_failures(run, list(VARIANTS), world_sizes, _gpus(env), dtype)
    if rc != 0:
        bad.insert(0, f"rc {rc}: {_last_line(env.logs[name])}")
    return bad


def check_profile_nccl_bf16(env: Env) -> list[str]:
    return _profile_check(env, "profile-nccl-bf16", env.one_rank_backend, "bf16", [1], 150)


def check_profile_nccl_fp32(env: Env) -> list[str]:
    return _profile_check(env, "profile-nccl-fp32", env.one_rank_backend, "fp32", [1], 150)


def check_profile_gloo_shared(env: Env) -> list[str]:
    return _profile_check(env, "profile-gloo-shared", "gloo", "bf16", [2, 4], 300)


def check_fsdp_allgather_bytes(env: Env) -> list[str]:
    got: dict[str, dict[str, float]] = {}
    bad: list[str] = []
    for dtype in ("fp32", "bf16"):
        name = f"fsdp-bytes-{dtype}"
        rc, run = _profile(env, name, ["--device", env.device, "--backend", "gloo", "--dtype", dtype,
                                       "--variants", "fsdp,torch_fsdp", "--world-sizes", "2"], 150)
        bad += [f"{dtype}: {b}" for b in run_failures(run, ["fsdp", "torch_fsdp"], [2], _gpus(env), dtype)]
        coll = run / "collectives.csv"
        got[dtype] = allgather_bytes_per_step(coll) if coll.is_file() else {}
    env.note("all-gathered MiB per step (rank 0): " + ", ".join(
        f"{job} fp32 {got['fp32'].get(job, 0) / 2**20:.2f} bf16 {got['bf16'].get(job, 0) / 2**20:.2f}"
        for job in ("fsdp-ws2", "torch_fsdp-ws2")))
    return bad + half_bytes_failures(got["fp32"], got["bf16"], ["fsdp-ws2", "torch_fsdp-ws2"])


def check_calibration_clock(env: Env) -> list[str]:
    """torch_ddp and bucketed at world size 2 (ranks sharing the GPU over gloo) with their
    what-if calibration: its launches, ends and backward's edges on one scale (CUDA events)."""
    name, out = "calibration-clock", env.work / "runs"
    small = [*SMALL]
    small[small.index("--calibration-steps") + 1] = "2"
    variants = ["torch_ddp", "bucketed"]
    rc, _ = env.dpcore(name, ["profile", "--device", env.device, "--backend", "gloo", "--dtype", "fp32",
                              "--variants", ",".join(variants), "--world-sizes", "2", *small,
                              "--out", str(out), "--run-id", name], 150)
    run = out / name
    env.runs.append(run)
    bad = [f"rc {rc}: {_last_line(env.logs[name])}"] if rc != 0 else []
    return bad + run_failures(run, variants, [2], _gpus(env), "fp32") + calibration_failures(run, variants)


def check_verify_bf16(env: Env) -> list[str]:
    rc, out = env.dpcore("verify-bf16", ["verify", "--device", env.device, "--dtype", "bf16"], 150)
    bad = [line.strip()[:160] for line in out.splitlines() if "DIFFERS" in line]
    return ([f"rc {rc}: {_last_line(out)}"] if rc != 0 else []) + bad


def check_powersgd(env: Env) -> list[str]:
    bad = []
    # a comm hook needs 2+ ranks: on one GPU they share it over gloo (NCCL refuses that)
    for name, device, backend, ws in (("powersgd-gpu", env.device, "gloo", 2),
                                      ("powersgd-cpu", "cpu", "gloo", 2)):
        rc, run = _profile(env, name, ["--device", device, "--backend", backend, "--dtype", "fp32",
                                       "--variants", "torch_ddp", "--comm-hook", "powersgd",
                                       "--world-sizes", str(ws)], 120)
        bad += [f"{name}: {b}" for b in run_failures(run, ["torch_ddp"], [ws], _gpus(env))]
        if rc != 0:
            bad.insert(0, f"{name}: rc {rc}: {_last_line(env.logs[name])}")
    return bad


def _torchrun(env: Env, name: str, args: list[str], timeout: float) -> tuple[int, str]:
    return env.run(name, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "1", *args], timeout)


def _env_failures(run: Path, device: str, backend: str | None = None) -> list[str]:
    got = run_env(run)
    if not got:
        return [f"no run.json under {run}"]
    bad = []
    if got.get("status") != "complete":
        bad.append(f"run status {got.get('status')!r}")
    if got.get("device") != device:
        bad.append(f"run.json's environment says device {got.get('device')!r}, not {device}")
    if backend and got.get("backend") != backend:
        bad.append(f"run.json's environment says backend {got.get('backend')!r}, not {backend}")
    return bad


def check_record_torchrun(env: Env) -> list[str]:
    out, script = env.work / "record", env.work / "record_ddp_guarded.py"
    _write_guarded(script, ROOT / "examples" / "record_ddp.py")
    rc, log = _torchrun(env, "record-torchrun", [str(script), "--steps", "8", "--width", "256",
                                                 "--batch", "16", "--out", str(out), "--name", "rec"], 120)
    runs = find_runs(out)
    env.runs += runs
    bad = [f"rc {rc}: {_last_line(log)}"] if rc != 0 else []
    return bad + (_env_failures(runs[-1], env.device, env.one_rank_backend) if runs
                  else [f"no run written under {out}"])


def _write_guarded(path: Path, script: Path) -> None:
    """Write ``path``: ``script`` run as __main__ in a process without streamlit and plotly."""
    path.write_text(textwrap.dedent(f"""\
        import runpy
        import sys
        if __name__ == "__main__":
            sys.modules.update({{"streamlit": None, "plotly": None}})
            sys.argv[0] = {str(script)!r}
            runpy.run_path({str(script)!r}, run_name="__main__")
    """))


TRACE_LOOP = textwrap.dedent("""\
    import sys
    sys.modules.update({"streamlit": None, "plotly": None})
    import torch
    import dpcore

    device, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    handler = dpcore.trace_handler(out, name="th")
    with torch.profiler.profile(activities=acts, on_trace_ready=handler,
                                schedule=handler.schedule(wait=1, warmup=1, active=2, repeat=1)) as prof:
        for _ in range(6):
            x = torch.randn(32, 256, device=device)
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = net(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    print("run", handler.run_dir)
""")


def check_trace_handler(env: Env) -> list[str]:
    script, out = env.work / "trace_loop.py", env.work / "th"
    script.write_text(TRACE_LOOP)
    rc, log = env.run("trace-handler", [sys.executable, str(script), env.device, str(out)], 120)
    runs = find_runs(out)
    env.runs += runs
    bad = [f"rc {rc}: {_last_line(log)}"] if rc != 0 else []
    return bad + (_env_failures(runs[-1], env.device) if runs else [f"no run written under {out}"])


def check_torchrun_profile(env: Env) -> list[str]:
    out = env.work / "runs"
    name = "torchrun-profile"
    rc, log = _torchrun(env, name, [str(env.work / "dpcore_guarded.py"), "profile", "--device", env.device,
                                    "--backend", env.one_rank_backend, "--dtype", "bf16",
                                    "--variants", "torch_ddp,fsdp,torch_fsdp", *SMALL,
                                    "--out", str(out), "--run-id", name], 150)
    env.runs.append(out / name)
    bad = run_failures(out / name, ["torch_ddp", "fsdp", "torch_fsdp"], [1], _gpus(env), "bf16")
    return ([f"rc {rc}: {_last_line(log)}"] if rc != 0 else []) + bad + _env_failures(
        out / name, env.device, env.one_rank_backend)


#: the wait a ``backward-end`` comm hook puts inside backward(), seconds
BWD_WAIT_S = 1.0


def check_backward_end(env: Env) -> list[str]:
    """One rank of DDP (NCCL on the GPU, gloo on the CPU) whose comm hook's future completes
    BWD_WAIT_S after the call, so DDP's final callback waits that long inside ``backward()``:
    with the phase timer on the recorder's clock and backward's end marked by ``BackwardEnd``
    (an event in a final callback queued ahead of DDP's on CUDA), every step's bwd phase must
    leave the wait out and sync must hold it."""
    store = env.work / "backward-end.store"
    code = textwrap.dedent(f"""\
        import json, sys, threading, time
        sys.modules.update({{"streamlit": None, "plotly": None}})
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from dpcore.write.capture.backward_end import BackwardEnd
        from dpcore.write.capture.comm_log import Recorder
        cuda = {env.device == "cuda"!r}
        dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if cuda else "gloo", init_method="file://{store}", rank=0, world_size=1)
        net = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512)).to(dev)
        ddp = DistributedDataParallel(net, device_ids=[0] if cuda else None)

        def hook(state, bucket):
            fut = torch.futures.Future(devices=[dev]) if cuda else torch.futures.Future()
            buf = bucket.buffer()
            def later():
                time.sleep({BWD_WAIT_S})
                fut.set_result(buf)
            threading.Thread(target=later).start()
            return fut

        ddp.register_comm_hook(None, hook)
        rec = Recorder("backward-end", 0)
        rec.time_on(dev)
        timer = rec.phase_timer()
        end = BackwardEnd(rec.clock)
        end.attach(net.parameters())
        out = {{"same_clock": timer.clock is rec.clock, "steps": []}}
        for step in range(3):
            loss = ddp(torch.randn(64, 512, device=dev)).square().mean()
            timer.start()
            t0 = time.perf_counter_ns()
            loss.backward()
            timer.mark("bwd", at=end.take(t0))
            timer.mark("sync")
            t = timer.finish()
            out["steps"].append([round(t["bwd_ms"], 3), round(t["sync_ms"], 3)])
        print(json.dumps(out))
        dist.destroy_process_group()
    """)
    rc, log = env.run("backward-end", [sys.executable, "-c", code], 90)
    if rc != 0:
        return [f"rc {rc}: {_last_line(log)}"]
    got = json.loads(log.strip().splitlines()[-1])
    steps = got["steps"][1:]  # the first step builds DDP's buckets
    env.note(f"backward-end on {env.device}: [bwd_ms, sync_ms] per step {steps} (wait {BWD_WAIT_S * 1e3:.0f} ms)")
    wait_ms = BWD_WAIT_S * 1e3
    bad = [] if got["same_clock"] else ["the phase timer is not on the recorder's clock"]
    bad += [f"step {i + 1}: bwd {b} ms holds DDP's wait ({wait_ms:.0f} ms) or sync {s} ms lacks it"
            for i, (b, s) in enumerate(steps) if not (s >= 0.75 * wait_ms and b < wait_ms)]
    return bad


#: name -> check, longest first (they run three at a time)
CHECKS: dict[str, Callable[[Env], list[str]]] = {
    "profile-gloo-shared": check_profile_gloo_shared,
    "profile-nccl-bf16": check_profile_nccl_bf16,
    "profile-nccl-fp32": check_profile_nccl_fp32,
    "verify-bf16": check_verify_bf16,
    "fsdp-allgather-bytes": check_fsdp_allgather_bytes,
    "calibration-clock": check_calibration_clock,
    "powersgd": check_powersgd,
    "torchrun-profile": check_torchrun_profile,
    "record-torchrun": check_record_torchrun,
    "trace-handler": check_trace_handler,
    "gloo-collectives": check_gloo_collectives,
    "gloo-send-recv": check_gloo_send_recv,
    "backward-end": check_backward_end,
    "host": check_host,
}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _write_outputs(out: Path, env: Env, results: dict[str, list[str]], printed: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.txt").write_text(printed)
    (out / "checks.json").write_text(json.dumps({"device": env.device, "failures": results}, indent=1))
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for name, text in sorted(dict(env.logs).items()):  # copies: checks still running add to them
            data = text.encode()
            info = tarfile.TarInfo(f"logs/{name}.log")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        for run in list(env.runs):
            for fname in ("run.json", "steps.csv", "collectives.csv"):
                if (run / fname).is_file():
                    tar.add(run / fname, arcname=f"runs/{run.name}/{fname}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (the acceptance test) or cpu (a dry run of the same checks on gloo)")
    ap.add_argument("--only", default="", help=f"comma-separated checks to run, of: {', '.join(CHECKS)}")
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/dpcore-gpu-check")
    ap.add_argument("--budget-s", type=float, default=480.0, help="seconds for every check together")
    ap.add_argument("--workers", type=int, default=3, help="checks run at once")
    ap.add_argument("--probe", choices=("collectives", "send_recv"), help=argparse.SUPPRESS)
    ap.add_argument("--probe-out", help=argparse.SUPPRESS)
    ap.add_argument("--probe-log", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        return probe_main(args.device, args.probe, args.probe_out, args.probe_log)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print(f"gpu_check: unknown check {', '.join(unknown)}; valid: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    measured = out / MEASURED
    try:  # a folder that cannot be written is said before eight minutes of checks, not after
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.txt").write_text("gpu_check: running\n")
        measured.write_text("")  # this call's lines only
    except OSError as exc:
        print(f"gpu_check: cannot write the results under --out {out}: {exc.strerror or exc}; "
              "give a writable folder (--out or OUT)", file=sys.stderr)
        return 2
    start = time.monotonic()
    printed: list[str] = []
    results: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="dpcore-gpu-check-") as tmp:
        env = Env(args.device, Path(tmp), start + args.budget_s, measured=measured)

        def one(name: str) -> tuple[str, list[str], float]:
            t0 = time.monotonic()
            if env.left() < 15:
                return name, [f"not run: the {args.budget_s:.0f} s budget was spent"], 0.0
            try:
                bad = CHECKS[name](env)
            except Exception as exc:  # noqa: BLE001 - a check that breaks fails, with why
                bad = [f"the check itself raised {type(exc).__name__}: {exc}"]
            return name, bad, time.monotonic() - t0

        # each check is printed and the files rewritten as it finishes: a run cut short by the
        # caller's own time limit still leaves what was done
        with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
            for fut in as_completed([pool.submit(one, n) for n in names]):
                name, bad, took = fut.result()
                results[name] = bad
                append_line(measured, {"check": name, "ok": not bad, "failures": bad, "seconds": round(took, 1)})
                line = f"{name:22s} {'ok' if not bad else 'FAILED':7s} {took:5.0f} s"
                print(line, flush=True)
                printed.append(line)
                _write_outputs(out, env, results, "\n".join(printed) + "\n")
        results = {n: results[n] for n in names}
        fails = [f"FAIL: {name}: {why}" for name, bad in results.items() for why in bad]
        tail = [*env.notes, f"gpu_check on {args.device}: {len(names) - len({n for n, b in results.items() if b})} of "
                f"{len(names)} checks passed in {time.monotonic() - start:.0f} s; files in {out}", *fails]
        print("\n".join(tail), flush=True)
        _write_outputs(out, env, results, "\n".join(printed + tail) + "\n")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
