"""GPU time by kernel class, with each class's FLOPs, achieved TFLOP/s and efficiency, and fp32
matrix products on a GPU that has tensor cores.

Why: after "is my GPU idle?" (:mod:`dpcore.read.analysis.gpu_time`) the next question is what the
busy time is spent on. Kernel names say it (:func:`~dpcore.read.analysis.gpu_flops.kernel_class`):
cuBLAS/CUTLASS GEMMs (``*gemm*``, ``nvjet_*``, rocBLAS ``Cijk_*``), flash/fused attention,
cuDNN/MIOpen convolutions, PyTorch's elementwise and reduction templates, Triton's
``triton_poi_*`` (pointwise) and ``triton_red_*``/``triton_per_*`` (reductions); a communication
or memory event is the trace's own kind (:mod:`dpcore.read.traces.kinds`). The kernel's data type
is in its name where the library writes it (``bf16``, ``f16``, ``tf32``, ``fp8``/``e4m3``,
``f32``/``sgemm``/``ffma``; CUTLASS's ``tensorop_s1688`` is TF32), else its op's inputs'; an fp32
GEMM on a GPU with tensor cores leaves them idle (TF32 or bf16 would use them), which is worth
one line.

Achieved TFLOP/s and efficiency of a row (a class and dtype; the math classes only, gemm, attention
and convolution): over the row's calls whose FLOPs are known (``flops_calls`` of ``calls``: the
calls launched under an op with recorded shapes, :mod:`dpcore.read.traces.matmuls`), tflops = Σ
FLOPs / Σ their kernel time, eff_pct = tflops / the device's dense peak for the dtype (peaks.csv;
unnamed fp32 GEMMs rated as TF32 where the run records tf32). The rank table (:data:`KERNELS_TABLE`,
cached) holds the counts; :func:`kernel_rows` rates them, so a peak's change needs no re-read.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dpcore.read.analysis.gpu_flops import (
    KERNEL_CLASSES,
    PEAKS_CSV,
    RATED_CLASSES,
    event_flops,
    gemm_dtype,
    kernel_class,
    peak_tflops,
    table_version,
)
from dpcore.read.analysis.gpu_time import GPU_CATS, device_name
from dpcore.read.traces.rank_table import RankTable

__all__ = ["KERNEL_CLASSES", "PEAKS_CSV", "gemm_dtype", "kernel_class", "peak_tflops"]

#: Per (rank, class, dtype, named): what the lazy ``gpu_kernels`` rank table holds (named: the
#: kernel's name states the dtype; device: the GPU's name; flops, flops_ms, flops_calls: the FLOPs,
#: kernel time and calls of the calls whose FLOPs are known; set_aside: calls whose FLOPs would
#: exceed the device's peak, dropped).
KERNEL_COLUMNS = ["rank", "kernel_class", "dtype", "named", "calls", "total_ms", "device", "flops", "flops_ms",
                  "flops_calls", "set_aside"]
#: :func:`kernel_rows`' columns (with job_id first where its input has one): per (rank, class,
#: dtype), share of the rank's GPU event time, TFLOP/s and efficiency (NaN where unknown).
KERNEL_ROW_COLUMNS = ["rank", "kernel_class", "dtype", "calls", "total_ms", "share_pct", "device", "flops",
                      "flops_ms", "flops_calls", "set_aside", "tflops", "eff_pct"]
#: `gpu --kernels --csv`'s columns after job_id (docs/DESIGN.md); tflops and eff_pct NaN where unknown.
KERNEL_CSV_COLUMNS = ["rank", "kernel_class", "calls", "total_ms", "share_pct", "dtype", "flops_calls", "tflops",
                      "eff_pct", "set_aside"]
#: GPUs with tensor cores (Volta and later, CDNA): an fp32 GEMM there leaves them unused.
TENSOR_CORE_GPU = re.compile(r"V100|T4|A100|A10|A30|A40|A800|H100|H200|H800|H20|GH200|B100|B200|GB200|L4|L40|"
                             r"RTX|MI100|MI2\d\d|MI3\d\d", re.I)


def kernel_counts(events: pd.DataFrame, device: str = "") -> pd.DataFrame:
    """Per (rank, class, dtype, named) of an events frame's GPU events (KERNEL_COLUMNS): calls,
    total time (sum of durations, ms), and the FLOPs, time and calls of those whose FLOPs are known
    (:func:`~dpcore.read.analysis.gpu_flops.event_flops`) on the GPU named ``device``. Events
    with a negative duration are left out (the ledger counts them)."""
    dev = (events["stream"].to_numpy() >= 0) & events["category"].isin(GPU_CATS).to_numpy()
    dev &= events["dur"].to_numpy(np.float64) >= 0
    g = events[dev]
    if g.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    f = event_flops(g, device)
    dur = g["dur"].to_numpy(np.float64) / 1e3
    known = ~np.isnan(f.flops)
    df = pd.DataFrame({"rank": g["rank"].to_numpy(), "kernel_class": f.cls, "dtype": f.dtype, "named": f.named,
                       "dur": dur, "flops": np.where(known, f.flops, 0.0), "flops_ms": np.where(known, dur, 0.0),
                       "flops_calls": known.astype(np.int64), "set_aside": f.set_aside.astype(np.int64)})
    out = df.groupby(["rank", "kernel_class", "dtype", "named"], as_index=False).agg(
        calls=("dur", "size"), total_ms=("dur", "sum"), flops=("flops", "sum"), flops_ms=("flops_ms", "sum"),
        flops_calls=("flops_calls", "sum"), set_aside=("set_aside", "sum"))
    out["device"] = device
    return out[KERNEL_COLUMNS]


def kernel_rows(counts: pd.DataFrame, tf32: bool = False) -> pd.DataFrame:
    """The rated rows (KERNEL_ROW_COLUMNS, job_id first where ``counts`` has it) of
    :func:`kernel_counts`' rows: per (rank, class, dtype), unnamed fp32 rows rated as TF32 where
    ``tf32``; share_pct of the rank's GPU event time; for the math classes (RATED_CLASSES) with
    known FLOPs, tflops = flops / flops_ms and eff_pct = tflops / the peak for the dtype. Largest
    first per rank."""
    lead = ["job_id"] if "job_id" in counts else []
    if counts.empty:
        return pd.DataFrame(columns=[*lead, *KERNEL_ROW_COLUMNS])
    c = counts.copy()
    if tf32:
        c.loc[(c["dtype"] == "fp32") & ~c["named"].astype(bool), "dtype"] = "tf32"
    keys = [*lead, "rank", "kernel_class", "dtype"]
    out = c.groupby(keys, as_index=False, sort=False).agg(
        calls=("calls", "sum"), total_ms=("total_ms", "sum"), device=("device", "first"), flops=("flops", "sum"),
        flops_ms=("flops_ms", "sum"), flops_calls=("flops_calls", "sum"), set_aside=("set_aside", "sum"))
    out["share_pct"] = 100 * out["total_ms"] / out.groupby([*lead, "rank"])["total_ms"].transform("sum")
    rated = out["kernel_class"].isin(RATED_CLASSES) & (out["flops_calls"] > 0)
    out.loc[~rated, ["flops", "flops_ms"]] = np.nan
    out["tflops"] = out["flops"] / out["flops_ms"].where(out["flops_ms"] > 0) / 1e9  # FLOPs / ms / 1e9 = TFLOP/s
    peak = np.asarray([peak_tflops(str(d), str(t)) for d, t in zip(out["device"], out["dtype"])], np.float64)
    out["eff_pct"] = 100 * out["tflops"] / peak
    out = out.sort_values([*lead, "rank", "total_ms"], ascending=[True] * (len(lead) + 1) + [False], kind="stable")
    return out[[*lead, *KERNEL_ROW_COLUMNS]].reset_index(drop=True)


def kernel_classes(events: pd.DataFrame, device: str = "", tf32: bool = False) -> pd.DataFrame:
    """Per (rank, class, dtype) of an events frame's GPU events: :func:`kernel_rows` of
    :func:`kernel_counts` (calls, time, share, FLOPs, TFLOP/s, efficiency). ``device``: the GPU's
    name (deviceProperties)."""
    return kernel_rows(kernel_counts(events, device), tf32)


def fp32_matmul_note(kernels: pd.DataFrame) -> str:
    """One line where fp32 GEMMs run on a GPU with tensor cores (rows of one rank's
    :func:`kernel_classes`), else ""."""
    fp32 = kernels[(kernels["kernel_class"] == "gemm") & (kernels["dtype"] == "fp32")]
    device = str(kernels["device"].iloc[0]) if len(kernels) else ""
    if fp32.empty or not TENSOR_CORE_GPU.search(device):
        return ""
    return (f"fp32 matrix products: {fp32['total_ms'].sum():.3g} ms ({fp32['share_pct'].sum():.0f} % of GPU time) "
            f"on an {device}, whose tensor cores they leave unused: torch.set_float32_matmul_precision('high') "
            "(TF32) or bf16 autocast runs them there.")


def kernel_table(events: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """:data:`KERNELS_TABLE`'s reduction: :func:`kernel_counts` of one rank, on the device its
    metadata names."""
    return kernel_counts(events, device_name(meta, events))


#: The per-rank GPU time by kernel class (empty for a CPU trace).
KERNELS_TABLE = RankTable("gpu_kernels", {c: (object if c in ("kernel_class", "dtype", "device") else bool
                                              if c == "named" else np.int64
                                              if c in ("rank", "calls", "flops_calls", "set_aside") else np.float64)
                                          for c in KERNEL_COLUMNS}, kernel_table, version=table_version(4))
