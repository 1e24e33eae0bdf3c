"""Step MFU, GEMM efficiency and FLOPs coverage (dpcore.read.analysis.gpu_flops) against values worked
out by hand on tests/data/make_gpu_flops.py's trace; the FLOPs of attention, convolution, fp8 and
matrix-vector ops (dpcore.read.traces.matmuls); what cannot be true set aside and counted; the peak
table matched against the device names real traces carry; and on the real traces in ../shared
(skipped where absent): a GPU idle most of its trace has a step MFU far below its GEMM efficiency."""
from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.read.analysis.gpu_flops import (
    EFFICIENCY_COLUMNS,
    efficiency_text,
    peak_device,
    peak_tflops,
    rank_efficiency,
    run_tf32,
    with_efficiency,
)
from dpcore.read.analysis.gpu_kernels import KERNEL_CSV_COLUMNS, kernel_classes
from dpcore.read.analysis.gpu_time import LEDGER_COLUMNS, gpu_ledger, job_gpu
from dpcore.read.traces.matmuls import attention_flops, conv_flops, matmul_flops, op_flops
from dpcore.read.traces.reader import read_trace, read_trace_meta

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT / "tests" / "data" / "gpu_flops_rank0.json.gz"
SHARED = ROOT.parent / "shared"
H100 = "NVIDIA H100 80GB HBM3"
BF16, FP8, TF32, FP32 = 989.5, 1979.0, 494.5, 67.0  # peaks.csv, H100 SXM, dense TFLOP/s

# the FLOPs of make_gpu_flops.py's docstring, written out
F1 = 4 * 2 * 8 * 1024 * 1024 * 64          # attention forward, 2x8x1024x64
F2 = 2.5 * F1                               # its backward
F3 = 2 * (128 * 64 * 3 * 3) * 8 * 28 * 28  # the convolution's forward; its backward 2 x F3
F6 = 2 * 4096 ** 3                          # fp8 _scaled_mm
F7 = 2 * 4096 * 8192                        # addmv
F9 = 2 * 2048 ** 3                          # fp32 mm at 85.9 TFLOP/s: TF32
F10 = 2 * 1024 ** 3                         # fp32 mm at 21.5 TFLOP/s
F13 = 2 * 2 * 128 * 128 * 64                # the bmm inside sdpa's math form
SPAN_US = 4340.0


def ideal_us(tf32: bool) -> float:
    """Σ FLOPs / peak of every call with FLOPs (µs): what the step's FLOPs take at the peaks."""
    fp32_peak = TF32 if tf32 else FP32  # the unnamed fp32 products K10, K13 (K7's name says fp32)
    return ((F1 + F2 + 3 * F3) / BF16 + F6 / FP8 + F7 / FP32 + F9 / TF32 + (F10 + F13) / fp32_peak) / 1e6


def gemm_ideal_us(tf32: bool) -> float:
    fp32_peak = TF32 if tf32 else FP32
    return (F6 / FP8 + F7 / FP32 + F9 / TF32 + (F10 + F13) / fp32_peak) / 1e6


GEMM_US = 200 + 100 + 200 + 100 + 20  # K6, K7, K9, K10, K13 (K8 set aside)


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    return read_trace(TRACE)


@pytest.fixture(scope="module")
def ledger(events) -> pd.DataFrame:
    return gpu_ledger(events, device=H100)[0].assign(job_id="job")


def test_each_kernel_gets_its_ops_flops(events) -> None:
    k = events[events["stream"] >= 0].set_index("corr")
    want = {1: F1, 2: F2, 3: F3, 4: 2 * F3 * 2 / 5, 5: 2 * F3 * 3 / 5, 6: F6, 7: F7, 9: F9, 10: F10, 13: F13}
    assert {c: k.loc[c, "flops"] for c in want} == pytest.approx(want, rel=1e-12)
    # no op (K11), a negative duration (K12), the math sdpa's own softmax (K14: its bmm counts), a copy,
    # the convolution's transpose (K16: K3 is the op's math kernel)
    assert k.loc[[11, 12, 14, 15, 16], "flops"].isna().all()
    assert k.loc[6, "mm_dtype"] == "fp8" and k.loc[1, "mm_dtype"] == "bf16" and k.loc[7, "mm_dtype"] == "fp32"


@pytest.mark.parametrize("tf32", [False, True])
def test_step_mfu_gemm_efficiency_and_coverage_are_the_hand_computed_ones(ledger, tf32) -> None:
    got = with_efficiency(ledger, tf32).set_index("step")
    for step in (-1, 1):  # the whole trace and its one step are the same events
        row = got.loc[step]
        assert row["span_ms"] == pytest.approx(SPAN_US / 1e3)
        assert row["kernel_ms"] == pytest.approx(4.14) and row["flops_ms"] == pytest.approx(3.02)
        assert row["flops_coverage_pct"] == pytest.approx(100 * 3020 / 4140)
        assert row["step_mfu_pct"] == pytest.approx(100 * ideal_us(tf32) / SPAN_US, rel=1e-9)
        assert row["gemm_eff_pct"] == pytest.approx(100 * gemm_ideal_us(tf32) / GEMM_US, rel=1e-9)
        model = F1 + F2 + 3 * F3 + F6 + F7 + F9 + F10 + F13
        assert row["model_tflop"] == pytest.approx(model / 1e12, rel=1e-12)
    eff = rank_efficiency(ledger, tf32).iloc[0]
    assert eff["mfu_windows"] == "steps"
    assert eff["step_mfu_pct"] == pytest.approx(100 * ideal_us(tf32) / SPAN_US, rel=1e-9)
    assert eff["gemm_eff_pct"] == pytest.approx(100 * gemm_ideal_us(tf32) / GEMM_US, rel=1e-9)
    # the two numbers differ by what each divides by: the span, or the GEMM kernels' own time
    assert eff["step_mfu_pct"] < eff["gemm_eff_pct"]
    job = job_gpu(ledger, tf32).iloc[0]
    assert job["gpu_step_mfu_pct"] == pytest.approx(eff["step_mfu_pct"])
    assert job["flops_coverage_pct"] == pytest.approx(eff["flops_coverage_pct"])


def test_the_impossible_is_set_aside_and_counted(ledger, events) -> None:
    row = ledger.set_index("step").loc[-1]
    assert (row["set_aside_events"], row["flops_set_aside"]) == (1, 1)
    # the negative-duration kernel is left out of the ledger: the shares are the other events', each in 0..100
    assert row["compute_ms"] == pytest.approx(4.14) and row["idle_ms"] == pytest.approx(0.10)
    assert row["span_ms"] == pytest.approx(SPAN_US / 1e3)
    assert all(0 <= row[c] <= 100 for c in ("idle_pct", "compute_pct", "non_compute_pct"))
    assert row["compute_ms"] + row["non_compute_ms"] + row["idle_ms"] == pytest.approx(row["span_ms"])
    # the same trace without the negative event has the same ledger, none set aside
    clean, _ = gpu_ledger(events[events["corr"] != 12], device=H100)
    same = [c for c in LEDGER_COLUMNS if c not in ("set_aside_events",) and clean[c].dtype.kind == "f"]
    assert clean.set_index("step").loc[-1, same].astype(float).tolist() == pytest.approx(
        row[same].astype(float).tolist())
    assert clean.set_index("step").loc[-1, "set_aside_events"] == 0
    text = efficiency_text(rank_efficiency(ledger).iloc[0])
    assert "set aside: 1 GPU events with a negative duration, 1 calls whose FLOPs would exceed" in text


def test_kernel_rows_say_which_calls_their_rate_covers(events) -> None:
    rows = kernel_classes(events, H100).set_index(["kernel_class", "dtype"])
    att = rows.loc[("attention", "bf16")]
    assert (att["calls"], att["flops_calls"]) == (2, 2)
    assert att["tflops"] == pytest.approx((F1 + F2) / 1.5e-3 / 1e12) and att["eff_pct"] == pytest.approx(
        100 * (F1 + F2) / 1.5e-3 / 1e12 / BF16)
    assert rows.loc[("other", ""), "calls"] == 1 and np.isnan(rows.loc[("other", ""), "tflops"])  # K16
    conv = rows.loc[("convolution", "bf16")]
    assert (conv["calls"], conv["flops_calls"]) == (3, 3) and conv["tflops"] == pytest.approx(3 * F3 / 0.9e-3 / 1e12)
    fp8 = rows.loc[("gemm", "fp8")]
    assert fp8["tflops"] == pytest.approx(F6 / 0.2e-3 / 1e12) and fp8["eff_pct"] == pytest.approx(
        100 * F6 / 0.2e-3 / 1e12 / FP8)
    # the mm faster than the fp32 peak is TF32 (not fp32 at 128 %); the absurd one counts in time only
    assert rows.loc[("gemm", "tf32"), "eff_pct"] == pytest.approx(100 * F9 / 0.2e-3 / 1e12 / TF32)
    assert (rows["eff_pct"].dropna() <= 100).all()
    bad = rows.loc[("gemm", "bf16")]
    assert (bad["calls"], bad["flops_calls"], bad["set_aside"]) == (1, 0, 1) and np.isnan(bad["tflops"])
    fp32 = rows.loc[("gemm", "fp32")]  # the gemv (fp32 in its name) and the two unnamed fp32 products
    assert (fp32["calls"], fp32["flops_calls"]) == (3, 3)
    assert fp32["tflops"] == pytest.approx((F7 + F10 + F13) / 0.22e-3 / 1e12)
    # with the run's tf32 the unnamed ones move to the TF32 row, the named gemv stays fp32
    tf = kernel_classes(events, H100, tf32=True).set_index(["kernel_class", "dtype"])
    assert tf.loc[("gemm", "fp32"), "calls"] == 1 and tf.loc[("gemm", "tf32"), "calls"] == 3
    # the elementwise, reduction and memory rows have no rate
    assert rows.loc[("elementwise", ""), ["tflops", "eff_pct"]].isna().all()


@pytest.mark.parametrize("q,k,v,causal,backward,want", [
    ([2, 8, 1024, 64], [2, 8, 1024, 64], None, False, False, 4 * 2 * 8 * 1024 * 1024 * 64),
    ([2, 8, 1024, 64], [2, 8, 1024, 64], None, True, False, 2 * 2 * 8 * 1024 * 1024 * 64),
    ([2, 8, 1024, 64], [2, 8, 1024, 64], None, False, True, 2.5 * 4 * 2 * 8 * 1024 * 1024 * 64),
    ([1, 4, 10, 64], [1, 4, 77, 64], [1, 4, 77, 128], False, False, 2 * 4 * 10 * 77 * (64 + 128)),  # cross, Dv
    ([1, 4, 10, 64], [1, 4, 77, 32], None, False, False, None),  # head sizes differ
    ([4, 10, 64], [4, 10, 64], None, False, False, None),  # not 4-D
])
def test_attention_flops(q, k, v, causal, backward, want) -> None:
    got = attention_flops(q, k, v, causal=causal, backward=backward)
    assert (math.isnan(got) if want is None else got == want)


@pytest.mark.parametrize("x,w,y,want", [
    ([8, 64, 56, 56], [128, 64, 3, 3], [8, 128, 28, 28], 2 * 128 * 64 * 9 * 8 * 28 * 28),
    ([8, 64, 56, 56], [64, 1, 3, 3], [8, 64, 56, 56], 2 * 64 * 1 * 9 * 8 * 56 * 56),  # depthwise: groups 64
    ([8, 128, 28, 28], [128, 64, 2, 2], [8, 64, 56, 56], 2 * 128 * 64 * 4 * 8 * 28 * 28),  # transposed
    ([8, 64, 56, 56], [128, 64, 3, 3], None, None),  # the output's size unknown
])
def test_conv_flops(x, w, y, want) -> None:
    got = conv_flops(x, w, y)
    assert (math.isnan(got) if want is None else got == want)


def test_forward_convolution_needs_its_output_and_matrix_vector_products() -> None:
    dims = [[8, 64, 56, 56], [128, 64, 3, 3], [], [], [], [], [], [], []]
    assert math.isnan(op_flops("aten::cudnn_convolution", dims))  # stride and padding are not scanned
    out = {((8, 64, 56, 56), (128, 64, 3, 3)): [8, 128, 28, 28]}
    assert op_flops("aten::cudnn_convolution", dims, out) == 2 * 128 * 64 * 9 * 8 * 28 * 28
    assert op_flops("aten::cudnn_convolution_backward_input", [[], [8, 128, 28, 28], [128, 64, 3, 3]]) == \
        2 * 128 * 64 * 9 * 8 * 28 * 28
    assert matmul_flops("aten::mv", [[300, 200], [200]]) == 2 * 300 * 200
    assert matmul_flops("aten::addmv", [[300], [300, 200], [200], [], []]) == 2 * 300 * 200
    assert math.isnan(matmul_flops("aten::mv", [[300, 200], [300]]))
    assert matmul_flops("aten::_scaled_mm", [[64, 128], [128, 32], [], []]) == 2 * 64 * 128 * 32


def test_tf32_is_what_the_run_records() -> None:
    assert run_tf32({"config": {"tf32": True}}) and not run_tf32({"config": {"tf32": False}})
    assert not run_tf32({"config": {}}) and not run_tf32(None) and not run_tf32({"config": None})


#: The device names torch.profiler writes into deviceProperties: those of ../shared's traces
#: (extracted by test_every_shared_device_name_is_listed_here) and the parts peaks.csv lists,
#: spelt as nvidia-smi/rocm-smi name them -> the peaks.csv row they must match ("" none).
DEVICE_NAMES = {
    "NVIDIA H200": "H200 SXM", "NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA A100-SXM4-80GB": "A100",
    "NVIDIA A100-PG509-200": "A100", "NVIDIA B200": "B200", "AMD Instinct MI300X": "MI300X",
    "Tesla V100-DGXS-32GB": "", "NVIDIA H100 PCIe": "H100 PCIe", "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200 NVL": "H200 NVL", "NVIDIA H800": "H800 SXM", "NVIDIA H800 PCIe": "",
    "NVIDIA A100-SXM4-40GB": "A100", "NVIDIA A100-PCIE-40GB": "A100", "NVIDIA A100 80GB PCIe": "A100",
    "NVIDIA GB200": "GB200", "AMD Instinct MI325X": "MI325X", "NVIDIA GH200 480GB": "",
    "NVIDIA GeForce RTX 4090": "",
}


@pytest.mark.parametrize("name", sorted(DEVICE_NAMES))
def test_peak_table_matches_real_device_names(name) -> None:
    assert peak_device(name) == DEVICE_NAMES[name]
    if DEVICE_NAMES[name]:
        assert peak_tflops(name, "bf16") > 0
    assert peak_tflops("NVIDIA GB200", "bf16") == 2500 and peak_tflops("NVIDIA B200", "bf16") == 2250


def _shared_device_names() -> set[str]:
    names = set()
    for p in sorted(SHARED.rglob("*.json.gz")):
        meta, _ = read_trace_meta(p, columns=frozenset())
        props = meta.get("deviceProperties") or []
        names |= {str(d["name"]) for d in props if isinstance(d, dict) and d.get("name")}
    return names


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared (real traces) is not beside the checkout")
def test_every_shared_device_name_is_listed_here() -> None:
    names = _shared_device_names()
    assert names and names <= set(DEVICE_NAMES), names - set(DEVICE_NAMES)


GLOO_CUDA = SHARED / "gpu" / "traces" / "h200_ddp_gloo_cuda_2r"


@pytest.mark.skipif(not GLOO_CUDA.is_dir(), reason=f"{GLOO_CUDA} is absent (the GPU traces are not in a fresh clone)")
def test_a_gpu_idle_88_percent_has_a_step_mfu_far_below_its_gemm_efficiency(capsys) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["gpu", str(GLOO_CUDA), "--csv"]) == 0
    df = pd.read_csv(io.StringIO(out.getvalue()))
    assert set(EFFICIENCY_COLUMNS) <= set(df.columns)
    r0 = df[df["rank"] == 0].iloc[0]
    assert r0["idle_pct"] == pytest.approx(87.77, abs=0.01)  # the ledger is unchanged (../shared/gpu/README.md)
    # fp32 GEMMs of 8 Linear(2048): ~49 % of the fp32 peak while they run, ~2.3 % of the GPU's time
    assert 45 < r0["gemm_eff_pct"] < 55 and 1.5 < r0["step_mfu_pct"] < 3.5
    assert r0["step_mfu_pct"] < r0["gemm_eff_pct"] / 10
    assert r0["flops_coverage_pct"] > 80 and r0["set_aside_events"] == 0 and r0["flops_set_aside"] == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["gpu", str(GLOO_CUDA), "--kernels", "--csv"]) == 0
    k = pd.read_csv(io.StringIO(out.getvalue()))
    assert list(k.columns) == ["job_id", *KERNEL_CSV_COLUMNS]
    gemm = k[(k["rank"] == 0) & (k["kernel_class"] == "gemm")].iloc[0]
    assert gemm["flops_calls"] == gemm["calls"] == 90 and gemm["eff_pct"] == pytest.approx(r0["gemm_eff_pct"])


MI300X_SD = SHARED / "traces" / "tl_mi300x_xdit_sd35_1r"
RESNET = SHARED / "traces" / "kineto_resnet50_1gpu"


@pytest.mark.skipif(not MI300X_SD.is_dir(), reason=f"{MI300X_SD} is absent (a fresh clone)")
def test_attention_is_counted_on_a_real_mi300x_trace() -> None:
    meta, events = read_trace_meta(next(MI300X_SD.glob("*.json.gz")))
    rows = kernel_classes(events, "AMD Instinct MI300X").set_index(["kernel_class", "dtype"])
    att = rows.loc[("attention", "bf16")]
    assert att["flops_calls"] > 0.9 * att["calls"] and 0 < att["eff_pct"] <= 100
    led, _ = gpu_ledger(events, device="AMD Instinct MI300X")
    eff = rank_efficiency(led.assign(job_id="sd35")).iloc[0]
    assert eff["flops_coverage_pct"] > 60 and 0 < eff["step_mfu_pct"] < eff["gemm_eff_pct"]


@pytest.mark.skipif(not RESNET.is_dir(), reason=f"{RESNET} is absent (a fresh clone)")
def test_convolutions_are_counted_on_a_real_resnet_trace() -> None:
    """ResNet-50 training (fp32, 2021): the forward convolutions' outputs come from their backward."""
    _, events = read_trace_meta(next(RESNET.glob("*.json.gz")))
    k = events[(events["stream"] >= 0) & events["flops"].notna()]
    names = k["name"].astype(str)
    assert names.str.contains("convolve|implicit|wgrad|dgrad|fprop", case=False).sum() > 100


@pytest.mark.parametrize("tf32", [False, True])
def test_a_run_that_records_tf32_rates_its_unnamed_fp32_gemms_as_tf32(tmp_path, tf32) -> None:
    """The made trace imported as a run, its run.json's config.tf32 set: `gpu RUN --csv` and
    summarize give the hand-computed step MFU of that rating (the CLI reads the run's flag)."""
    import json
    import shutil

    from dpcore.read.importer.write_run import import_traces

    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(TRACE, src / "rank0.json.gz")
    run = import_traces(src, tmp_path / "profiles", "flops").run_dir
    meta = json.loads((run / "run.json").read_text())
    meta.setdefault("config", {})["tf32"] = tf32
    (run / "run.json").write_text(json.dumps(meta))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["gpu", str(run), "--csv"]) == 0
    df = pd.read_csv(io.StringIO(out.getvalue()))
    row = df[df["window"] == "trace"].iloc[0]
    assert row["step_mfu_pct"] == pytest.approx(100 * ideal_us(tf32) / SPAN_US, abs=1e-4)  # the CSV keeps 4 decimals
    assert row["gemm_eff_pct"] == pytest.approx(100 * gemm_ideal_us(tf32) / GEMM_US, abs=1e-4)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["summarize", str(run), "--csv"]) == 0
    job = pd.read_csv(io.StringIO(out.getvalue())).iloc[0]
    assert job["gpu_step_mfu_pct"] == pytest.approx(100 * ideal_us(tf32) / SPAN_US, abs=1e-4)
    assert job["flops_coverage_pct"] == pytest.approx(100 * 3020 / 4140, abs=1e-4)


def test_kernel_figure_hover_says_which_calls_the_rate_covers(events) -> None:
    from dpcore.read.plots.gpu import kernel_figure

    fig = kernel_figure(kernel_classes(events, H100))
    hover = {str(y): str(c[2]) for y, c in zip(fig.data[0].y, fig.data[0].customdata)}
    rate = (F1 + F2) / 1.5e-3 / 1e12
    assert hover["attention (bf16)"].startswith(f"; {rate:.2f} TFLOP/s over 2 of its calls (")
    assert hover["elementwise"] == ""  # no FLOPs: no rate


def test_no_mfu_says_why(events) -> None:
    """FLOPs known on a GPU peaks.csv does not list: the FLOPs, and no MFU; no shapes: say so."""
    v100, _ = gpu_ledger(events, device="Tesla V100-DGXS-32GB")
    eff = rank_efficiency(v100.assign(job_id="j")).iloc[0]
    assert np.isnan(eff["step_mfu_pct"]) and np.isnan(eff["gemm_eff_pct"]) and eff["flops_coverage_pct"] == 0
    model = (F1 + F2 + 3 * F3 + F6 + F7 + F9 + F10 + F13) / 1e12
    assert efficiency_text(eff) == (f"{model:.3g} TFLOP of model FLOPs per window, but no MFU: the GPU (or these "
                                    "dtypes) is not in peaks.csv")
    plain, _ = gpu_ledger(read_trace(ROOT / "tests" / "data" / "gpu_ledger_rank0.json.gz"), device=H100)
    assert efficiency_text(rank_efficiency(plain.assign(job_id="j")).iloc[0]).startswith(
        "no FLOPs: the trace records no shapes")
