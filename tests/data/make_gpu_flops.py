"""Write ``tests/data/gpu_flops_rank0.json.gz``: one traced step on an H100 SXM whose kernels do known
work (attention forward and backward, a convolution and its backward, an fp8 product, a
matrix-vector product, fp32 products with and without the tensor cores, scaled-dot-product
attention's math form), one call whose recorded shapes are absurd, one kernel with a negative
duration, and work no FLOPs are known for, so step MFU, GEMM efficiency, FLOPs coverage and the
set-aside counts are asserted against hand-computed values (tests/read/analysis/test_gpu_flops.py).

Run from the repository root: ``python tests/data/make_gpu_flops.py`` (deterministic). Times are µs
after ``BASE``; every op lies inside ProfilerStep#1 [0,1000] and launches its kernels 2 µs after it
starts, so every GPU event belongs to step 1.

GPU events (stream 7; kernel window in µs; FLOPs by the conventions of dpcore.read.traces.matmuls):

* K1 ``flash_fwd_kernel`` [1000,1500] under ``_scaled_dot_product_flash_attention`` (inside
  ``scaled_dot_product_attention``), q = k = v = 2x8x1024x64 bf16: 4·2·8·1024·1024·64 = 4,294,967,296.
* K2 ``flash_bwd_...`` [1500,2500] under ``_scaled_dot_product_flash_attention_backward``: 2.5 × K1
  = 10,737,418,240.
* K3 ``fprop`` [2500,2900] under ``cudnn_convolution`` (input 8x64x56x56, weight 128x64x3x3, bf16);
  its output 8x128x28x28 is named by the backward below: 2·(128·64·9)·8·28·28 = 924,844,032.
* K4 ``dgrad`` [2900,3100] and K5 ``wgrad`` [3100,3400] under ``convolution_backward``: 2 × K3,
  shared 2/5 and 3/5 by their durations.
* K6 fp8 GEMM [3400,3600] under ``_scaled_mm`` 4096x4096 @ 4096x4096 e4m3: 2·4096³ = 137,438,953,472.
* K7 ``gemv`` (fp32 in its name) [3600,3700] under ``addmv`` (4096x8192 @ 8192): 2·4096·8192 = 67,108,864.
* K8 ``nvjet`` [3700,3710] under ``mm`` of 1,000,000² @ 1,000,000² bf16: 2·10¹⁸ FLOPs in 10 µs,
  2·10¹¹ TFLOP/s: impossible, set aside.
* K9 ``nvjet`` [3710,3910] under ``mm`` 2048³ fp32: 17,179,869,184 FLOPs in 200 µs = 85.9 TFLOP/s,
  above the fp32 peak (67): the tensor cores ran it, rated TF32.
* K10 ``nvjet`` [3910,4010] under ``mm`` 1024³ fp32: 2,147,483,648 FLOPs in 100 µs = 21.5 TFLOP/s:
  fp32 (TF32 where the run records tf32).
* K11 elementwise [4010,5010]: no op, no FLOPs.
* K12 a kernel at 900 with duration -50 (before every other event): set aside. Counted, it moved the
  window's start: a 4.34 ms span with 0.2 ms idle where there are 4.24 and 0.1.
* K13 ``nvjet`` [5110,5130] under ``bmm`` 2x128x64 @ 2x64x128 fp32 (4,194,304 FLOPs), itself inside
  the math form of ``scaled_dot_product_attention`` (1x2x128x64 fp32), whose own softmax kernel
  K14 [5130,5140] gets no FLOPs (the bmm counts the work).
* M1 memcpy [5140,5240].
* K16 a layout transpose [5240,5340] launched by ``cudnn_convolution`` too: the op's FLOPs stay with
  its convolution kernel K3 (a math kernel), none to the transpose.

Answers: span 4340 µs (1000..5340); idle 100 µs ([5010,5110]); compute-kernel time 4140 µs, of it
3020 with FLOPs (all but K8, K11, K14, K16): coverage 72.946860 %. The ledger and the test derive
MFU from these FLOPs and peaks.csv's H100 SXM rows (bf16 989.5, fp8 1979, tf32 494.5, fp32 67 TFLOP/s).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent
BASE = 1_000_000.0
HOST_PID, HOST_TID, DEVICE_PID = 100, 100, 0
DEVICE = "NVIDIA H100 80GB HBM3"
Event = dict[str, Any]
BF, F32 = "c10::BFloat16", "float"
QKV = [[2, 8, 1024, 64]] * 3
X, W, Y = [8, 64, 56, 56], [128, 64, 3, 3], [8, 128, 28, 28]


def x(name: str, cat: str, ts: float, end: float, pid: Any = HOST_PID, tid: Any = HOST_TID, **args: Any) -> Event:
    """A complete event from ts to end (µs after BASE)."""
    e: Event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": BASE + ts, "dur": end - ts}
    if args:
        e["args"] = args
    return e


def op(name: str, ts: float, end: float, dims: list, types: list) -> Event:
    """A CPU op with recorded shapes."""
    return x(name, "cpu_op", ts, end, **{"Input Dims": dims, "Input type": types})


def gpu(name: str, ts: float, end: float, corr: int, launched: float, cat: str = "kernel") -> list[Event]:
    """A GPU event on stream 7 and its launch call (same correlation id) on the host thread."""
    call = {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync"}[cat]
    return [x(name, cat, ts, end, pid=DEVICE_PID, tid="stream 7", device=0, stream=7, correlation=corr),
            x(call, "cuda_runtime", launched, launched + 1, correlation=corr)]


def flops_trace() -> dict:
    """The trace of the module docstring."""
    nvjet = "nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_TNT"
    ev: list[Event] = [
        x("ProfilerStep#1", "user_annotation", 0, 1000),
        op("aten::scaled_dot_product_attention", 10, 60, QKV, [BF] * 3),
        op("aten::_scaled_dot_product_flash_attention", 12, 58, QKV, [BF] * 3),
        op("aten::_flash_attention_forward", 13, 57, [[2, 1024, 8, 64]] * 3, [BF] * 3),
        *gpu("flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
             1000, 1500, 1, 15),
        op("aten::_scaled_dot_product_flash_attention_backward", 100, 150,
           [[2, 8, 1024, 64]] * 5 + [[2, 8, 1024]], [BF] * 5 + ["float"]),
        *gpu("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 4, 4, "
             "false, false, cutlass::bfloat16_t>>", 1500, 2500, 2, 102),
        op("aten::conv2d", 200, 260, [X, W, [], [], [], []], [BF, BF]),
        op("aten::convolution", 202, 258, [X, W, [], [], [], [], [], [], []], [BF, BF]),
        op("aten::cudnn_convolution", 205, 255, [X, W, [], [], [], [], [], [], []], [BF, BF]),
        *gpu("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", 2500, 2900, 3,
             207),
        op("aten::convolution_backward", 300, 350, [Y, X, W, [], [], [], [], [], [], [], []], [BF] * 3),
        *gpu("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 2900, 3100, 4, 302),
        *gpu("sm90_xmma_wgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 3100, 3400, 5, 304),
        op("aten::_scaled_mm", 400, 420, [[4096, 4096], [4096, 4096], [], [], [], []],
           ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float"]),
        *gpu("sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128", 3400, 3600, 6, 402),
        op("aten::addmv", 500, 510, [[4096], [4096, 8192], [8192], [], []], [F32] * 3 + ["Scalar", "Scalar"]),
        *gpu("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>", 3600,
             3700, 7, 502),
        op("aten::mm", 600, 610, [[1000000, 1000000], [1000000, 1000000]], [BF, BF]),
        *gpu(nvjet, 3700, 3710, 8, 602),
        op("aten::mm", 700, 710, [[2048, 2048], [2048, 2048]], [F32, F32]),
        *gpu(nvjet, 3710, 3910, 9, 702),
        op("aten::mm", 720, 730, [[1024, 1024], [1024, 1024]], [F32, F32]),
        *gpu(nvjet, 3910, 4010, 10, 722),
        *gpu("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", 4010, 5010, 11,
             750),
        *gpu("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 900, 850, 12,
             760),
        op("aten::scaled_dot_product_attention", 800, 900, [[1, 2, 128, 64]] * 3, [F32] * 3),
        op("aten::bmm", 810, 820, [[2, 128, 64], [2, 64, 128]], [F32, F32]),
        *gpu(nvjet, 5110, 5130, 13, 812),
        *gpu("void softmax_warp_forward<float, float, float, 7, false, false>", 5130, 5140, 14, 830),
        *gpu("Memcpy DtoH (Device -> Pageable)", 5140, 5240, 15, 850, cat="gpu_memcpy"),
        *gpu("batched_transpose_32x32_half", 5240, 5340, 16, 208),
    ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "deviceProperties": [{"id": 0, "name": DEVICE}], "traceEvents": ev}


def main() -> None:
    doc = flops_trace()
    doc["traceEvents"].sort(key=lambda e: e["ts"])
    out = DATA / "gpu_flops_rank0.json.gz"
    out.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=9, mtime=0))
    print(f"{out.name}: {len(doc['traceEvents'])} events")


if __name__ == "__main__":
    main()
