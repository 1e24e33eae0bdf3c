"""torch.profiler Chrome traces -> one events DataFrame with a `kind` per event.

Reading is here (files, ranks, worker processes); what each event counts as (compute, comm,
memcpy, sync, other) and which step it belongs to is decided in
:mod:`dpcore.read.traces.kinds`, whose docstring gives the rules; which collective a comm kernel
runs and its bytes in :mod:`dpcore.read.traces.collectives`.

Where a trace needed one of those rules (no rank, no steps, legacy categories, kernels launched
before the trace began), the frame says so in ``attrs["notes"]`` (one line each, naming the
file): every command that reads traces prints them, so a number is never silently re-based.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import sys
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from dpcore.contract.limits import usable_cpus
from dpcore.contract.procs import exit_with
from dpcore.contract.runformat import RUN_JSON, TRACE_SUFFIXES
from dpcore.contract.tracefile import (
    DEVICE_CATS,
    MAX_TRACE_FILE_BYTES,
    TraceFormatError,
    open_regular,
    read_trace_bytes,
)
from dpcore.read.traces.collectives import collective_meta
from dpcore.read.traces.columns import Columns, read_columns
from dpcore.read.traces.kinds import KINDS, STEP_RE, classify
from dpcore.read.traces.matmuls import kernel_matmuls

_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_ITER_RE = re.compile(r"iteration_(\d+)")
_TB_RE = re.compile(r"(?P<worker>.+)\.(?P<stamp>\d+)\.pt\.trace\.json(\.gz)?")
# Read ranks in worker processes only when it pays: a worker costs ~0.05 s to fork, a rank of
# 250k events (~45 MB of JSON) ~0.35 s of CPU to read.
PARALLEL_MIN_BYTES = 64 << 20
MAX_WORKERS = 4
T = TypeVar("T")


def _codes_to_cat(codes: np.ndarray, table: list) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=pd.Index(table, dtype=object))


def rank_of(meta: dict, path: Path) -> int | None:
    """distributedInfo.rank, else 'rank<r>' in the file name, else None."""
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int) and info["rank"] >= 0:
        return int(info["rank"])
    m = _RANK_RE.search(path.name)
    if m:
        return int(m.group(1))
    return None


#: Highest rank number a trace may claim: far above any real job (the largest run tens of
#: thousands of ranks); a rank of 10**12 is a damaged or crafted trace, and tables are built
#: over the ranks.
MAX_RANK = 2**20 - 1


def check_one_world(found: list[tuple[Path, int, int | None]]) -> None:
    """Refuse, by file and in file order, traces that cannot be the ranks of one job:
    (file, rank, world size from its metadata or None) with a rank beyond its world size or
    :data:`MAX_RANK`, two traces of one rank, or different world sizes. ``import``, ``analyze``,
    ``stragglers``, ``gpu`` and the Timeline's lanes read traces by this one rule (TraceFormatError)."""
    by_rank: dict[int, Path] = {}
    sizes: dict[int, Path] = {}
    for f, rank, ws in found:
        if rank < 0 or rank > MAX_RANK or (ws is not None and rank >= ws):
            raise TraceFormatError(f"{f}: rank {rank} cannot be a rank of "
                                   + (f"its world of {ws}" if ws is not None else "a job")
                                   + f"; valid ranks: 0..{(ws if ws is not None else MAX_RANK + 1) - 1}")
        if rank in by_rank:
            raise TraceFormatError(f"two traces for rank {rank}: {by_rank[rank]} and {f} (several jobs or "
                                   "profiling cycles in one folder? point at one of them)")
        if ws is not None:
            sizes.setdefault(ws, f)
            if len(sizes) > 1:
                (a, fa), (b, fb) = list(sizes.items())[:2]
                raise TraceFormatError(f"traces of different world sizes: {fa} says {a}, {fb} says {b}; "
                                       "give one job's traces at a time")
        by_rank[rank] = f


#: A process_name metadata event, whatever its key order: its ``args`` object is its only nested one.
_PROCESS_NAME_RE = re.compile(rb'\{[^{}]*"process_name"[^{}]*\{[^{}]*\}[^{}]*\}'
                              rb'|\{[^{}]*\{[^{}]*\}[^{}]*"process_name"[^{}]*\}')
_RANK_NAME_RE = re.compile(r"rank\s*(\d+)$", re.IGNORECASE)


def merged_ranks(path: Path) -> dict[str, int]:
    """{pid (as text): rank} of a trace that holds several ranks as processes named 'rank <r>' (the
    ``merged.json.gz`` dpcore writes, every rank on one clock; Chrome's ``process_name`` metadata
    events); {} when it is not one (fewer than two such processes)."""
    out: dict[str, int] = {}
    for m in _PROCESS_NAME_RE.finditer(read_trace_bytes(path)):
        try:
            ev = json.loads(m.group(0))
        except ValueError:
            continue
        args = ev.get("args") if isinstance(ev, dict) else None
        name = args.get("name") if isinstance(args, dict) else None
        hit = _RANK_NAME_RE.search(name.strip()) if isinstance(name, str) and ev.get("name") == "process_name" else None
        if hit and "pid" in ev:
            out[str(ev["pid"])] = int(hit.group(1))
    return out if len(set(out.values())) >= 2 else {}


def _subset(cols: Columns, keep: np.ndarray) -> Columns:
    """The events of ``cols`` where ``keep`` (codes still index the whole file's tables)."""
    return Columns(cols.ts[keep], cols.dur[keep], cols.corr[keep], cols.stream[keep],
                   {f: c[keep] for f, c in cols.codes.items()}, cols.tables,
                   {f: n[keep] for f, n in cols.nums.items()})


def _no_rank(path: Path) -> TraceFormatError:
    return TraceFormatError(f"cannot tell the rank of trace {path}: no distributedInfo.rank and no "
                            f"'rank<r>' in the file name, and it is not the only trace read")


def events_frame(meta: dict, cols: Columns, rank: int, columns: frozenset[str] | None = None) -> pd.DataFrame:
    """Columns -> events DataFrame (see ANALYSIS_API.md) with kind, step, the correlation id
    (``corr``, -1 where none: what links a kernel to its launch call) and, for comm kernels,
    the collective's name and bytes where the trace's metadata says (else "" and NaN), and for
    kernels of a matrix product with recorded shapes its FLOPs and input dtype (``flops``,
    ``mm_dtype``; else NaN and "": :mod:`dpcore.read.traces.matmuls`).
    ``attrs["notes"]``: the rules this trace needed (kinds.classify's notes). ``columns``: the
    columns the caller reads (None: all); the derived ones it does not read
    (:data:`~dpcore.read.traces.rank_table.DERIVED`) are left out."""
    kind, step, notes = classify(cols)  # first: it renames legacy categories in cols
    ts, dur, stream = cols.ts, cols.dur, cols.stream
    names, cats = cols.tables["name"], cols.tables["cat"]
    name_c, cat_c = cols.codes["name"], cols.codes["cat"]
    derived: dict[str, object] = {}
    if columns is None or not columns.isdisjoint(("collective", "bytes")):
        coll_c, coll_t, nbytes = collective_meta(cols, kind == KINDS.index("comm"))
        derived.update(collective=_codes_to_cat(coll_c, coll_t), bytes=nbytes)
    if columns is None or not columns.isdisjoint(("flops", "mm_dtype")):
        flops, mm_c, mm_t = kernel_matmuls(cols, (stream >= 0) & (kind == KINDS.index("compute")))
        derived.update(flops=flops, mm_dtype=_codes_to_cat(mm_c, mm_t))
    df = pd.DataFrame({
        "ts": ts, "dur": dur,
        "name": _codes_to_cat(name_c, names),
        "category": _codes_to_cat(cat_c, cats),
        "pid": _codes_to_cat(cols.codes["pid"], cols.tables["pid"]),
        "tid": _codes_to_cat(cols.codes["tid"], cols.tables["tid"]),
        "stream": stream, "corr": cols.corr, "rank": np.full(ts.size, rank, dtype=np.int64),
        "kind": pd.Categorical.from_codes(kind, categories=list(KINDS)),
        "step": step, **derived,
    }, copy=False)
    df.attrs["notes"] = notes
    return df


def read_trace_meta(path: str | Path, only: bool = True,
                    columns: frozenset[str] | None = None) -> tuple[dict, pd.DataFrame]:
    """(top-level metadata, events) of one trace: what :func:`read_trace` reads, plus the
    trace's own description (``distributedInfo``, ``deviceProperties``, ``host_name``) that an
    importer records as the run's environment. ``only``: see :func:`read_trace`; ``columns``:
    see :func:`events_frame`."""
    p = Path(path)
    if not p.exists():  # a FIFO or device exists but is refused, by name, when opened
        raise TraceFormatError(f"trace file not found: {p}")
    meta, cols = read_columns(p)
    rank = rank_of(meta, p)
    ranks = merged_ranks(p) if rank is None and len(set(cols.tables["pid"])) >= 2 else {}
    if ranks:  # one file, several ranks: each process's events read as that rank's trace
        parts, notes = [], []
        for code, pid in enumerate(cols.tables["pid"]):
            if str(pid) in ranks:
                part = events_frame(meta, _subset(cols, cols.codes["pid"] == code), ranks[str(pid)], columns)
                parts.append(part)
                notes += [n for n in part.attrs["notes"] if n not in notes]
        df = pd.concat(parts, ignore_index=True)
        listed = ", ".join(map(str, sorted(set(ranks.values()))))
        df.attrs["notes"] = [f"{p.name}: {n}" for n in
                             [f"a merged trace: ranks {listed} read from its process names", *notes]]
        return meta, df
    if rank is None and not only:
        raise _no_rank(p)
    df = events_frame(meta, cols, 0 if rank is None else rank, columns)
    if rank is None:
        df.attrs["notes"] = ["no rank in the trace (no distributedInfo, no 'rank<r>' in the file name): "
                             "read as rank 0 of 1", *df.attrs["notes"]]
    df.attrs["notes"] = [f"{p.name}: {n}" for n in df.attrs["notes"]]
    return meta, df


def read_trace(path: str | Path, only: bool = True) -> pd.DataFrame:
    """Read one torch.profiler Chrome trace (.json or .json.gz) into the events DataFrame.

    The rank is distributedInfo.rank, else 'rank<r>' in the file name; a trace with neither is
    rank 0 of 1 when it is the ``only`` trace read (a single-process job: tensorboard_trace_handler
    writes no rank), with a note. Raises TraceFormatError (a ValueError) naming the file if it is
    missing, truncated, foreign, or has no rank and is not the only trace.
    """
    return read_trace_meta(path, only)[1]


def trace_notes(events: pd.DataFrame) -> list[str]:
    """The notes :func:`read_trace` and :func:`read_trace_files` left on a frame (see the module docstring)."""
    return list(events.attrs.get("notes", []))


def on_host(events: pd.DataFrame) -> np.ndarray:
    """Which events ran on the host: no stream and not a device category (a ``gpu_user_annotation``
    copy of a range lies on the device timeline, with no stream id on ROCm)."""
    return (events["stream"] < 0).to_numpy() & ~events["category"].isin(DEVICE_CATS).to_numpy()


def step_ranges(events: pd.DataFrame) -> pd.DataFrame:
    """rank, step, ts, dur (µs) of every step of the events, by kinds' one rule: the
    ``ProfilerStep#N`` range on the host (the longest, if a rank has several of one number),
    and for a trace without any, its whole span (of its host events, all in one step)."""
    host = events[on_host(events)]
    names = host["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):  # once per distinct name, then by the codes
        per = pd.Series([str(c) for c in names.cat.categories] + ["nan"], dtype=object)  # -1: "nan"
        per = per.str.extract("^" + STEP_RE.pattern, expand=False).to_numpy(dtype=object)
        num = pd.Series(per[names.cat.codes.to_numpy()], index=host.index, dtype=object)
    else:
        num = names.astype(str).str.extract("^" + STEP_RE.pattern, expand=False)  # re.match, as kinds
    marked = host.loc[num.notna(), ["rank", "ts", "dur"]].assign(step=num.dropna().astype(np.int64))
    marked = marked.sort_values("dur", ascending=False).drop_duplicates(["rank", "step"])
    rows = [marked]
    bare = host[~host["rank"].isin(set(marked["rank"])) & (host["step"] >= 0)]
    if len(bare):
        g = bare.assign(end=bare["ts"] + bare["dur"]).groupby(["rank", "step"], as_index=False)
        span = g.agg(ts=("ts", "min"), end=("end", "max"))
        rows.append(span.assign(dur=span["end"] - span["ts"])[["rank", "ts", "dur", "step"]])
    out = pd.concat([r for r in rows if len(r)] or [marked], ignore_index=True)
    return out.sort_values(["rank", "step"]).reset_index(drop=True)[["rank", "step", "ts", "dur"]]


def trace_files(path: str | Path, iteration: int | None = None) -> list[Path]:
    """The per-rank trace files at ``path``: the file itself, or a folder searched recursively.

    Why recursive, and these rules: people point at what their training wrote. torchtitan
    writes ``iteration_<k>/rank<r>_trace.json`` per profiling cycle (take iteration
    ``iteration``, else the latest); ``tensorboard_trace_handler`` writes
    ``<worker>.<stamp>.pt.trace.json[.gz]`` per worker and cycle (take each worker's latest
    cycle); dpcore and many scripts write ``rank<r>.json[.gz]``. Files named like a trace
    (``rank*``, ``*trace*``) win over other JSON; ``merged*`` and ``run.json`` never count.
    """
    p = Path(path)
    if p.is_file():
        if not p.name.endswith(TRACE_SUFFIXES):
            raise TraceFormatError(f"not a Chrome trace file (*.json, *.json.gz): {p}")
        return [p]
    if not p.is_dir():
        raise TraceFormatError(f"not a regular file or folder (a pipe, device or socket): {p}" if p.exists()
                               else f"trace folder not found: {p}")
    iters = iteration_dirs(p)
    if iteration is not None and iteration not in iters:
        have = ", ".join(map(str, sorted(iters))) or "none"
        raise TraceFormatError(f"no iteration_{iteration} folder under {p} (iterations found: {have})")
    if iters:
        p = iters[iteration if iteration is not None else max(iters)]
    found = sorted(f for f in _walk(p) if f.name.endswith(TRACE_SUFFIXES)
                   and not f.name.startswith("merged") and f.name != RUN_JSON)
    named = [f for f in found if f.name.lower().startswith("rank") or "trace" in f.name.lower()]
    files = _latest_cycles(named or found)
    if not files:
        raise TraceFormatError(f"no Chrome trace files (*.json, *.json.gz) in {p}")
    return files


def iteration_dirs(path: Path) -> dict[int, Path]:
    """{k: folder} of torchtitan's ``iteration_<k>`` trace folders under ``path`` (itself included)."""
    out: dict[int, Path] = {}
    for d in [path, *(f for f in _walk(path, dirs=True))]:
        m = _ITER_RE.fullmatch(d.name)
        if m and d.is_dir():
            out.setdefault(int(m.group(1)), d)
    return out


def _walk(path: Path, dirs: bool = False) -> Iterator[Path]:
    """Files (or folders) under ``path``, recursively, skipping hidden folders; no symlinked folders."""
    for root, subdirs, names in os.walk(path):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for n in (subdirs if dirs else names):
            yield Path(root) / n


def _latest_cycles(files: list[Path]) -> list[Path]:
    """Of tensorboard_trace_handler's files, each worker's latest cycle (largest stamp); others kept."""
    best: dict[tuple[Path, str], tuple[int, Path]] = {}
    out = []
    for f in files:
        m = _TB_RE.fullmatch(f.name)
        if m is None:
            out.append(f)
            continue
        key, stamp = (f.parent, m.group("worker")), int(m.group("stamp"))
        if key not in best or stamp > best[key][0]:
            best[key] = (stamp, f)
    return sorted(out + [f for _, f in best.values()])


def json_bytes(path: Path) -> int:
    """Uncompressed size of a trace file (gzip's ISIZE trailer; exact below 4 GiB), 0 if unreadable."""
    try:  # regular files only: a FIFO would block here (the read proper reports it by name)
        with open_regular(path, MAX_TRACE_FILE_BYTES) as fh:
            if fh.read(2) != b"\x1f\x8b":
                return os.fstat(fh.fileno()).st_size
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0


def can_fork() -> bool:
    """Worker processes only by fork, only on Linux, only from a single-threaded process.

    fork is cheap (workers inherit the imports); forking a multi-threaded process (the Streamlit
    app) can deadlock the child on a lock another thread held, and spawn/forkserver re-import the
    caller's ``__main__`` (a script without a main guard would re-run), so those read serially.
    """
    return sys.platform.startswith("linux") and threading.active_count() == 1


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` forked processes that end with their parent, even when it is killed
    with ``kill -9`` (:func:`dpcore.contract.procs.exit_with`: a pool's workers otherwise wait for
    work forever, re-parented to init): the one way dpcore's read wing starts worker processes
    (callers check :func:`can_fork`). The parent's pid is taken here, not in the worker, so a
    parent already gone when the worker starts is seen too."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=exit_with, initargs=(os.getpid(),))


def _read_traces(files: list[Path]) -> Generator[pd.DataFrame, None, None]:
    """read_trace of each file, in order; large multi-file sets are read in worker processes.

    Processes, measured against threads and a serial read on 2 cores (4 x 250k events): threads
    overlap as well (numpy and zlib release the GIL) but each thread's malloc arena keeps its
    own freed memory (+35% peak RSS); workers return the compact events frame (~45 bytes per
    event) and keep the parent's peak below a serial read's. Errors surface in file order.
    """
    workers = min(len(files), usable_cpus(), MAX_WORKERS)
    read = read_trace if len(files) == 1 else _read_one_of_many
    if sum(json_bytes(f) for f in files) < PARALLEL_MIN_BYTES:
        workers = 1
    yield from fork_map(read, workers, files)


def fork_map(fn: Callable[..., T], workers: int, *args: Iterable[Any]) -> Generator[T, None, None]:
    """``map(fn, *args)``, in order, in ``workers`` forked worker processes where
    :func:`can_fork` allows it (else, or with fewer than 2 workers, in this process). ``fn``
    must be a module-level function (workers receive it by name). An error or an early close
    drops the calls not yet started."""
    if workers < 2 or not can_fork():
        yield from map(fn, *args)
        return
    ex = None
    try:
        ex = worker_pool(workers)
        results = ex.map(fn, *args)  # submits every call: starts the workers
    except (OSError, NotImplementedError):  # no usable worker processes here (no sem_open, ...)
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)
        yield from map(fn, *args)
        return
    try:
        yield from results
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _read_one_of_many(path: Path) -> pd.DataFrame:
    """read_trace of one file of several (a trace without a rank is then an error); module-level
    so that worker processes can run it."""
    return read_trace(path, only=False)


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
    out = pd.DataFrame(cols, copy=False)
    out.attrs["notes"] = [n for f in frames for n in trace_notes(f)]
    return out


def read_trace_files(files: list[Path]) -> pd.DataFrame:
    """Rank traces (one file per rank, in this order) in one events DataFrame; two files of one
    rank, or a rank beyond :data:`MAX_RANK`, are an error (:func:`check_one_world`). Categories
    are unified across ranks (sorted when the ranks differ)."""
    frames: list[pd.DataFrame] = []
    found: list[tuple[Path, int, int | None]] = []
    reader = _read_traces(files)
    try:
        for f, df in zip(files, reader):
            r = int(df["rank"].iloc[0]) if len(df) else rank_of({}, f)
            if r is not None:
                found.append((f, r, None))
            frames.append(df)
    finally:
        reader.close()
    check_one_world(found)
    return _concat(frames) if len(frames) > 1 else frames[0]


def read_trace_dir(path: str | Path, iteration: int | None = None) -> pd.DataFrame:
    """All rank traces of a folder, or one trace file (see :func:`trace_files`), in one DataFrame."""
    return read_trace_files(trace_files(path, iteration))


def concat_events(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Events frames of several ranks in one, categories unified (as :func:`read_trace_files`)."""
    return _concat(frames) if len(frames) > 1 else frames[0]
