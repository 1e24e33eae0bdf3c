"""Which collective a comm kernel runs and how many bytes it moves, from the profiler's metadata.

Why: a kernel's name does not always say which collective it runs (RCCL's
``ncclDevKernel_Generic`` runs all of them) and never says its size. torch.profiler (2.1+)
records both: it wraps every collective call in a ``record_param_comms`` range whose args carry
``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype`` and ``Group size``, and
newer versions copy them into the NCCL kernel's own args. So a comm kernel's metadata is its own
args, else those of the innermost ``record_param_comms`` range (on the same thread) around the
runtime call that launched it (the launch shares the kernel's correlation id).

bytes = max(in, out) elements x the dtype's size: the larger buffer, which is how dpcore's own
collectives.csv counts an all-gather (the gathered output) and a reduce-scatter (the full input),
and nccl-tests' "size". Unknown (no metadata, a dtype not in :data:`DTYPE_BYTES`) is NaN, never 0.
When several kernels were launched from one range (a coalesced group), the first kernel carries
the range's bytes and the others NaN, so a sum over a step counts the call once.

gloo spans carry no metadata and get none here (their bytes stay unknown).
"""
from __future__ import annotations

from bisect import bisect_right

import numpy as np

from dpcore.read.traces.bytescan import Columns

#: Element size in bytes of each dtype as the profiler writes it (c10's ScalarType names).
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
               "Byte": 1, "Bool": 1, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16, "QInt8": 1,
               "QUInt8": 1, "QInt32": 4, "QUInt4x2": 1, "QUInt2x4": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
               "Float8_e8m0fnu": 1, "Float4_e2m1fn_x2": 1}
_RANGE = "record_param_comms"
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def _nbytes(in_n: int, out_n: int, dtype: str) -> float:
    size = DTYPE_BYTES.get(dtype)
    n = max(in_n, out_n)
    return float(n * size) if size is not None and n >= 0 else float("nan")


def collective_meta(cols: Columns, comm: np.ndarray) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(codes into the names table, the names table with "" first, bytes) of every event: the
    collective name and bytes of the comm events on a device stream (``comm``: which events
    are comm), "" and NaN everywhere else. See the module docstring for the rules."""
    n = cols.ts.size
    names: list[str] = [""]
    codes = np.zeros(n, np.int32)
    out_bytes = np.full(n, np.nan)
    kernels = np.flatnonzero(comm & (cols.stream >= 0))
    coll_t = cols.tables.get("coll")
    if not kernels.size or not coll_t or coll_t == [""]:
        return codes, names, out_bytes
    coll = np.asarray(coll_t + [""], dtype=object)[cols.codes["coll"]]
    dtype = np.asarray(cols.tables["dtype"] + [""], dtype=object)[cols.codes["dtype"]]
    in_n, out_n = cols.nums["in_nelems"], cols.nums["out_nelems"]
    has = coll != ""
    src = np.where(has[kernels], kernels, -1)  # the event whose args describe each kernel
    need = kernels[src < 0]
    if need.size:
        is_range = np.asarray([x == _RANGE for x in cols.tables["name"]] + [False], bool)[cols.codes["name"]]
        src[src < 0] = range_of_launch(cols, is_range & has, need)
    seen: set[int] = set()
    table = {"": 0}
    for k, s in sorted(zip(kernels.tolist(), src.tolist()), key=lambda p: cols.ts[p[0]]):
        if s < 0:
            continue
        codes[k] = table.setdefault(str(coll[s]), len(table))
        if s == k or s not in seen:
            out_bytes[k] = _nbytes(int(in_n[s]), int(out_n[s]), str(dtype[s]))
            seen.add(s)
    return codes, list(table), out_bytes


def range_of_launch(cols: Columns, is_range: np.ndarray, kernels: np.ndarray) -> np.ndarray:
    """For each GPU event (indices ``kernels``), the innermost of the ranges ``is_range`` (a mask
    over the events) on the thread of its launch call (same correlation id) that contains the
    launch's start; -1 when there is no launch or no such range. What links a kernel to the CPU
    op or range that asked for it."""
    cat_t = cols.tables["cat"]
    is_launch = np.asarray([c in _LAUNCH_CATS for c in cat_t] + [False], bool)[cols.codes["cat"]]
    host = cols.stream < 0
    pid, tid = cols.codes["pid"], cols.codes["tid"]
    by_thread: dict[tuple[int, int], tuple[list[float], list[int]]] = {}
    for i in np.flatnonzero(is_range & host).tolist():
        starts, idx = by_thread.setdefault((int(pid[i]), int(tid[i])), ([], []))
        starts.append(float(cols.ts[i]))
        idx.append(i)
    parents: dict[int, int] = {}  # each range's enclosing range (ranges of a thread nest)
    for starts, idx in by_thread.values():
        order = sorted(range(len(idx)), key=lambda j: (starts[j], -cols.dur[idx[j]]))
        starts[:], idx[:] = [starts[j] for j in order], [idx[j] for j in order]
        stack: list[int] = []
        for r in idx:
            while stack and cols.ts[r] >= cols.ts[stack[-1]] + cols.dur[stack[-1]]:
                stack.pop()
            parents[r] = stack[-1] if stack else -1
            stack.append(r)
    launch_of: dict[int, int] = {}
    for i in np.flatnonzero(is_launch & host & (cols.corr > 0)).tolist():
        launch_of.setdefault(int(cols.corr[i]), i)
    out = np.full(kernels.size, -1, np.int64)
    for j, k in enumerate(kernels.tolist()):
        li = launch_of.get(int(cols.corr[k]))
        if li is None:
            continue
        starts, idx = by_thread.get((int(pid[li]), int(tid[li])), ([], []))
        t = float(cols.ts[li])
        p = bisect_right(starts, t) - 1
        r = idx[p] if p >= 0 else -1
        while r >= 0 and t >= cols.ts[r] + cols.dur[r]:  # the latest range that began is closed:
            r = parents[r]                                # a range around t encloses it
        out[j] = r
    return out
