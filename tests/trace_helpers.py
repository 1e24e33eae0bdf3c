"""The all-ranks events reader, for tests only: every rank trace of a folder read into one
events frame.

Why it is here and not in the package: every command and view reads many ranks one rank at a
time into compact per-rank tables (:mod:`dpcore.read.ranks`: each rank reduced to the tables its
readers declare, cached), so that memory does not grow with the number of ranks. Reading all
ranks' events at once is the independent reference those tables are checked against (the same
rows must come out of both), and the control the memory-limit tests bind; nothing in dpcore/
calls it (tests/test_no_test_only_names.py keeps it so). The analyses of such a frame that only
tests use (overlap per rank over a whole trace, stragglers of a folder's events) are here too,
each built from the package's own functions.
"""
from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.contract.limits import usable_cpus
from dpcore.read.analysis.comm_overlap import overlap_from_trace
from dpcore.read.analysis.stragglers import arrival_notes_from_rows, stragglers_from_rows
from dpcore.read.analysis.trace_arrivals import trace_comm_rows
from dpcore.read.traces import workers
from dpcore.read.traces.files import json_bytes, trace_files
from dpcore.read.traces.reader import read_trace, trace_notes
from dpcore.read.traces.world import check_one_world, rank_of

#: At most this many worker processes read the ranks (a test machine has few cores).
MAX_WORKERS = 4


def _read_traces(files: list[Path]) -> Generator[pd.DataFrame, None, None]:
    """read_trace of each file, in order; large multi-file sets are read in worker processes
    (:data:`dpcore.read.traces.workers.PARALLEL_MIN_BYTES`, read at call time so that a test can
    raise it). Errors surface in file order."""
    n = min(len(files), usable_cpus(), MAX_WORKERS)
    read = read_trace if len(files) == 1 else _read_one_of_many
    if sum(json_bytes(f) for f in files) < workers.PARALLEL_MIN_BYTES:
        n = 1
    yield from workers.fork_map(read, n, files)


def _read_one_of_many(path: Path) -> pd.DataFrame:
    """read_trace of one file of several (a trace without a rank is then an error); module-level
    so that worker processes can run it."""
    return read_trace(path, only=False)


def concat_events(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Events frames of several ranks in one: ``pd.concat(frames, ignore_index=True)``, then the
    categoricals that concat turned into objects (different categories per rank) made
    categoricals again, built from the codes instead of 1M objects (same categories, same codes)."""
    if len(frames) == 1:
        return frames[0]
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
    rank, or a rank beyond :data:`~dpcore.read.traces.world.MAX_RANK`, are an error
    (:func:`~dpcore.read.traces.world.check_one_world`). Categories are unified across ranks
    (sorted when the ranks differ)."""
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
    return concat_events(frames)


def read_trace_dir(path: str | Path, iteration: int | None = None) -> pd.DataFrame:
    """All rank traces of a folder, or one trace file (see
    :func:`~dpcore.read.traces.files.trace_files`), in one DataFrame."""
    return read_trace_files(trace_files(path, iteration))


#: :func:`overlap_by_rank`'s columns.
RANK_COLUMNS = ["rank", "overlap_pct", "comm_ms", "exposed_comm_ms", "compute_ms"]


def overlap_by_rank(events: pd.DataFrame) -> pd.DataFrame:
    """Per rank over the whole trace (comparable to Holistic Trace Analysis per rank): the
    package's one overlap rule (:func:`~dpcore.read.analysis.comm_overlap.overlap_from_trace`)
    on the events with every step forgotten, so that each rank is one window, its whole trace."""
    rows = overlap_from_trace(events.assign(step=np.int64(-1)))
    return rows.rename(columns={"exposed_ms": "exposed_comm_ms"})[RANK_COLUMNS].reset_index(drop=True)


def stragglers_from_traces(events: pd.DataFrame, job_id: str = "") -> pd.DataFrame:
    """:func:`~dpcore.read.analysis.stragglers.stragglers_from_rows` of a folder's events
    (:func:`read_trace_dir`'s): its comm rows and the ranks present, all at once."""
    ranks = sorted(int(r) for r in events["rank"].unique()) if events is not None and len(events) else []
    return stragglers_from_rows(trace_comm_rows(events, job_id), ranks)


def arrival_notes(events: pd.DataFrame, world_size: int | None = None) -> list[str]:
    """:func:`~dpcore.read.analysis.stragglers.arrival_notes_from_rows` of a folder's events."""
    if events is None or events.empty:
        return []
    return arrival_notes_from_rows(trace_comm_rows(events), sorted(int(r) for r in events["rank"].unique()),
                                   world_size)
