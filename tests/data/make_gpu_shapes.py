"""Write ``tests/data/gpu_ledger_rank0.json.gz``: a small GPU trace with every shape the GPU time
ledger (dpcore.read.analysis.gpu_time) must get right, with round numbers so the tests assert
hand-computed answers.

Run from the repository root: ``python tests/data/make_gpu_shapes.py`` (deterministic). Times
below are µs after ``BASE`` (the file's timestamps are BASE + t).

Host thread (pid 100, tid 100): ProfilerStep#1 [0,1000], ProfilerStep#2 [1000,2000];
``aten::linear`` [10,100] (``aten::mm`` [20,90] in it); ``Optimizer.step#SGD.step`` [500,700]
(``aten::add_`` [640,660] in it: not outermost); ``aten::item`` [1090,1300].

GPU events (device 0; stream 7 unless said; launch time in brackets):

* K0 compute [50,150] (launch -50: before the first step -> in no step, only in the trace window)
* step 1: K1 gemm [200,400] (20); K2 ``ncclDevKernel_AllReduce`` stream 20 [300,600] (30);
  M1 memcpy [600,650] (40); K3 compute [800,900] (750); S1 memset [900,920] (760)
* step 2: K4 [1050,1100] (1010); K5 [1400,1500] (1350) and K6 on stream 8 [1450,1550] (1360):
  two streams overlapping; K7 [1700,1800] (1600); K8 [1850,1900] (1610)

Answers (ms = µs / 1000):

* step 1: span 720 (200..920); union [200,650] + [800,920] = 570 -> idle 150, one gap [650,800]
  ended by K3 launched at 750 > 650 -> host, cause ``Optimizer.step#SGD.step`` (covers 650).
  compute K1 + K3 = 300; comm 300; exposed comm [400,600] = 200; memory 50 + 20 = 70;
  non-compute 720 - 150 - 300 = 270. Host-bound: 150 <= 360, no.
* step 2: span 850 (1050..1900); union 50 + 150 + 100 + 50 = 350 -> idle 500; gaps [1100,1400]
  host (1350 > 1100) ``aten::item`` 300, [1550,1700] host (1600 > 1550) ``python`` 150,
  [1800,1850] device (1610 < 1800) 50. compute 350, non-compute 0. Host-bound: 450 > 425, yes.
* trace: span 1850 (50..1900); union 100 + 450 + 120 + 50 + 150 + 100 + 50 = 1020 -> idle 830:
  [150,200] device 50 (K1 launched at 20), [650,800] host Optimizer 150, [920,1050] host
  ``python`` 130 (K4 launched at 1010; no op covers 920), [1100,1400] host aten::item 300,
  [1550,1700] host python 150, [1800,1850] device 50 -> host 730 (aten::item 300, python 280,
  Optimizer 150), device 100. compute 750, comm 300, exposed 200, memory 70, non-compute 270.
  idle 44.864865 %, compute 40.540541 %, non-compute 14.594595 %. Host-bound: 730 <= 925, no.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent
BASE = 1_000_000.0
HOST_PID, HOST_TID, DEVICE_PID = 100, 100, 0
Event = dict[str, Any]


def x(name: str, cat: str, ts: float, end: float, pid: Any = HOST_PID, tid: Any = HOST_TID, **args: Any) -> Event:
    """A complete event from ts to end (µs after BASE)."""
    e: Event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": BASE + ts, "dur": end - ts}
    if args:
        e["args"] = args
    return e


def gpu(name: str, ts: float, end: float, corr: int, launched: float, stream: int = 7,
        cat: str = "kernel") -> list[Event]:
    """A GPU event and its launch call (same correlation id) on the host thread."""
    call = {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync", "gpu_memset": "cudaMemsetAsync"}[cat]
    return [x(name, cat, ts, end, pid=DEVICE_PID, tid=f"stream {stream}", device=0, stream=stream, correlation=corr),
            x(call, "cuda_runtime", launched, launched + 4, correlation=corr)]


def ledger_trace() -> dict:
    """The trace of the module docstring."""
    ev: list[Event] = [
        x("ProfilerStep#1", "user_annotation", 0, 1000), x("ProfilerStep#2", "user_annotation", 1000, 2000),
        x("aten::linear", "cpu_op", 10, 100), x("aten::mm", "cpu_op", 20, 90),
        x("Optimizer.step#SGD.step", "user_annotation", 500, 700), x("aten::add_", "cpu_op", 640, 660),
        x("aten::item", "cpu_op", 1090, 1300),
        *gpu("void elementwise_kernel<float>(float*)", 50, 150, 1, -50),
        *gpu("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 200, 400, 2, 20),
        *gpu("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 300, 600, 3, 30,
             stream=20),
        *gpu("Memcpy HtoD (Pageable -> Device)", 600, 650, 4, 40, cat="gpu_memcpy"),
        *gpu("void vectorized_elementwise_kernel<4>(float*)", 800, 900, 5, 750),
        *gpu("Memset (Device)", 900, 920, 6, 760, cat="gpu_memset"),
        *gpu("void elementwise_kernel<float>(float*)", 1050, 1100, 7, 1010),
        *gpu("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1400, 1500, 8, 1350),
        *gpu("void reduce_kernel<512, 1>(float*)", 1450, 1550, 9, 1360, stream=8),
        *gpu("void elementwise_kernel<float>(float*)", 1700, 1800, 10, 1600),
        *gpu("void elementwise_kernel<float>(float*)", 1850, 1900, 11, 1610),
    ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}


SHAPES = {"gpu_ledger_rank0.json.gz": ledger_trace}


def main() -> None:
    for name, make in SHAPES.items():
        doc = make()
        doc["traceEvents"].sort(key=lambda e: e["ts"])
        (DATA / name).write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=9, mtime=0))
        print(f"{name}: {len(doc['traceEvents'])} events")


if __name__ == "__main__":
    main()
