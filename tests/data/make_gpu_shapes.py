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


def mfu_trace() -> dict:
    """Matrix products with recorded shapes (``record_shapes=True``) on an H100 SXM, for
    achieved TFLOP/s and MFU (dpcore.read.traces.matmuls, analysis.gpu_kernels; peaks.csv's
    H100 SXM: bf16 989.5, fp16 989.5, fp32 67 TFLOP/s dense):

    * ``aten::matmul`` [0,50] around ``aten::mm`` [5,45] of 4096x4096 @ 4096x4096 bf16: one
      ``nvjet`` kernel (no dtype in its name) [100,1100]: 2·4096³ = 137.438953472 GFLOP in 1 ms.
    * ``aten::linear`` [60,80], input 8x512x1024, weight 2048x1024: a bf16 xmma kernel [1100,1200]:
      2·8·512·1024·2048 = 17.179869184 GFLOP in 0.1 ms. The bf16 GEMM row: 154.618822656 GFLOP
      in 1.1 ms = 140.5625660509 TFLOP/s, MFU 14.205413 %.
    * ``aten::bmm`` [90,95] 16x256x64 @ 16x64x256 fp32: an ffma kernel [1200,1250]: 2·16·256·256·64
      = 134,217,728 FLOP in 0.05 ms = 2.68435456 TFLOP/s, MFU 4.0065 %.
    * ``aten::linear`` [100,130] around ``aten::addmm`` [105,125] (bias 1024, 64x8192 @ 8192x1024,
      fp16): split-K, a GEMM [1250,1280] and cuBLAS's reduction [1280,1290] (also a GEMM-class
      kernel, dtype from the inputs): 3/4 and 1/4 of 1.073741824 GFLOP; the fp16 row: 0.04 ms,
      26.8435456 TFLOP/s, MFU 2.712839 %.
    * a GEMM launched outside any op [1300,1400] (launch at 140): no shapes, no rate.
    """
    mm = {"aten::mm": ([[4096, 4096], [4096, 4096]], ["c10::BFloat16", "c10::BFloat16"])}
    bf = ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]
    ev: list[Event] = [
        x("ProfilerStep#1", "user_annotation", -10, 2000),
        x("aten::matmul", "cpu_op", 0, 50, **{"Input Dims": [[4096, 4096], [4096, 4096]],
                                             "Input type": bf[:2]}),
        x("aten::mm", "cpu_op", 5, 45, **{"Input Dims": mm["aten::mm"][0], "Input type": mm["aten::mm"][1]}),
        *gpu("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_TNT", 100, 1100, 1, 10),
        x("aten::linear", "cpu_op", 60, 80, **{"Input Dims": [[8, 512, 1024], [2048, 1024], [2048]],
                                              "Input type": bf}),
        *gpu("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1100, 1200, 2, 65),
        x("aten::bmm", "cpu_op", 90, 95, **{"Input Dims": [[16, 256, 64], [16, 64, 256]],
                                           "Input type": ["float", "float"]}),
        *gpu("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma", 1200, 1250, 3, 91),
        x("aten::linear", "cpu_op", 100, 130, **{"Input Dims": [[64, 8192], [1024, 8192], [1024]],
                                                "Input type": ["c10::Half"] * 3}),
        x("aten::addmm", "cpu_op", 105, 125, **{"Input Dims": [[1024], [64, 8192], [8192, 1024], [], []],
                                               "Input type": ["c10::Half"] * 3 + ["Scalar", "Scalar"]}),
        *gpu("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", 1250, 1280, 4, 110),
        *gpu("void cublasLt::splitKreduce_kernel<32, 16, int, __half>(Params)", 1280, 1290, 5, 115),
        *gpu("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", 1300, 1400, 6, 140),
    ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}


def nccl_rank_trace(rank: int) -> dict:
    """Rank ``rank`` of a 2-rank NCCL job (``gpu_nccl_2r/``): per-collective transfer and wait.

    Step 1, rank 0: all-reduce kernel [100,400] (300 µs), all-gather [600,700] (100 µs); rank 1:
    all-reduce [300,400] (100 µs), all-gather [550,700] (150 µs). Matched: the all-reduce's
    transfer is 100 µs (rank 1's), rank 0 waited 200; the all-gather's transfer 100 (rank 0's),
    rank 1 waited 50. Step 2: rank 0 runs two all-reduces, rank 1 one: not matchable, no split.
    Bytes from the kernels' args: all-reduce 1,048,576 bf16 (2 MiB), all-gather 262,144 fp32.
    """
    ar = {"Collective name": "allreduce", "In msg nelems": 1048576, "Out msg nelems": 1048576,
          "dtype": "BFloat16", "Group size": 2}
    ag = {"Collective name": "_allgather_base", "In msg nelems": 131072, "Out msg nelems": 262144,
          "dtype": "Float", "Group size": 2}
    k_ar = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    k_ag = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    spans = {0: [(k_ar, ar, 100, 400), (k_ag, ag, 600, 700), (k_ar, ar, 1100, 1200), (k_ar, ar, 1300, 1400)],
             1: [(k_ar, ar, 300, 400), (k_ag, ag, 550, 700), (k_ar, ar, 1100, 1250)]}[rank]
    ev: list[Event] = [x("ProfilerStep#1", "user_annotation", 0, 1000),
                       x("ProfilerStep#2", "user_annotation", 1000, 2000)]
    for i, (name, meta, ts, end) in enumerate(spans, start=1):
        kernel, launch = gpu(name, ts, end, i, ts - 50, stream=20)
        kernel["args"].update(meta)
        ev += [kernel, launch]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}


SHAPES = {"gpu_ledger_rank0.json.gz": ledger_trace, "gpu_mfu_rank0.json.gz": mfu_trace,
          "gpu_nccl_2r/rank0.json.gz": lambda: nccl_rank_trace(0),
          "gpu_nccl_2r/rank1.json.gz": lambda: nccl_rank_trace(1)}


def main() -> None:
    for name, make in SHAPES.items():
        doc = make()
        doc["traceEvents"].sort(key=lambda e: e["ts"])
        (DATA / name).parent.mkdir(exist_ok=True)
        (DATA / name).write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=9, mtime=0))
        print(f"{name}: {len(doc['traceEvents'])} events")


if __name__ == "__main__":
    main()
