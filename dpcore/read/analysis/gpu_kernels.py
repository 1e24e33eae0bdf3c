"""GPU time by kernel class, and fp32 matrix products on a GPU that has tensor cores.

Why: after "is my GPU idle?" (:mod:`dpcore.read.analysis.gpu_time`) the next question is what the
busy time is spent on. Kernel names say it: cuBLAS/CUTLASS GEMMs (``*gemm*``, ``nvjet_*``,
rocBLAS ``Cijk_*``), flash/fused attention, PyTorch's elementwise and reduction templates,
Triton's ``triton_poi_*`` (pointwise) and ``triton_red_*``/``triton_per_*`` (reductions); a
communication or memory event is the trace's own kind (:mod:`dpcore.read.traces.kinds`). The
GEMM's data type is in its name where the library writes it (``bf16``, ``f16``, ``tf32``,
``fp8``/``e4m3``, ``f32``/``sgemm``/``ffma``; CUTLASS's ``tensorop_s1688`` is TF32); an fp32
GEMM on a GPU with tensor cores leaves them idle (TF32 or bf16 would use them), which is worth
one line.

Achieved TFLOP/s and MFU: for the kernels of matrix products whose shapes the trace records
(:mod:`dpcore.read.traces.matmuls`: the events' ``flops`` and ``mm_dtype``), tflops = Σ FLOPs /
Σ their kernel time, and mfu_pct = tflops / the device's dense peak for the dtype (``peaks.csv``:
one row per GPU and dtype, each with its datasheet source; no sparsity; the device matched from
the trace's deviceProperties name; CPU traces and unlisted GPUs get none). A GEMM's dtype is the
one its kernel name states, else its inputs' (``Input type``): a TF32 kernel on fp32 inputs is
measured against the TF32 peak, but a kernel whose name states no dtype (cuBLAS's ``nvjet_*``) on
fp32 inputs is measured against the fp32 peak even where TF32 was allowed, so its MFU can then
read above 100 %: a sign that the tensor cores ran it.
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.read.analysis.gpu_time import GPU_CATS, codes
from dpcore.read.traces.rank_table import RankTable

KERNEL_CLASSES = ("gemm", "attention", "elementwise", "reduction", "communication", "memory", "other")
#: Per (rank, class, dtype): what the lazy ``gpu_kernels`` rank table holds (device: the GPU's name;
#: flops and flops_ms: the FLOPs and kernel time of the calls whose shapes are known, tflops =
#: flops / flops_ms, mfu_pct against the device's dense peak: NaN where unknown).
KERNEL_COLUMNS = ["rank", "kernel_class", "dtype", "calls", "total_ms", "share_pct", "device",
                  "flops", "flops_ms", "tflops", "mfu_pct"]
PEAKS_CSV = Path(__file__).with_name("peaks.csv")
#: `gpu --kernels --csv`'s columns after job_id (docs/DESIGN.md); tflops and mfu_pct NaN where unknown.
KERNEL_CSV_COLUMNS = ["rank", "kernel_class", "calls", "total_ms", "share_pct", "dtype", "tflops", "mfu_pct"]
_CLASS_RE = (("attention", re.compile(r"flash|fmha|attention|attn|sdpa", re.I)),
             ("gemm", re.compile(r"gemm|gemv|cutlass|cublas|xmma|nvjet|wgmma|matmul|Cijk_|^bmm_", re.I)),
             ("reduction", re.compile(r"reduce|softmax|norm|triton_red|triton_per|welford|argm|nll_loss|"
                                      r"cross_entropy|cumsum|scan|GammaBeta", re.I)),
             ("elementwise", re.compile(r"elementwise|vectorized|unrolled|triton_poi|pointwise|fill|copy|"
                                        r"index|cat_|where|multi_tensor_apply|foreach|rotary|quant", re.I)))
_DTYPE_RE = (("bf16", re.compile(r"bf16|bfloat16", re.I)),
             ("fp8", re.compile(r"fp8|e4m3|e5m2", re.I)),
             ("fp16", re.compile(r"(?<![b])f16|fp16|half|hgemm|h1688|h884|h16816", re.I)),
             ("tf32", re.compile(r"tf32|tensorop_s|s1688", re.I)),
             ("fp32", re.compile(r"f32|fp32|sgemm|ffma|float", re.I)))
#: GPUs with tensor cores (Volta and later, CDNA): an fp32 GEMM there leaves them unused.
TENSOR_CORE_GPU = re.compile(r"V100|T4|A100|A10|A30|A40|A800|H100|H200|H800|H20|GH200|B100|B200|GB200|L4|L40|"
                             r"RTX|MI100|MI2\d\d|MI3\d\d", re.I)


def kernel_class(name: str, kind: str) -> str:
    """The class of one GPU event from its name and the trace's kind (comm, memcpy, ...)."""
    if kind == "comm":
        return "communication"
    if kind == "memcpy":
        return "memory"
    for cls, pattern in _CLASS_RE:
        if pattern.search(name):
            return cls
    return "other"


def gemm_dtype(name: str) -> str:
    """The data type a GEMM/attention kernel's name states, "" where it states none."""
    for dtype, pattern in _DTYPE_RE:
        if pattern.search(name):
            return dtype
    return ""


def kernel_classes(events: pd.DataFrame, device: str = "") -> pd.DataFrame:
    """Per (rank, class, dtype) of an events frame's GPU events (KERNEL_COLUMNS): calls, total
    time (sum of durations, ms) and its share of all GPU event time of the rank; dtype only for
    GEMM and attention kernels ("" unknown); FLOPs, TFLOP/s and MFU of the GEMMs with known
    shapes (module docstring). ``device``: the GPU's name (deviceProperties)."""
    dev = (events["stream"].to_numpy() >= 0) & events["category"].isin(GPU_CATS).to_numpy()
    g = events[dev]
    if g.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    name, names = codes(g["name"])
    kind, kinds = codes(g["kind"])
    pair = name * (len(kinds) + 1) + kind  # each distinct (name, kind) classified once
    uniq, inv = np.unique(pair, return_inverse=True)
    c = [kernel_class(str(names[u // (len(kinds) + 1)]), str(kinds[u % (len(kinds) + 1)])) for u in uniq]
    dt = [gemm_dtype(str(names[u // (len(kinds) + 1)])) if k in ("gemm", "attention") else "" for u, k in zip(uniq, c)]
    dtype, cls = np.asarray(dt, dtype=object)[inv], np.asarray(c, dtype=object)[inv]
    flops = g["flops"].to_numpy(np.float64) if "flops" in g else np.full(len(g), np.nan)
    flops = np.where(cls == "gemm", flops, np.nan)  # a split-K reduction's share is not a GEMM's rate
    if "mm_dtype" in g:  # the inputs' dtype where the kernel's name states none
        mm = g["mm_dtype"].astype(object).to_numpy()
        dtype = np.where((dtype == "") & ~np.isnan(flops), mm, dtype)
    dur = g["dur"].to_numpy(np.float64) / 1e3
    known = ~np.isnan(flops)
    df = pd.DataFrame({"rank": g["rank"].to_numpy(), "kernel_class": cls,
                       "dtype": dtype, "dur": dur, "flops": np.where(known, flops, 0.0),
                       "flops_ms": np.where(known, dur, 0.0), "known": known})
    out = df.groupby(["rank", "kernel_class", "dtype"], as_index=False).agg(
        calls=("dur", "size"), total_ms=("dur", "sum"), flops=("flops", "sum"), flops_ms=("flops_ms", "sum"),
        known=("known", "any"))
    out["share_pct"] = 100 * out["total_ms"] / out.groupby("rank")["total_ms"].transform("sum")
    out["device"] = device
    out.loc[~out["known"], ["flops", "flops_ms"]] = np.nan
    out["tflops"] = out["flops"] / out["flops_ms"].where(out["flops_ms"] > 0) / 1e9  # FLOPs / ms / 1e9 = TFLOP/s
    peak = np.asarray([peak_tflops(device, str(d)) for d in out["dtype"]], np.float64)
    out["mfu_pct"] = 100 * out["tflops"] / peak
    return out.sort_values(["rank", "total_ms"], ascending=[True, False])[KERNEL_COLUMNS].reset_index(drop=True)


@cache
def _peaks(path: Path = PEAKS_CSV) -> pd.DataFrame:
    return pd.read_csv(path)


def peak_tflops(device: str, dtype: str) -> float:
    """The dense peak TFLOP/s of the GPU named ``device`` (deviceProperties) for ``dtype``, from
    ``peaks.csv`` (the first row whose name pattern the name matches); NaN where none."""
    if not device or not dtype:
        return float("nan")
    peaks = _peaks()
    for row in peaks[peaks["dtype"] == dtype].itertuples():
        if re.search(str(row.name_pattern), device):
            return float(row.tflops)
    return float("nan")


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


def device_name(meta: dict | None, events: pd.DataFrame) -> str:
    """The name (deviceProperties) of the device that ran the most GPU events of a trace; the
    first device's name where the ids do not match, "" where the trace names none."""
    props = (meta or {}).get("deviceProperties")
    named = {str(p.get("id")): str(p["name"]) for p in props if isinstance(p, dict) and p.get("name")} \
        if isinstance(props, list) else {}
    if not named:
        return ""
    dev = (events["stream"].to_numpy() >= 0) & events["category"].isin(GPU_CATS).to_numpy()
    pids = events.loc[dev, "pid"].astype(str).value_counts()
    return named.get(pids.index[0], next(iter(named.values()))) if len(pids) else next(iter(named.values()))


def kernel_table(events: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """:data:`KERNELS_TABLE`'s reduction: :func:`kernel_classes` of one rank, on the device its
    metadata names."""
    return kernel_classes(events, device_name(meta, events))


#: The per-rank GPU time by kernel class (empty for a CPU trace).
KERNELS_TABLE = RankTable("gpu_kernels", {c: (object if c in ("kernel_class", "dtype", "device")
                                              else np.int64 if c in ("rank", "calls") else np.float64)
                                          for c in KERNEL_COLUMNS}, kernel_table)
