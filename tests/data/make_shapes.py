"""Write the small traces ``tests/data/shape_*.json.gz``: one per shape of real foreign traces
that dpcore once misread (issue 19), with round numbers so the tests can assert known answers.

Run from the repository root: ``python tests/data/make_shapes.py`` (deterministic: the same
bytes each time). The answers are worked out in each function's docstring and asserted in
``tests/test_trace_shapes.py``; the real traces these shapes come from are in
``../shared/traces/`` (named in each docstring).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent
HOST_PID, HOST_TID, GLOO_TID = 100, 100, 200
DEVICE_PID, COMPUTE_STREAM, COMM_STREAM = 0, 7, 20
Event = dict[str, Any]


def x(name: str, cat: str, ts: float, end: float, tid: Any = HOST_TID, pid: Any = HOST_PID, **args: Any) -> Event:
    """A complete event from ts to end (µs)."""
    e: Event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": end - ts}
    if args:
        e["args"] = args
    return e


def kernel(name: str, ts: float, end: float, corr: int, stream: int = COMPUTE_STREAM, cat: str = "kernel",
           **meta: Any) -> Event:
    return x(name, cat, ts, end, tid=f"stream {stream}", pid=DEVICE_PID, device=0, stream=stream,
             correlation=corr, **meta)


def launch(ts: float, corr: int, cat: str = "cuda_runtime", name: str = "cudaLaunchKernel") -> Event:
    return x(name, cat, ts, ts + 2, correlation=corr)


def rpc(ts: float, end: float, coll: str, nelems_in: int, nelems_out: int, dtype: str, group: int) -> Event:
    """A record_param_comms range with the collective's metadata, as torch >= 2.1 writes it."""
    return x("record_param_comms", "cpu_op", ts, end, **{
        "Collective name": coll, "In msg nelems": nelems_in, "Out msg nelems": nelems_out, "dtype": dtype,
        "Group size": group, "Process Group Name": "0"})


def step(n: int, ts: float, end: float, cat: str = "user_annotation") -> Event:
    return x(f"ProfilerStep#{n}", cat, ts, end)


def foreign_forward() -> dict:
    """CPU/gloo, 2 steps of 1000 µs (hta_cpu_gloo_v1_1r's shape): a TorchScript ``forward``
    cpu_op on the main thread, foreign phases ``## forward ##``, ``## backward ##``,
    ``Optimizer.step#SGD.step``, one ``gloo:all_reduce`` per step on a gloo thread.

    Per step (offset 1000·k): main-thread ops [10,100] (``forward``, with aten::linear inside),
    [150,290], [300,700], [810,940] -> compute 760 µs; comm [500,900] = 400 µs; overlap
    [500,700] + [810,900] = 290 µs -> 72.5 %. Phases: fwd 300, bwd 500, opt 150 µs.
    Taking the ``forward`` op for a phase instead gives compute 90 µs and overlap 0 %.
    """
    ev: list[Event] = []
    for k in range(2):
        t = 1000.0 * (k + 1)
        ev += [step(k + 1, t, t + 1000),
               x("## forward ##", "user_annotation", t, t + 300),
               x("forward", "cpu_op", t + 10, t + 100),
               x("aten::linear", "cpu_op", t + 20, t + 90),
               x("aten::mm", "cpu_op", t + 150, t + 290),
               x("## backward ##", "user_annotation", t + 300, t + 800),
               x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", t + 300, t + 700),
               x("Optimizer.step#SGD.step", "user_annotation", t + 800, t + 950),
               x("aten::add_", "cpu_op", t + 810, t + 940),
               x("gloo:all_reduce", "cpu_op", t + 500, t + 900, tid=GLOO_TID)]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
            "traceEvents": ev}


def queued_kernels() -> dict:
    """GPU, 2 steps of 1000 µs (tracelens_mi300 / hta_negq's shape): two kernels still queued
    from before the profiler started (a compute and an NCCL one; their launches are not in the
    trace) run inside step 1's window.

    Per step: a gemm launched in the step runs [200,500], an all-reduce launched inside its
    record_param_comms range (Float, 1000 elements: 4000 bytes) runs [400,700] -> compute 300,
    comm 300, overlap 100 µs = 33.33 %; 2 collectives in all. Counting the queued kernels by
    GPU time (comm [10,210], compute [5,105] in step 1) gives 3 collectives and 305/800 = 38.1 %.
    """
    ev: list[Event] = [kernel("void queued_compute_kernel<float>(float*)", 1005, 1105, corr=1),
                       kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                              1010, 1210, corr=2, stream=COMM_STREAM)]
    corr = 10
    for k in range(2):
        t = 1000.0 * (k + 1)
        ev += [step(k + 1, t, t + 1000),
               x("aten::mm", "cpu_op", t + 100, t + 110), launch(t + 102, corr),
               kernel("ampere_sgemm_128x64_tn", t + 200, t + 500, corr),
               x("c10d::allreduce_", "cpu_op", t + 120, t + 140),
               rpc(t + 121, t + 139, "allreduce", 1000, 1000, "Float", 2), launch(t + 125, corr + 1),
               kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", t + 400,
                      t + 700, corr + 1, stream=COMM_STREAM)]
        corr += 2
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
            "traceEvents": ev}


def legacy_norank() -> dict:
    """kineto before torch 1.10 (kineto_resnet50_1gpu's shape): categories ``Operator``,
    ``Runtime``, ``Kernel``, ``Memcpy``; no ``distributedInfo`` and no rank in the file name.

    2 steps (ProfilerStep#5, #6 as ``Operator`` events); per step a conv kernel [300,600]
    (300 µs of compute) and a memcpy [160,180]; no communication. Rank 0 of 1.
    """
    ev: list[Event] = []
    corr = 5
    for k in range(2):
        t = 1000.0 * (k + 1)
        ev += [step(5 + k, t, t + 1000, cat="Operator"),
               x("aten::conv2d", "Operator", t + 100, t + 200),
               launch(t + 110, corr, cat="Runtime"),
               kernel("implicit_convolve_sgemm", t + 300, t + 600, corr, cat="Kernel"),
               launch(t + 150, corr + 1, cat="Runtime", name="cudaMemcpyAsync"),
               kernel("Memcpy HtoD (Pageable -> Device)", t + 160, t + 180, corr + 1, cat="Memcpy")]
        corr += 2
    return {"schemaVersion": 1, "traceEvents": ev}


def no_steps() -> dict:
    """No ProfilerStep markers (tracelens_b200_eager_1r's shape): the whole trace is one step.

    Host events span [0,1000] (a python_function around everything). A gemm runs [120,320]; an
    all-gather kernel whose own args carry the metadata (``_allgather_base``, BFloat16, 100 in,
    800 out: 1600 bytes, group of 8) runs [200,400] -> compute 200, comm 200, overlap 120 µs =
    60 %; step 0 lasts 1000 µs.
    """
    ev = [x("train.py(12): main", "python_function", 0, 1000),
          x("aten::mm", "cpu_op", 100, 110), launch(102, 1),
          kernel("ampere_sgemm_128x64_tn", 120, 320, 1),
          x("c10d::_allgather_base_", "cpu_op", 150, 170), launch(160, 2),
          kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 200, 400, 2,
                 stream=COMM_STREAM, **{"Collective name": "_allgather_base", "In msg nelems": 100,
                                        "Out msg nelems": 800, "dtype": "BFloat16", "Group size": 8})]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
            "traceEvents": ev}


def coll_meta() -> dict:
    """Collective metadata in record_param_comms only, RCCL's one kernel name for every
    collective (tracelens_mi300's shape), 1 step [1000,2000].

    Three calls, each launching one ``ncclDevKernel_Generic``: a broadcast (Long, 10 elements:
    80 bytes; its range nested in ``c10d::broadcast_``), an all-reduce (BFloat16, 1000
    elements: 2000 bytes) and an all-gather of a dtype no table knows (bytes unknown: empty).
    """
    generic = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
    t = 1000.0
    ev = [step(1, t, t + 1000),
          x("c10d::broadcast_", "cpu_op", t + 10, t + 40),
          rpc(t + 11, t + 39, "broadcast", 10, 10, "Long", 8), launch(t + 20, 1),
          kernel(generic, t + 100, t + 150, 1, stream=COMM_STREAM),
          x("c10d::allreduce_", "cpu_op", t + 50, t + 80),
          rpc(t + 51, t + 79, "allreduce", 1000, 1000, "BFloat16", 8), launch(t + 60, 2),
          kernel(generic, t + 200, t + 400, 2, stream=COMM_STREAM),
          rpc(t + 90, t + 99, "all_gather_into_tensor", 10, 80, "MysteryType", 8), launch(t + 95, 3),
          kernel(generic, t + 450, t + 500, 3, stream=COMM_STREAM),
          x("aten::mm", "cpu_op", t + 500, t + 510), launch(t + 505, 4),
          kernel("ampere_sgemm_128x64_tn", t + 520, t + 600, 4)]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
            "traceEvents": ev}


def gloo_cuda(rank: int) -> dict:
    """One rank of a 2-rank DDP over gloo with CUDA tensors (h200_ddp_gloo_cuda_2r's shape): no NCCL
    kernel; gloo runs each all-reduce as a ``gloo:all_reduce`` span on one of two worker threads,
    copying the gradients to the host and back (memcpys on a side stream, launched by the worker),
    and the profiler copies each span onto that stream as a ``gpu_user_annotation``.

    3 steps of 100 ms (offset T = 100000·(s-1) µs). Rank 1's forward kernel runs 6 ms longer
    (d = 6000 µs on rank 1, 0 on rank 0), so it enqueues both all-reduces 6 ms late. Per step:
    compute kernels [1000, 11000+d], [11000+d, 21000+d], [47200, 52200]; enqueues
    (``c10d::allreduce_`` on the main thread) at 11000+d and 21000+d; spans on the workers:
    rank 0 [11200, 37200] and [21200, 47200], rank 1 [17200, 37200] and [27200, 47200] (a span
    starts when its worker picks the work up and ends when the slower peer's data is in).
    Step window: the GPU events, [1000, 52200] = 51.2 ms.

    Rank 0: compute 25 ms; comm [11200, 47200] = 36 ms; overlapped [11200, 21000] = 9.8 ms ->
    27.222 %; exposed 26.2 ms. Rank 1: compute 31 ms; comm [17200, 47200] = 30 ms; overlapped
    [17200, 27000] = 9.8 ms -> 32.667 %; exposed 20.2 ms. Stragglers: 6 all-reduces matched,
    rank 1 arrives last in all of them and rank 0 waits 6 ms for each.
    """
    d = 6000 if rank else 0
    workers = (GLOO_TID, GLOO_TID + 1)
    spans = ((11200 + d, 37200), (21200 + d, 47200))
    ev: list[Event] = []
    for s in (1, 2, 3):
        t, c = 100000.0 * (s - 1), 100 * s
        ev += [step(s, t, t + 100000),
               x("aten::mm", "cpu_op", t + 100, t + 400), launch(t + 100, c + 1), launch(t + 200, c + 2),
               launch(t + 300, c + 3),
               kernel("sm90_xmma_gemm_f32f32", t + 1000, t + 11000 + d, c + 1),
               kernel("sm90_xmma_gemm_f32f32", t + 11000 + d, t + 21000 + d, c + 2),
               kernel("void at::native::vectorized_elementwise_kernel", t + 47200, t + 52200, c + 3)]
        for i, ((a, b), worker) in enumerate(zip(spans, workers)):
            enq = t + 11000 + d + 10000 * i
            corr = c + 10 + 2 * i
            ev += [x("c10d::allreduce_", "cpu_op", enq, enq + 100),
                   x("gloo:all_reduce", "user_annotation", t + a, t + b, tid=worker),
                   x("cudaMemcpyAsync", "cuda_runtime", t + a + 10, t + a + 20, tid=worker, correlation=corr),
                   x("cudaMemcpyAsync", "cuda_runtime", t + b - 510, t + b - 500, tid=worker, correlation=corr + 1),
                   kernel("Memcpy DtoH (Device -> Pinned)", t + a + 50, t + a + 550, corr, stream=COMM_STREAM,
                          cat="gpu_memcpy"),
                   kernel("Memcpy HtoD (Pinned -> Device)", t + b - 500, t + b, corr + 1, stream=COMM_STREAM,
                          cat="gpu_memcpy"),
                   x("gloo:all_reduce", "gpu_user_annotation", t + b - 500, t + b, tid=COMM_STREAM, pid=DEVICE_PID)]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
            "traceEvents": ev}


SHAPES = {"shape_foreign_forward.json.gz": foreign_forward, "shape_queued_kernels.json.gz": queued_kernels,
          "shape_legacy_norank.pt.trace.json.gz": legacy_norank, "shape_no_steps.json.gz": no_steps,
          "shape_coll_meta.json.gz": coll_meta,
          "shape_gloo_cuda_2r/rank0.json.gz": lambda: gloo_cuda(0),
          "shape_gloo_cuda_2r/rank1.json.gz": lambda: gloo_cuda(1)}


def main() -> None:
    for name, make in SHAPES.items():
        doc = make()
        doc["traceEvents"].sort(key=lambda e: e["ts"])
        text = json.dumps(doc)
        (DATA / name).parent.mkdir(exist_ok=True)
        (DATA / name).write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
        print(f"{name}: {len(doc['traceEvents'])} events")


if __name__ == "__main__":
    main()
