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

import numpy as np
import pandas as pd

from dpcore.read.traces.bytescan import Columns

#: Element size in bytes of each dtype as the profiler writes it (c10's ScalarType names).
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
               "Byte": 1, "Bool": 1, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16, "QInt8": 1,
               "QUInt8": 1, "QInt32": 4, "QUInt4x2": 1, "QUInt2x4": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
               "Float8_e8m0fnu": 1, "Float4_e2m1fn_x2": 1}
_RANGE = "record_param_comms"
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


#: Every size is a power of two, so float(n) * size is exactly float(n * size): the bytes of
#: :func:`collective_meta` are computed in float64 without an int64 product that could overflow.
assert all(b & (b - 1) == 0 for b in DTYPE_BYTES.values())


def collective_meta(cols: Columns, comm: np.ndarray) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(codes into the names table, the names table with "" first, bytes) of every event: the
    collective name and bytes of the comm events on a device stream (``comm``: which events
    are comm), "" and NaN everywhere else. See the module docstring for the rules.

    The names table lists the names in the order the kernels ran (by ``ts``, ties in file
    order), and so does "the first kernel of a range" (the one that carries its bytes)."""
    n = cols.ts.size
    codes = np.zeros(n, np.int32)
    out_bytes = np.full(n, np.nan)
    kernels = np.flatnonzero(comm & (cols.stream >= 0))
    coll_t = cols.tables.get("coll")
    if not kernels.size or not coll_t or coll_t == [""]:
        return codes, [""], out_bytes
    coll = cols.codes["coll"]
    has = np.asarray([c != "" for c in coll_t] + [False], bool).take(coll)
    src = np.where(has[kernels], kernels, -1)  # the event whose args describe each kernel
    need = src < 0
    if need.any():
        is_range = np.asarray([x == _RANGE for x in cols.tables["name"]] + [False], bool).take(cols.codes["name"])
        src[need] = range_of_launch(cols, is_range & has, kernels[need])
    order = np.argsort(cols.ts[kernels], kind="stable")  # the order the kernels ran
    k, s = kernels[order], src[order]
    k, s = k[s >= 0], s[s >= 0]
    if not k.size:
        return codes, [""], out_bytes
    found, uniq = pd.factorize(coll.take(s))  # first-appearance order
    codes[k] = found + 1
    _, first = np.unique(s, return_index=True)  # a kernel's own args are its own: first too
    k, s = k[first], s[first]
    size = np.asarray([DTYPE_BYTES.get(d, np.nan) for d in cols.tables["dtype"]] + [np.nan], np.float64)
    elems = np.maximum(cols.nums["in_nelems"].take(s), cols.nums["out_nelems"].take(s))
    out_bytes[k] = np.where(elems >= 0, elems.astype(np.float64) * size.take(cols.codes["dtype"].take(s)), np.nan)
    return codes, ["", *(coll_t[c] for c in uniq.tolist())], out_bytes


def range_of_launch(cols: Columns, is_range: np.ndarray, kernels: np.ndarray) -> np.ndarray:
    """For each GPU event (indices ``kernels``), the innermost of the ranges ``is_range`` (a mask
    over the events) on the thread of its launch call (same correlation id) that contains the
    launch's start; -1 when there is no launch or no such range. What links a kernel to the CPU
    op or range that asked for it.

    The launch of a correlation id is its first launch call in the file. A thread's ranges are
    ordered by start (the longer first, then file order) and nest: the range around a time t is
    the last one to start at or before t, or else the first enclosing range of that one (its
    parent, found with a stack) that is still open at t. Vectorised over the kernels; only the
    ranges' parents are found one range at a time."""
    out = np.full(kernels.size, -1, np.int64)
    host = cols.stream < 0
    ranges = np.flatnonzero(is_range & host)
    is_launch = np.asarray([c in _LAUNCH_CATS for c in cols.tables["cat"]] + [False], bool).take(cols.codes["cat"])
    launches = np.flatnonzero(is_launch & host & (cols.corr > 0))
    if not ranges.size or not launches.size or not kernels.size:
        return out
    ids, first = np.unique(cols.corr[launches], return_index=True)  # each id's first launch
    want = cols.corr[kernels]
    at = np.minimum(np.searchsorted(ids, want), ids.size - 1)
    hit = np.flatnonzero(ids[at] == want)
    launch = launches[first[at[hit]]]
    ntid = len(cols.tables["tid"]) + 1
    thread = cols.codes["pid"].astype(np.int64) * ntid + cols.codes["tid"]
    ts, dur = cols.ts, cols.dur
    ranges = ranges[np.lexsort((-dur[ranges], ts[ranges], thread[ranges]))]  # stable: file order last
    r_thread, r_start = thread[ranges], ts[ranges]
    r_end = r_start + dur[ranges]
    parent = _parents(r_thread.tolist(), r_start.tolist(), r_end.tolist())
    # the last range of the launch's thread that starts at or before the launch
    q_thread, t = thread[launch], ts[launch]
    lo = np.searchsorted(r_thread, q_thread, "left")
    pos = np.full(launch.size, -1, np.int64)
    for th in np.unique(q_thread).tolist():
        sel = np.flatnonzero(q_thread == th)
        a, b = int(lo[sel[0]]), int(np.searchsorted(r_thread, th, "right"))
        p = np.searchsorted(r_start[a:b], t[sel], "right") - 1
        pos[sel] = np.where(p >= 0, p + a, -1)
    while True:  # climb while the range found closed before the launch
        up = np.flatnonzero(pos >= 0)
        up = up[t[up] >= r_end[pos[up]]]
        if not up.size:
            break
        pos[up] = parent[pos[up]]
    out[hit] = np.where(pos >= 0, ranges[np.maximum(pos, 0)], -1)
    return out


def _parents(thread: list[int], start: list[float], end: list[float]) -> np.ndarray:
    """For ranges sorted by (thread, start), each one's enclosing range (its index in that
    order; -1 for none): the innermost range of its thread still open at its start, by a stack."""
    parent = [-1] * len(thread)
    stack: list[int] = []
    prev = None
    for i, (th, s) in enumerate(zip(thread, start)):
        if th != prev:
            stack, prev = [], th
        while stack and s >= end[stack[-1]]:
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return np.asarray(parent, np.int64)
