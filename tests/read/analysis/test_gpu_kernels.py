"""GPU time by kernel class (dpcore.read.analysis.gpu_kernels) on the small GPU trace of
tests/data/make_gpu_shapes.py, and the class and data type of real kernel names."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.read.analysis.gpu_kernels import KERNEL_COLUMNS, fp32_matmul_note, gemm_dtype, kernel_class, kernel_classes
from dpcore.read.report.gpu import KERNEL_COLUMNS as CSV_COLUMNS
from dpcore.read.traces.reader import read_trace

TRACE = Path(__file__).resolve().parents[2] / "data" / "gpu_ledger_rank0.json.gz"


def test_classes_of_the_small_trace() -> None:
    df = kernel_classes(read_trace(TRACE), "NVIDIA H100 80GB HBM3")
    assert list(df.columns) == KERNEL_COLUMNS
    got = {(r.kernel_class, r.dtype): (r.calls, round(r.total_ms, 9)) for r in df.itertuples()}
    # 1,170 µs of GPU events: K0 K3 K4 K7 K8 elementwise, K1 K5 bf16 GEMMs, K2 NCCL, M1 + S1, K6 reduce
    assert got == {("elementwise", ""): (5, 0.4), ("gemm", "bf16"): (2, 0.3), ("communication", ""): (1, 0.3),
                   ("reduction", ""): (1, 0.1), ("memory", ""): (2, 0.07)}
    assert df["share_pct"].sum() == pytest.approx(100)
    assert df.set_index("kernel_class").loc["elementwise", "share_pct"] == pytest.approx(100 * 400 / 1170)
    assert fp32_matmul_note(df) == ""  # bf16 GEMMs


@pytest.mark.parametrize("name,kind,cls,dtype", [
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma", "compute", "gemm", "fp32"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(Params)", "compute", "gemm", "fp32"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1>(Params)", "compute", "gemm", "tf32"),
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "compute", "gemm", ""),
    ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3", "compute", "gemm", "fp8"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", "compute", "gemm", "fp16"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
     "compute", "attention", "bf16"),
    ("triton_red_fused_native_layer_norm_0", "compute", "reduction", ""),
    ("triton_poi_fused_gelu_1", "compute", "elementwise", ""),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<2>>", "compute",
     "elementwise", ""),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm", "communication", ""),
    ("Memcpy DtoD (Device -> Device)", "memcpy", "memory", ""),
    ("void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<long>", "compute", "other", ""),
])
def test_real_kernel_names(name, kind, cls, dtype) -> None:
    assert kernel_class(name, kind) == cls
    if cls in ("gemm", "attention"):
        assert gemm_dtype(name) == dtype


def test_fp32_gemms_on_tensor_cores_are_flagged() -> None:
    df = pd.DataFrame({"rank": [0, 0], "kernel_class": ["gemm", "elementwise"], "dtype": ["fp32", ""],
                       "calls": [3, 4], "total_ms": [1.5, 0.5], "share_pct": [75.0, 25.0], "device": "NVIDIA H200"})
    assert fp32_matmul_note(df).startswith("fp32 matrix products: 1.5 ms (75 % of GPU time) on an NVIDIA H200")
    assert fp32_matmul_note(df.assign(device="")) == ""  # no device named: no claim about tensor cores
    assert fp32_matmul_note(df.assign(dtype="tf32")) == ""


def test_kernels_csv_columns() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["gpu", str(TRACE), "--kernels", "--csv"]) == 0
    df = pd.read_csv(io.StringIO(out.getvalue()), keep_default_na=False)
    assert list(df.columns) == CSV_COLUMNS
    assert df["kernel_class"].tolist() == ["elementwise", "gemm", "communication", "reduction", "memory"]
    assert (df["tflops"] == "").all() and (df["mfu_pct"] == "").all()  # shapes are not read
