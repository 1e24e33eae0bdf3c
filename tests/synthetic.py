"""Synthetic GPU-style torch.profiler traces (for tests and benchmarks/bench_trace_load.py).

Why: agreement with Holistic Trace Analysis and load speed must be checked without a GPU. The
traces have what HTA needs and what real NCCL traces contain: ProfilerStep#N ranges on the main
thread, cudaLaunchKernel runtime events correlated with kernels, compute kernels on one stream
and ``ncclDevKernel_*`` kernels on another, a memcpy, and ``distributedInfo``. The last
ProfilerStep is empty (HTA drops kernels of the last step), and times are whole µs
(HTA rounds ts/dur to integer µs when it parses).
"""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

COMPUTE_STREAM, COMM_STREAM = 7, 20


#: How the communication kernels are named: NCCL >= 2.19 (``ncclDevKernel_*``), older NCCL
#: (``ncclKernel_*``), or a future rename that no name rule knows (only the profiler's
#: ``record_param_comms`` range around the launch says it is a collective).
COMM_KERNEL_NAMES = {
    "ncclDevKernel": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclKernel": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
    "renamed": "xcclAllReduceKernel_f32_ring(xcclDevComm*, unsigned long)",
}


def gpu_trace(rank: int, world_size: int = 4, steps: int = 4, kernels_per_step: int = 50,
              seed: int = 0, comm_style: str = "ncclDevKernel") -> dict[str, Any]:
    """One rank's trace as a JSON-ready dict; ~3 events per kernel (4 for a collective, whose
    launch sits inside a ``record_param_comms`` range as in torch's traces)."""
    comm_name = COMM_KERNEL_NAMES[comm_style]
    rng = random.Random(seed * 1000 + rank)
    pid, tid = 1000 + rank, 1000 + rank
    ev: list[dict[str, Any]] = []
    t, corr = 1_000_000.0, 1
    for step in range(steps + 1):
        t_step = t
        n = kernels_per_step if step < steps else 0
        gpu_c = gpu_m = t + 5.0
        for k in range(n):
            comm = rng.random() < 0.2
            stream = COMM_STREAM if comm else COMPUTE_STREAM
            name = comm_name if comm \
                else rng.choice(["ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_kernel<4>",
                                 "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm>"])
            if k % 97 == 5:
                name, stream, comm = "Memcpy DtoD (Device -> Device)", COMPUTE_STREAM, False
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm" if not comm else "c10d::allreduce_",
                       "pid": pid, "tid": tid, "ts": t, "dur": 4.0, "args": {"External id": corr}})
            if comm:
                ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": pid, "tid": tid,
                           "ts": t + 0.5, "dur": 3.0, "args": {"Collective name": "allreduce", "dtype": "Float",
                                                                "In msg nelems": 1 << 20, "Group size": world_size,
                                                                "Process Group Name": "0"}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                       "ts": t + 1.0, "dur": 2.0, "args": {"correlation": corr, "External id": corr}})
            dur = float(round(rng.uniform(5.0, 60.0) * (3.0 if comm else 1.0)))  # whole µs: HTA rounds
            if comm:
                start = max(gpu_m, t + round(rng.uniform(3.0, 40.0)))
                gpu_m = start + dur
            else:
                start = max(gpu_c, t + 3.0) + round(rng.uniform(0.0, 8.0))
                gpu_c = start + dur
            cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
                       "args": {"device": 0, "stream": stream, "correlation": corr, "External id": corr}})
            corr += 1
            t += round(rng.uniform(5.0, 20.0))
        t_end = max(t, gpu_c, gpu_m) + 10.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": tid,
                   "ts": t_step, "dur": t_end - t_step, "args": {"External id": corr}})
        t = t_end + 5.0
    ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}})
    ev.sort(key=lambda e: e.get("ts", 0.0))
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
            "traceEvents": ev, "traceName": f"rank{rank}"}


def write_gpu_trace_dir(path: str | Path, world_size: int = 4, steps: int = 4, kernels_per_step: int = 50,
                        seed: int = 0, gz: bool = True, comm_style: str = "ncclDevKernel") -> list[Path]:
    """Write rank<r>.json[.gz] for every rank (torch's layout, one event per line) and return the paths."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for r in range(world_size):
        doc = gpu_trace(r, world_size, steps, kernels_per_step, seed, comm_style)
        events = doc.pop("traceEvents")
        head = json.dumps(doc)[:-1]
        body = ",\n".join(json.dumps(e) for e in events)
        text = f'{head}, "traceEvents": [\n{body}\n]}}'
        f = d / (f"rank{r}.json.gz" if gz else f"rank{r}.json")
        if gz:
            with gzip.open(f, "wt", compresslevel=1) as fh:
                fh.write(text)
        else:
            f.write_text(text)
        out.append(f)
    return out
