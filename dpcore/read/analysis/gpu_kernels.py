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

Not here: achieved TFLOP/s and MFU. They need each matrix product's shapes (the launching op's
``Input Dims``, recorded with ``record_shapes=True``), which the trace reader does not keep; the
columns stay empty.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dpcore.read.analysis.gpu_time import GPU_CATS

KERNEL_CLASSES = ("gemm", "attention", "elementwise", "reduction", "communication", "memory", "other")
#: Per (rank, class, dtype): what the lazy ``gpu_kernels`` rank table holds (device: the GPU's name).
KERNEL_COLUMNS = ["rank", "kernel_class", "dtype", "calls", "total_ms", "share_pct", "device"]
#: `gpu --kernels --csv`'s columns after job_id (docs/DESIGN.md); tflops and mfu_pct stay empty.
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
    GEMM and attention kernels ("" unknown). ``device``: the GPU's name (deviceProperties)."""
    dev = (events["stream"].to_numpy() >= 0) & events["category"].isin(GPU_CATS).to_numpy()
    g = events[dev]
    if g.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    pairs = g[["name", "kind"]].astype(str).drop_duplicates()
    cls = {(n, k): kernel_class(n, k) for n, k in zip(pairs["name"], pairs["kind"])}
    names, kinds = g["name"].astype(str).to_numpy(), g["kind"].astype(str).to_numpy()
    c = np.asarray([cls[(n, k)] for n, k in zip(names, kinds)], dtype=object)
    dt = np.asarray([gemm_dtype(n) if k in ("gemm", "attention") else "" for n, k in zip(names, c)], dtype=object)
    df = pd.DataFrame({"rank": g["rank"].to_numpy(), "kernel_class": c, "dtype": dt,
                       "dur": g["dur"].to_numpy(np.float64) / 1e3})
    out = df.groupby(["rank", "kernel_class", "dtype"], as_index=False).agg(calls=("dur", "size"),
                                                                           total_ms=("dur", "sum"))
    out["share_pct"] = 100 * out["total_ms"] / out.groupby("rank")["total_ms"].transform("sum")
    out["device"] = device
    return out.sort_values(["rank", "total_ms"], ascending=[True, False])[KERNEL_COLUMNS].reset_index(drop=True)


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
