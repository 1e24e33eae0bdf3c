"""GPU time by kernel class (dpcore.read.analysis.gpu_kernels) on the small GPU trace of
tests/data/make_gpu_shapes.py, and the class and data type of real kernel names."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.read.analysis.gpu_kernels import (
    KERNEL_ROW_COLUMNS,
    PEAKS_CSV,
    fp32_matmul_note,
    gemm_dtype,
    kernel_class,
    kernel_classes,
    peak_tflops,
)
from dpcore.read.report.gpu import KERNEL_COLUMNS as CSV_COLUMNS
from dpcore.read.traces.matmuls import matmul_flops
from dpcore.read.traces.reader import read_trace

TRACE = Path(__file__).resolve().parents[2] / "data" / "gpu_ledger_rank0.json.gz"


def test_classes_of_the_small_trace() -> None:
    df = kernel_classes(read_trace(TRACE), "NVIDIA H100 80GB HBM3")
    assert list(df.columns) == KERNEL_ROW_COLUMNS
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
    assert (df["tflops"] == "").all() and (df["eff_pct"] == "").all()  # shapes are not read
    assert (df["flops_calls"] == 0).all() and (df["set_aside"] == 0).all()


MFU_TRACE = TRACE.with_name("gpu_mfu_rank0.json.gz")
H100 = "NVIDIA H100 80GB HBM3"


def test_tflops_and_mfu_of_matrix_products_with_shapes() -> None:
    """Hand-computed answers of tests/data/make_gpu_shapes.py's mfu_trace."""
    df = kernel_classes(read_trace(MFU_TRACE), H100)
    assert list(df.columns) == KERNEL_ROW_COLUMNS
    rows = {r.dtype: r for r in df.itertuples()}
    assert set(rows) == {"bf16", "fp32", "fp16", ""}
    bf16 = rows["bf16"]  # the nvjet kernel has no dtype in its name: its inputs' (Input type) is bf16
    assert (bf16.calls, bf16.flops, bf16.flops_ms) == (2, pytest.approx(2 * 4096 ** 3 + 2 * 8 * 512 * 1024 * 2048),
                                                       pytest.approx(1.1))
    assert bf16.tflops == pytest.approx(140.5625660509, rel=1e-9)
    assert bf16.eff_pct == pytest.approx(100 * 140.5625660509 / 989.5, rel=1e-9)
    assert rows["fp32"].tflops == pytest.approx(2.68435456) and rows["fp32"].eff_pct == pytest.approx(
        100 * 2.68435456 / 67)
    assert rows["fp16"].calls == 2 and rows["fp16"].flops == pytest.approx(2 * 64 * 8192 * 1024)  # split-K: once
    assert rows["fp16"].tflops == pytest.approx(26.8435456) and rows["fp16"].eff_pct == pytest.approx(2.712839, 1e-6)
    assert np.isnan(rows[""].tflops) and np.isnan(rows[""].eff_pct)  # launched outside any op: no shapes
    # which calls a row's TFLOP/s covers: all of the bf16 row's, none of the unnamed one's
    assert (bf16.flops_calls, rows[""].flops_calls, rows[""].calls) == (2, 0, 1)


def test_a_4096_cubed_bf16_gemm_of_1_ms_on_an_h100() -> None:
    events = read_trace(MFU_TRACE)
    one = events[(events["stream"] < 0) | (events["corr"] == 1)]  # only the aten::mm's kernel
    row = kernel_classes(one, H100).iloc[0]
    assert row.tflops == pytest.approx(137.438953472) and row.eff_pct == pytest.approx(13.8897376, rel=1e-7)
    other = kernel_classes(one, "NVIDIA GeForce RTX 4090").iloc[0]  # not in the peak table: a rate, no MFU
    assert other.tflops == pytest.approx(137.438953472) and np.isnan(other.eff_pct)


@pytest.mark.parametrize("device,dtype,peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5), ("NVIDIA H100 80GB HBM3", "tf32", 494.5),
    ("NVIDIA H200", "fp16", 989.5), ("NVIDIA A100-SXM4-80GB", "tf32", 156), ("NVIDIA B200", "bf16", 2250),
    ("AMD Instinct MI300X", "bf16", 1307.4), ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H200 NVL", "bf16", 835.5),
    ("NVIDIA H100 80GB HBM3", "fp8", 1979), ("NVIDIA A100-SXM4-80GB", "fp8", None), ("", "bf16", None),
    ("cpu", "fp32", None)])
def test_peak_table(device, dtype, peak) -> None:
    got = peak_tflops(device, dtype)
    assert (np.isnan(got) if peak is None else got == peak)


def test_peak_table_rows_have_a_source() -> None:
    peaks = pd.read_csv(PEAKS_CSV)
    assert list(peaks.columns) == ["device", "name_pattern", "dtype", "tflops", "source"]
    assert peaks["source"].str.len().min() > 20 and (peaks["tflops"] > 0).all()
    assert set(peaks["device"]) == {"H100 SXM", "H100 PCIe", "H100 NVL", "H200 SXM", "H200 NVL", "H800 SXM", "A100",
                                    "B200", "GB200", "MI300X", "MI325X"}
    # every part has the four tensor/vector rows, and fp8 where it has fp8 tensor cores (not the A100)
    for d in set(peaks["device"]):
        want = {"bf16", "fp16", "tf32", "fp32"} | (set() if d == "A100" else {"fp8"})
        assert set(peaks[peaks["device"] == d]["dtype"]) == want, d
    # dense (no sparsity): bf16 twice tf32 on every NVIDIA part and on CDNA3
    wide = peaks.pivot(index="device", columns="dtype", values="tflops")
    assert (wide["bf16"] == wide["fp16"]).all() and np.allclose(wide["bf16"], 2 * wide["tf32"], rtol=0.01)


@pytest.mark.parametrize("op,dims,flops", [
    ("aten::mm", [[4096, 4096], [4096, 4096]], 2 * 4096 ** 3),
    ("aten::addmm", [[1024], [64, 8192], [8192, 1024], [], []], 2 * 64 * 8192 * 1024),
    ("aten::bmm", [[16, 256, 64], [16, 64, 256]], 2 * 16 * 256 * 256 * 64),
    ("aten::baddbmm", [[16, 256, 256], [16, 256, 64], [16, 64, 256], [], []], 2 * 16 * 256 * 256 * 64),
    ("aten::matmul", [[2, 1, 128, 64], [3, 64, 32]], 2 * 6 * 128 * 32 * 64),  # broadcast batch
    ("aten::matmul", [[8, 128, 64], [64, 32]], 2 * 8 * 128 * 32 * 64),
    ("aten::linear", [[8, 512, 1024], [2048, 1024], [2048]], 2 * 8 * 512 * 1024 * 2048),
    ("aten::mm", [[4, 5], [6, 7]], None),  # inner dimensions differ
    ("aten::matmul", [[64], [64, 32]], None),  # a 1-D operand: not counted
    ("aten::mm", [[4, 5]], None), ("aten::add", [[4, 5], [5, 6]], None),
])
def test_matmul_flops(op, dims, flops) -> None:
    got = matmul_flops(op, dims)
    assert (np.isnan(got) if flops is None else got == flops)


def test_kernels_csv_has_tflops_and_mfu() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["gpu", str(MFU_TRACE), "--kernels", "--csv"]) == 0
    df = pd.read_csv(io.StringIO(out.getvalue()), keep_default_na=False, na_values=[""])
    bf16 = df[df["dtype"] == "bf16"].iloc[0]
    assert bf16["tflops"] == pytest.approx(140.5626, abs=1e-3) and bf16["eff_pct"] == pytest.approx(14.2054, abs=1e-3)
