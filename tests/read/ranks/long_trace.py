"""A made torch.profiler GPU trace of many steps (a long run traced whole), for the Timeline's
bound on work: the lanes of the steps drawn, never of every traced step.

Why made and not recorded: the defect shows at 30,000 steps (75 minutes of lane reduction at the
first read), and a recorded trace that long is tens of MB. Each step here is a few events of the
kinds a GPU rank's lanes are drawn from (its ``ProfilerStep#N`` range, a launching CPU op, the
launches, a compute kernel and an NCCL kernel on their streams), gzipped: ~2 MB for 30,000 steps.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

#: µs between step starts, and where each step's events sit in it.
PERIOD_US = 100.0


def step_events(step: int, pid: int = 4242, tid: int = 4242) -> list[dict]:
    """One step's events: the marker, an op that launches two kernels, and the kernels."""
    t = 1_000_000.0 + step * PERIOD_US
    c = 2 * step + 1
    return [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": tid,
         "ts": t, "dur": 90.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": tid, "ts": t + 2, "dur": 30.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": t + 5,
         "dur": 4.0, "args": {"correlation": c}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": t + 40,
         "dur": 4.0, "args": {"correlation": c + 1}},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": t + 10,
         "dur": 25.0, "args": {"device": 0, "stream": 7, "correlation": c}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 13,
         "ts": t + 45, "dur": 30.0, "args": {"device": 0, "stream": 13, "correlation": c + 1}},
    ]


def write_long_trace(path: Path, steps: int, rank: int = 0, world_size: int = 1) -> Path:
    """A gzipped rank trace of ``steps`` steps (numbered 0..steps-1) at ``path``."""
    events: list[dict] = []
    for s in range(steps):
        events += step_events(s)
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
           "traceEvents": events}
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", compresslevel=6) as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return path
