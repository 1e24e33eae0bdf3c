"""torch.profiler Chrome traces -> one events DataFrame with a `kind` per event.

Classification (what the overlap numbers count):

* GPU traces (NCCL): comm = kernels whose name starts with ``nccl`` (``ncclKernel_*``,
  ``ncclDevKernel_*``) AND kernels launched from inside the profiler's collective ranges
  (``record_param_comms``, ``nccl:*``, ``c10d::*``; matched by correlation id), so a future
  kernel rename cannot hide communication; memcpy = Memcpy/Memset kernels and
  gpu_memcpy/gpu_memset events; sync = ``*Sync*`` kernels and cuda*Synchronize runtime calls;
  compute = every other kernel. On today's kernel names this is Holistic Trace Analysis'
  kernel typing, so our overlap % matches HTA's.
* CPU traces (gloo), checked against real torch 2.x traces: gloo runs each collective as a
  ``gloo:<op>`` span on a ``pt_gloo_runloop`` worker thread -> comm (``gloo:barrier`` -> sync:
  it moves no data, and dpcore aligns step starts with one). The main thread (the one
  carrying ``forward``/``backward``/``optimizer``/``ProfilerStep#N`` ranges) runs the operators;
  those inside forward/backward/optimizer are compute. ``grad_sync`` is the main thread waiting
  for gradients and ``*wait*`` ops are the main thread waiting: kind sync, and they are cut out
  of compute. Collective launches (``c10d::*``, ``record_param_comms``) are kind other; a launch
  from a gradient hook stays inside its backward node's interval, as in the steps.csv phase
  intervals (so trace-based and interval-based overlap agree).
"""
from __future__ import annotations

import multiprocessing
import os
import re
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.contract.intervals import merge
from dpcore.contract.tracefile import TraceFormatError
from dpcore.read.analysis.tracefile import Columns, read_columns

KINDS = ("compute", "comm", "memcpy", "sync", "other")
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_PHASES = ("forward", "backward", "optimizer")
_CPU_WAIT_RE = re.compile(r"wait|synchronize", re.IGNORECASE)
_CPU_LAUNCH_RE = re.compile(r"^(c10d::|record_param_comms|nccl:)")
_NCCL_KERNEL = re.compile(r"^(void\s+)?nccl", re.IGNORECASE)
#: CPU ranges that the profiler opens around a collective call, whatever its kernel is named:
#: ``record_param_comms`` (carries the collective's name, sizes and group in its args),
#: ``nccl:<op>`` and the ``c10d::<op>_`` dispatcher ops.
_COMM_RANGE_RE = re.compile(r"^(record_param_comms$|nccl:|c10d::)")
# Read ranks in worker processes only when it pays: a worker costs ~0.05 s to fork, a rank of
# 250k events (~45 MB of JSON) ~0.35 s of CPU to read.
PARALLEL_MIN_BYTES = 64 << 20
MAX_WORKERS = 4


def _gpu_kind(name: str, cat: str) -> str:
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy"
    if cat in ("kernel", "cuda_driver_kernel"):
        if _NCCL_KERNEL.match(name):  # ncclKernel_* (NCCL < 2.19), ncclDevKernel_* (later)
            return "comm"
        if name.startswith(("Memcpy", "Memset", "dma")) or "Memcpy" in name:
            return "memcpy"
        if "Sync" in name:
            return "sync"
        return "compute"
    if cat in ("cuda_runtime", "cuda_driver") and "Synchronize" in name:
        return "sync"
    return "other"


def _codes_to_cat(codes: np.ndarray, table: list) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=pd.Index(table, dtype=object))


def _rank_of(meta: dict, path: Path) -> int:
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int) and info["rank"] >= 0:
        return int(info["rank"])
    m = _RANK_RE.search(path.name)
    if m:
        return int(m.group(1))
    raise TraceFormatError(f"cannot tell the rank of trace {path}: no distributedInfo.rank and no "
                           f"'rank<r>' in the file name")


def _steps(ts: np.ndarray, dur: np.ndarray, names: list[str], name_codes: np.ndarray) -> np.ndarray:
    """ProfilerStep number of each event by time (CPU events), -1 outside every step."""
    step_of_code = np.full(len(names) + 1, -1, dtype=np.int64)
    for i, n in enumerate(names):
        m = _STEP_RE.match(n)
        if m:
            step_of_code[i] = int(m.group(1))
    marker = step_of_code[name_codes] >= 0
    out = np.full(ts.size, -1, dtype=np.int64)
    if not marker.any():
        return out
    order = np.argsort(ts[marker], kind="stable")
    s_ts, s_end = ts[marker][order], (ts[marker] + dur[marker])[order]
    s_num = step_of_code[name_codes[marker]][order]
    idx = np.searchsorted(s_ts, ts, side="right") - 1
    ok = idx >= 0
    ok[ok] &= ts[ok] < s_end[idx[ok]]
    out[ok] = s_num[idx[ok]]
    return out


def _pair_kinds(names: list[str], cats: list[str], name_c: np.ndarray, cat_c: np.ndarray) -> np.ndarray:
    """GPU kind code of each event, classified once per distinct (name, category) pair."""
    pair = name_c.astype(np.int64) * max(1, len(cats)) + cat_c
    if len(names) * max(1, len(cats)) <= 4 * len(pair) + 1024:  # dense table: no sort
        present = np.flatnonzero(np.bincount(pair, minlength=len(names) * max(1, len(cats))))
        lut = np.zeros(len(names) * max(1, len(cats)), np.int8)
        lut[present] = [KINDS.index(_gpu_kind(names[u // len(cats)], cats[u % len(cats)])) for u in present]
        return lut[pair]
    uniq, inv = np.unique(pair, return_inverse=True)
    kinds = [KINDS.index(_gpu_kind(names[u // len(cats)], cats[u % len(cats)])) for u in uniq]
    return np.asarray(kinds, dtype=np.int8)[inv]


def _comm_by_launch(kind: np.ndarray, ts: np.ndarray, dur: np.ndarray, names: list[str], cats: list[str],
                    name_c: np.ndarray, cat_c: np.ndarray, stream: np.ndarray, corr: np.ndarray,
                    pid_c: np.ndarray, tid_c: np.ndarray) -> None:
    """Kernels launched from inside a collective's CPU range are comm, whatever they are called.

    Why: classifying by kernel name alone broke Holistic Trace Analysis twice when NCCL renamed
    its kernels (``ncclKernel_*`` -> ``ncclDevKernel_*``). The profiler's own collective
    metadata does not depend on names: torch wraps every collective call in a
    ``record_param_comms`` range (and ``nccl:*`` / ``c10d::*`` ops), and the launch of each
    kernel (a ``cudaLaunchKernel`` runtime event) shares a correlation id with the kernel.
    So a kernel whose launch lies inside such a range on the same thread is communication.
    """
    range_code = np.asarray([bool(_COMM_RANGE_RE.match(n)) for n in names] + [False], dtype=bool)
    host = (stream < 0) & range_code[name_c]
    if not host.any():
        return
    runtime = np.asarray([c in ("cuda_runtime", "cuda_driver") for c in cats] + [False], dtype=bool)
    launch = (stream < 0) & (corr > 0) & runtime[cat_c]
    thread = pid_c.astype(np.int64) * (int(tid_c.max(initial=0)) + 1) + tid_c
    inside = np.zeros(ts.size, dtype=bool)
    for th in np.unique(thread[host]):
        h = host & (thread == th)
        starts, ends = merge(ts[h], ts[h] + dur[h])
        cand = np.flatnonzero(launch & (thread == th))
        idx = np.searchsorted(starts, ts[cand], side="right") - 1
        ok = idx >= 0
        ok[ok] &= ts[cand][ok] < ends[idx[ok]]
        inside[cand[ok]] = True
    comm_corr = np.unique(corr[inside])
    if not comm_corr.size:
        return
    kernel = np.asarray([c in ("kernel", "cuda_driver_kernel") for c in cats] + [False], dtype=bool)
    dev = (stream >= 0) & kernel[cat_c] & np.isin(corr, comm_corr)
    kind[dev & (kind == KINDS.index("compute"))] = KINDS.index("comm")


def _launch_steps(step: np.ndarray, stream: np.ndarray, corr: np.ndarray) -> None:
    """Kernels (stream >= 0) take the step of the CPU op that launched them (same correlation)."""
    host = np.flatnonzero((stream < 0) & (corr > 0) & (step >= 0))
    dev = np.flatnonzero((stream >= 0) & (corr > 0))
    if not host.size or not dev.size:
        return
    top = int(corr.max())
    if top <= 4 * len(corr) + 1024:  # dense lookup by correlation id; the first launch wins
        by_corr = np.full(top + 1, -1, np.int64)
        by_corr[corr[host][::-1]] = step[host][::-1]
        found = by_corr[corr[dev]]
        step[dev[found >= 0]] = found[found >= 0]
        return
    order = np.argsort(corr[host], kind="stable")
    keys, vals = corr[host][order], step[host][order]
    pos = np.clip(np.searchsorted(keys, corr[dev]), 0, keys.size - 1)
    found = keys[pos] == corr[dev]
    step[dev[found]] = vals[pos[found]]


def events_frame(meta: dict, cols: Columns, rank: int) -> pd.DataFrame:
    """Columns -> events DataFrame (see ANALYSIS_API.md) with kind and step assigned."""
    ts, dur, stream, corr = cols.ts, cols.dur, cols.stream, cols.corr
    names, cats = cols.tables["name"], cols.tables["cat"]
    name_c, cat_c = cols.codes["name"], cols.codes["cat"]
    if any(c in ("kernel", "gpu_memcpy", "gpu_memset") for c in cats):  # a GPU trace
        kind = _pair_kinds(names, cats, name_c, cat_c)
        _comm_by_launch(kind, ts, dur, names, cats, name_c, cat_c, stream, corr, cols.codes["pid"],
                        cols.codes["tid"])
        step = _steps(ts, dur, names, name_c)
        _launch_steps(step, stream, corr)
    else:
        kind = _cpu_kinds(ts, dur, names, cats, name_c, cat_c, cols.codes["tid"], cols.codes["pid"])
        step = _steps(ts, dur, names, name_c)
    return pd.DataFrame({
        "ts": ts, "dur": dur,
        "name": _codes_to_cat(name_c, names),
        "category": _codes_to_cat(cat_c, cats),
        "pid": _codes_to_cat(cols.codes["pid"], cols.tables["pid"]),
        "tid": _codes_to_cat(cols.codes["tid"], cols.tables["tid"]),
        "stream": stream, "rank": np.full(ts.size, rank, dtype=np.int64),
        "kind": pd.Categorical.from_codes(kind, categories=list(KINDS)),
        "step": step,
    }, copy=False)


def _cpu_kinds(ts: np.ndarray, dur: np.ndarray, names: list[str], cats: list[str], name_c: np.ndarray,
               cat_c: np.ndarray, tid_c: np.ndarray, pid_c: np.ndarray) -> np.ndarray:
    """Kinds for a CPU (gloo) trace; see the module docstring."""
    kind = np.full(ts.size, KINDS.index("other"), dtype=np.int8)
    is_gloo = np.asarray([n.startswith("gloo:") for n in names], dtype=bool)
    phase_code = np.asarray([n in _PHASES for n in names], dtype=bool)
    hole = np.asarray([bool(_CPU_WAIT_RE.search(n)) for n in names], dtype=bool)
    launch = np.asarray([bool(_CPU_LAUNCH_RE.match(n)) for n in names], dtype=bool)
    marker = np.asarray([n in _PHASES or n == "grad_sync" or bool(_STEP_RE.match(n)) for n in names], dtype=bool)
    thread = pid_c.astype(np.int64) * (int(tid_c.max(initial=0)) + 1) + tid_c
    # main thread: the one with the phase / ProfilerStep ranges, else the busiest cpu_op thread
    op_cat = np.asarray([c == "cpu_op" for c in cats], dtype=bool)
    if marker[name_c].any():
        main = np.bincount(thread[marker[name_c]]).argmax()
    elif op_cat[cat_c].any():
        main = np.bincount(thread[op_cat[cat_c]]).argmax()
    else:
        main = -1
    on_main = thread == main
    # barriers move no data: dpcore aligns step starts with one, and a user's barrier is waiting
    is_barrier = np.asarray(["barrier" in n for n in names], dtype=bool)[name_c]
    kind[is_gloo[name_c] & ~on_main & ~is_barrier] = KINDS.index("comm")
    ops = on_main & op_cat[cat_c]
    ph = on_main & phase_code[name_c]
    if ph.any():
        order = np.argsort(ts[ph])
        p_s, p_e = ts[ph][order], (ts[ph] + dur[ph])[order]
        p_e = np.maximum.accumulate(p_e)
        idx = np.searchsorted(p_s, ts, side="right") - 1
        inside = idx >= 0
        inside[inside] &= ts[inside] < p_e[idx[inside]]
        ops &= inside
    kind[ops & ~launch[name_c]] = KINDS.index("compute")
    kind[on_main & hole[name_c] & ~is_gloo[name_c]] = KINDS.index("sync")
    kind[on_main & (np.asarray([n == "grad_sync" for n in names], dtype=bool)[name_c])] = KINDS.index("sync")
    kind[is_gloo[name_c] & (on_main | is_barrier)] = KINDS.index("sync")
    return kind


def read_trace(path: str | Path) -> pd.DataFrame:
    """Read one torch.profiler Chrome trace (.json or .json.gz) into the events DataFrame.

    Raises TraceFormatError (a ValueError) naming the file if it is missing, truncated, foreign,
    or has no rank (distributedInfo.rank, else 'rank<r>' in the file name).
    """
    p = Path(path)
    if not p.is_file():
        raise TraceFormatError(f"trace file not found: {p}")
    meta, cols = read_columns(p)
    return events_frame(meta, cols, _rank_of(meta, p))


def trace_files(path: str | Path) -> list[Path]:
    """Per-rank trace files of a folder: rank*.json[.gz] if any, else every *.json[.gz] but merged."""
    d = Path(path)
    if not d.is_dir():
        raise TraceFormatError(f"trace folder not found: {d}")
    all_json = sorted(f for f in d.iterdir() if f.is_file() and f.name.endswith((".json", ".json.gz")))
    ranked = [f for f in all_json if f.name.lower().startswith("rank")]
    files = ranked or [f for f in all_json if not f.name.startswith("merged")]
    if not files:
        raise TraceFormatError(f"no Chrome trace files (*.json, *.json.gz) in {d}")
    return files


def _json_bytes(path: Path) -> int:
    """Uncompressed size of a trace file (gzip's ISIZE trailer; exact below 4 GiB), 0 if unreadable."""
    try:
        with path.open("rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                return path.stat().st_size
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0


def _can_fork() -> bool:
    """Worker processes only by fork, only on Linux, only from a single-threaded process.

    fork is cheap (workers inherit the imports); forking a multi-threaded process (the Streamlit
    app) can deadlock the child on a lock another thread held, and spawn/forkserver re-import the
    caller's ``__main__`` (a script without a main guard would re-run), so those read serially.
    """
    return sys.platform.startswith("linux") and threading.active_count() == 1


def _read_traces(files: list[Path]) -> Iterator[pd.DataFrame]:
    """read_trace of each file, in order; large multi-file sets are read in worker processes.

    Processes, measured against threads and a serial read on 2 cores (4 x 250k events): threads
    overlap as well (numpy and zlib release the GIL) but each thread's malloc arena keeps its
    own freed memory (+35% peak RSS); workers return the compact events frame (~45 bytes per
    event) and keep the parent's peak below a serial read's. Errors surface in file order.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(len(files), cpus, MAX_WORKERS)
    if workers < 2 or not _can_fork() or sum(_json_bytes(f) for f in files) < PARALLEL_MIN_BYTES:
        yield from map(read_trace, files)
        return
    ex = None
    try:
        ex = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
        results = ex.map(read_trace, files)  # submits every file: starts the workers
    except (OSError, NotImplementedError):  # no usable worker processes here (no sem_open, ...)
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)
        yield from map(read_trace, files)
        return
    try:
        yield from results
    finally:  # on an error or an early close, drop the ranks not yet parsed
        ex.shutdown(wait=True, cancel_futures=True)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``pd.concat(frames, ignore_index=True)``, then categoricals that concat turned into
    objects (different categories per rank) made categoricals again, as read_trace_dir always
    returned them; built from the codes instead of 1M objects (same categories, same codes)."""
    cols: dict[str, object] = {}
    for c in frames[0].columns:
        parts = [f[c] for f in frames]
        dtypes = [p.dtype for p in parts]
        if not isinstance(dtypes[0], pd.CategoricalDtype):
            cols[c] = np.concatenate([p.to_numpy() for p in parts])
            continue
        if all(d == dtypes[0] for d in dtypes):  # concat keeps the first frame's categories
            cats = dtypes[0].categories
        else:  # concat gives objects, and astype("category") their distinct values
            union = [v for d in dtypes for v in d.categories.tolist()]
            values = np.empty(len(union), dtype=object)
            values[:] = union
            cats = pd.Categorical(values).categories
        codes = [cats.get_indexer(p.cat.categories).take(p.cat.codes.to_numpy()) if len(p) else
                 np.zeros(0, np.int64) for p in parts]
        dtype = dtypes[0] if cats is dtypes[0].categories else pd.CategoricalDtype(cats)
        cols[c] = pd.Categorical.from_codes(np.concatenate(codes), dtype=dtype)
    return pd.DataFrame(cols, copy=False)


def read_trace_files(files: list[Path]) -> pd.DataFrame:
    """Rank traces (one file per rank, in this order) in one events DataFrame; two files of one
    rank are an error. Categories are unified across ranks (sorted when the ranks differ)."""
    frames, seen = [], {}
    reader = _read_traces(files)
    try:
        for f, df in zip(files, reader):
            r = int(df["rank"].iloc[0]) if len(df) else _rank_of({}, f)
            if r in seen:
                raise TraceFormatError(f"two traces for rank {r}: {seen[r]} and {f}")
            seen[r] = f
            frames.append(df)
    finally:
        reader.close()
    return _concat(frames) if len(frames) > 1 else frames[0]


def read_trace_dir(path: str | Path) -> pd.DataFrame:
    """All rank traces of a folder (see :func:`trace_files`) in one DataFrame."""
    return read_trace_files(trace_files(path))
