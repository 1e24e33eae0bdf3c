"""The FLOPs of a GPU's kernels, the device's peak for each data type, and the two efficiency
numbers made from them: GEMM efficiency and step MFU.

Why two numbers, each named for what it is: dividing the GEMMs' FLOPs by the GEMM kernels' own time
says how well the matrix kernels ran (**GEMM efficiency**), not how well the step used the GPU: a
GPU idle 88 % of the trace can read 50 % there. **Step MFU** (model FLOPs utilization) divides
the step's model FLOPs by what the device could do in the step's time. Definitions:

* FLOPs: an op's, from its recorded shapes (:mod:`dpcore.read.traces.matmuls`: matrix and
  matrix-vector products, fp8's ``_scaled_mm``, attention forward and backward, convolutions),
  shared among the kernels it launched. A call whose rate would exceed the device's dense peak for
  its dtype (the TF32 peak for an fp32 GEMM whose kernel name states no dtype; 20 PFLOP/s where
  the device or dtype is not in the table) cannot be true: its FLOPs are set aside (dropped) and
  counted (``flops_set_aside``).
* dtype: as the kernel's name states it, else the op's inputs'. An fp32 GEMM whose name states no
  dtype (cuBLAS's ``nvjet_*``) is rated as TF32 where the run records ``tf32`` (run.json's config:
  ``torch.backends.cuda.matmul.allow_tf32``), else as fp32. Any fp32 call that ran faster than the
  fp32 peak ran on the tensor cores (only they can; cuBLAS names a TF32 GEMM's split-K reduction for
  its fp32 accumulator): its dtype is then ``tf32``.
* ideal time of a call = its FLOPs / the device's dense peak for its dtype (``peaks.csv``, one row
  per GPU and dtype with its datasheet source; no sparsity).
* GEMM efficiency = Σ ideal time / Σ kernel time over the GEMM kernels with FLOPs (for one dtype:
  achieved TFLOP/s / peak).
* step MFU = Σ ideal time of every kernel of the window / the window's span (the GPU time ledger's
  window: a traced step's first GPU event start to last end); over a job, the steps pooled. For one
  dtype: the step's FLOPs / (step time × peak).
* FLOPs coverage = the share of the window's compute-kernel time (kernels that are not
  communication, copies or sets; Σ durations) whose calls have FLOPs with a rated dtype: what the
  MFU and the efficiency stand on. A low coverage means MFU undercounts (elementwise work, norms,
  unrecorded shapes, forward convolutions without their backward in the trace).
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.read.traces.matmuls import MATH_CLASSES, NAME_CLASSES, name_class

PEAKS_CSV = Path(__file__).with_name("peaks.csv")


def table_version(base: int) -> int:
    """A rank table's version (:class:`~dpcore.read.traces.rank_table.RankTable`) whose reduction
    reads the peaks (ideal times, the set-aside bound) and the kernel classes by name: ``base`` and
    the checksum of peaks.csv and of :data:`~dpcore.read.traces.matmuls.NAME_CLASSES`' patterns, so
    an edit of either misses the cached entries made with the old one."""
    names = "\n".join(f"{cls}={p.pattern}/{p.flags}" for cls, p in NAME_CLASSES).encode()
    return base * 100_000 + zlib.crc32(PEAKS_CSV.read_bytes() + names) % 100_000

#: Above every dense peak a GPU has (B200/GB200 fp8: 4,500-5,000 TFLOP/s): the bound of a call's
#: rate where the device or its dtype is not in the table.
MAX_TFLOPS = 20_000.0
KERNEL_CLASSES = ("gemm", "attention", "convolution", "elementwise", "reduction", "communication", "memory",
                  "other")
#: The kernel classes whose rows carry a TFLOP/s and an efficiency (the math kernels); FLOPs that an
#: op shares with its other kernels (a transpose around a convolution) count in step MFU only.
RATED_CLASSES = MATH_CLASSES
_DTYPE_RE = (("fp8", re.compile(r"fp8|e4m3|e5m2", re.I)),  # first: an fp8 GEMM's name also states its bf16 output
             ("bf16", re.compile(r"bf16|bfloat16", re.I)),
             ("fp16", re.compile(r"(?<![b])f16|fp16|half|hgemm|h1688|h884|h16816", re.I)),
             ("tf32", re.compile(r"tf32|tensorop_s|s1688", re.I)),
             ("fp32", re.compile(r"f32|fp32|sgemm|ffma|float", re.I)))
#: The ledger's per-window FLOPs columns (gpu_time's LEDGER_COLUMNS end with them): set-aside
#: counts, compute-kernel time and its covered part, model TFLOP, ideal times under both ratings
#: of unnamed fp32 GEMMs (fp32, TF32), and the GEMM kernels' part of them.
FLOPS_COLUMNS = ["set_aside_events", "flops_set_aside", "kernel_ms", "flops_ms", "model_tflop", "ideal_ms",
                 "ideal_ms_tf32", "gemm_ms", "gemm_ideal_ms", "gemm_ideal_ms_tf32"]
#: What :func:`with_efficiency` adds to ledger rows (percent; NaN where no FLOPs or no peak).
EFFICIENCY_COLUMNS = ["step_mfu_pct", "gemm_eff_pct", "flops_coverage_pct"]


def kernel_class(name: str, kind: str) -> str:
    """The class of one GPU event from its name and the trace's kind (comm, memcpy, ...)."""
    if kind == "comm":
        return "communication"
    if kind == "memcpy":
        return "memory"
    return name_class(name)


def gemm_dtype(name: str) -> str:
    """The data type a GEMM/attention/convolution kernel's name states, "" where it states none."""
    for dtype, pattern in _DTYPE_RE:
        if pattern.search(name):
            return dtype
    return ""


@cache
def _peaks(path: Path = PEAKS_CSV) -> pd.DataFrame:
    return pd.read_csv(path)


@cache
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


def peak_device(device: str) -> str:
    """The peaks.csv row (its ``device`` column) that the GPU named ``device`` matches, "" none:
    the matching rule :func:`peak_tflops` applies, named, so a test can check it against the
    device names real traces carry."""
    if not device:
        return ""
    for row in _peaks().itertuples():
        if re.search(str(row.name_pattern), device):
            return str(row.device)
    return ""


def run_tf32(meta: dict | None) -> bool:
    """Whether a run records TF32 allowed for fp32 matrix products (run.json's ``config.tf32``)."""
    cfg = (meta or {}).get("config")
    return bool(cfg.get("tf32")) if isinstance(cfg, dict) else False


def codes(col: pd.Series) -> tuple[np.ndarray, list]:
    """(codes, categories) of a column (the events frame's text columns are categoricals: reading
    the codes is what keeps a 250k-event rank from building 250k Python strings)."""
    c = col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")
    return c.cat.codes.to_numpy(np.int64), list(c.cat.categories)


@dataclass
class EventFlops:
    """Per GPU event (:func:`event_flops`): class, dtype, whether the kernel's name states it,
    FLOPs (NaN unknown or set aside), whether they were set aside, the ideal µs under the fp32 and
    the TF32 rating of unnamed fp32 GEMMs (NaN where not rated)."""
    cls: np.ndarray
    dtype: np.ndarray
    named: np.ndarray
    flops: np.ndarray
    set_aside: np.ndarray
    ideal_us: np.ndarray
    ideal_us_tf32: np.ndarray


def event_flops(g: pd.DataFrame, device: str) -> EventFlops:
    """The FLOPs accounting of GPU events ``g`` (an events frame's device rows, durations >= 0) on
    the GPU named ``device`` (module docstring)."""
    n = len(g)
    name, names = codes(g["name"])
    kind, kinds = codes(g["kind"])
    pair = name * (len(kinds) + 1) + kind  # each distinct (name, kind) classified once
    uniq, inv = np.unique(pair, return_inverse=True)
    c = [kernel_class(str(names[u // (len(kinds) + 1)]), str(kinds[u % (len(kinds) + 1)])) for u in uniq]
    dt = [gemm_dtype(str(names[u // (len(kinds) + 1)])) if k in RATED_CLASSES else "" for u, k in zip(uniq, c)]
    cls = np.asarray(c, dtype=object)[inv] if n else np.empty(0, object)
    dtype = np.asarray(dt, dtype=object)[inv] if n else np.empty(0, object)
    named = dtype != ""
    flops = g["flops"].to_numpy(np.float64, copy=True) if "flops" in g else np.full(n, np.nan)
    flops[np.isin(cls, ("communication", "memory"))] = np.nan
    if "mm_dtype" in g:  # the inputs' dtype where the kernel's name states none
        mm = g["mm_dtype"].astype(object).to_numpy()
        dtype = np.where(~named & ~np.isnan(flops), mm, dtype)
    dtype = np.asarray(["" if d is None or d != d else str(d) for d in dtype], dtype=object) if n else dtype
    dur = g["dur"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = flops / dur / 1e6  # FLOPs per µs / 1e6 = TFLOP/s
    # an fp32 call faster than the fp32 peak ran on the tensor cores (a TF32 GEMM's split-K reduction is
    # named for its fp32 accumulator)
    dtype[(dtype == "fp32") & (rate > peak_tflops(device, "fp32"))] = "tf32"
    fp32_unnamed = (dtype == "fp32") & ~named
    peak = _peak_of(device, dtype)
    peak_tf32 = np.where(fp32_unnamed, peak_tflops(device, "tf32"), peak)
    bound = np.where(np.isnan(peak_tf32), MAX_TFLOPS, np.fmax(peak_tf32, peak))
    set_aside = ~np.isnan(flops) & (rate > bound)
    flops[set_aside] = np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        ideal = flops / peak / 1e6  # µs at peak
        ideal_tf32 = flops / peak_tf32 / 1e6
    return EventFlops(cls, dtype, named, flops, set_aside, ideal, ideal_tf32)


def _peak_of(device: str, dtype: np.ndarray) -> np.ndarray:
    table = {d: peak_tflops(device, str(d)) for d in set(dtype.tolist())}
    return np.asarray([table[d] for d in dtype.tolist()], np.float64) if dtype.size else np.empty(0)


def window_flops(f: EventFlops, sel: np.ndarray, dur: np.ndarray, ledger_cls: np.ndarray) -> dict:
    """The FLOPS_COLUMNS values (after set_aside_events) of one window's events ``sel``: ``dur``
    their µs, ``ledger_cls`` the ledger's class of each (compute, comm, memory)."""
    comp = sel & (ledger_cls == "compute")
    rated = comp & ~np.isnan(f.ideal_us)
    gemm = rated & (f.cls == "gemm")
    known = ~np.isnan(f.flops) & sel
    return {"flops_set_aside": int((f.set_aside & sel).sum()), "kernel_ms": float(dur[comp].sum()) / 1e3,
            "flops_ms": float(dur[rated].sum()) / 1e3, "model_tflop": float(f.flops[known].sum()) / 1e12,
            "ideal_ms": float(f.ideal_us[rated].sum()) / 1e3,
            "ideal_ms_tf32": float(np.nansum(f.ideal_us_tf32[rated])) / 1e3,
            "gemm_ms": float(dur[gemm].sum()) / 1e3, "gemm_ideal_ms": float(f.ideal_us[gemm].sum()) / 1e3,
            "gemm_ideal_ms_tf32": float(np.nansum(f.ideal_us_tf32[gemm])) / 1e3}


def _pct(num: pd.Series, den: pd.Series) -> pd.Series:
    num, den = num.astype(float), den.astype(float)
    return (100 * num / den.where(den > 0)).where(den > 0)


def with_efficiency(ledger: pd.DataFrame, tf32: bool = False) -> pd.DataFrame:
    """Ledger rows (gpu_time's) with EFFICIENCY_COLUMNS per window: step MFU = ideal / span, GEMM
    efficiency = GEMM ideal / GEMM kernel time, FLOPs coverage = covered / compute-kernel time, in
    percent; unnamed fp32 GEMMs rated as TF32 where ``tf32`` (the run records it). NaN where the
    window has no rated FLOPs."""
    out = ledger.copy()
    sfx = "_tf32" if tf32 else ""
    if out.empty:
        return out.assign(**{c: pd.Series(dtype=float) for c in EFFICIENCY_COLUMNS})
    out["step_mfu_pct"] = _pct(out[f"ideal_ms{sfx}"], out["span_ms"]).where(out["flops_ms"] > 0)
    out["gemm_eff_pct"] = _pct(out[f"gemm_ideal_ms{sfx}"], out["gemm_ms"])
    out["flops_coverage_pct"] = _pct(out["flops_ms"], out["kernel_ms"])
    return out


#: :func:`rank_efficiency`'s columns: per (job, rank) the headline numbers.
RANK_EFFICIENCY_COLUMNS = ["job_id", "rank", "step_mfu_pct", "gemm_eff_pct", "flops_coverage_pct",
                           "model_tflop_per_step", "mfu_windows", "flops_set_aside", "set_aside_events"]


def rank_efficiency(ledger: pd.DataFrame, tf32: bool = False, by: tuple[str, ...] = ("job_id", "rank")
                    ) -> pd.DataFrame:
    """Per group ``by`` of ledger rows (gpu_time's, with job_id): step MFU and FLOPs coverage over
    the traced steps pooled (Σ ideal / Σ span; the whole trace where no step has GPU events),
    GEMM efficiency over the whole trace, model TFLOP per window, which windows (``steps`` or
    ``trace``) and the set-aside counts of the whole trace. The percentages are
    :func:`with_efficiency`'s of one row of those sums: one set of formulas for a window and a rank."""
    cols = [*by, *RANK_EFFICIENCY_COLUMNS[2:]]
    if ledger.empty:
        return pd.DataFrame(columns=cols)
    sfx = "_tf32" if tf32 else ""
    rows = []
    for key, df in ledger.groupby(list(by), sort=False):
        trace = df[df["step"] < 0]
        steps = df[df["step"] >= 0]
        win = steps if len(steps) else trace
        s = win[[f"ideal_ms{sfx}", "span_ms", "flops_ms", "kernel_ms", "model_tflop"]].sum()
        g = trace[[f"gemm_ideal_ms{sfx}", "gemm_ms", "flops_set_aside", "set_aside_events"]].sum()
        k = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, k)), **s.to_dict(), **g.to_dict(),
                     "model_tflop_per_step": s["model_tflop"] / len(win) if len(win) else np.nan,
                     "mfu_windows": "steps" if len(steps) else "trace"})
    out = with_efficiency(pd.DataFrame(rows), tf32)
    out[["flops_set_aside", "set_aside_events"]] = out[["flops_set_aside", "set_aside_events"]].astype(int)
    return out[cols]


def efficiency_text(row: pd.Series | dict, tf32: bool = False) -> str:
    """One line of a rank's efficiency numbers (a :func:`rank_efficiency` row), each with its
    FLOPs coverage and what it means; "" where the trace gives no FLOPs."""
    mfu, eff, cov = (float(row[c]) for c in ("step_mfu_pct", "gemm_eff_pct", "flops_coverage_pct"))
    if np.isnan(cov) or cov == 0:
        tflop = float(row.get("model_tflop_per_step", np.nan))
        if tflop > 0:  # FLOPs known, no peak to rate them against
            return (f"{tflop:.3g} TFLOP of model FLOPs per window, but no MFU: the GPU (or these dtypes) is not "
                    "in peaks.csv")
        return ("no FLOPs: the trace records no shapes of its matrix products, attention or convolutions "
                "(profile with record_shapes=True)")
    where = "the traced steps" if row["mfu_windows"] == "steps" else "the whole trace"
    parts = [f"step MFU {_num(mfu)} % (model FLOPs / ({where}' time × the GPU's dense peak))",
             f"GEMM efficiency {_num(eff)} % (the GEMM kernels' FLOPs / their own time × peak)",
             f"FLOPs coverage {cov:.0f} % of compute-kernel time"]
    text = "; ".join(parts)
    if int(row["flops_set_aside"]) or int(row["set_aside_events"]):
        text += (f"; set aside: {int(row['set_aside_events'])} GPU events with a negative duration, "
                 f"{int(row['flops_set_aside'])} calls whose FLOPs would exceed the GPU's peak")
    return text + (" (fp32 GEMMs rated as TF32: the run allows it)" if tf32 else "")


def _num(x: float) -> str:
    return "n/a" if np.isnan(x) else f"{x:.3g}"
