"""One rank's trace -> the compact tables every read command needs from it.

Why: a rank of 20k-250k events is 1-45 MB of JSON and ~45 bytes per event once parsed, but what
the analysis keeps of it is small: one overlap row per traced step
(:func:`~dpcore.read.analysis.comm_overlap.overlap_from_trace`) and one row per comm event
(:func:`~dpcore.read.analysis.trace_arrivals.trace_comm_rows`, what stragglers match across ranks),
and what the Timeline draws of the rank in each traced step
(:func:`~dpcore.read.analysis.timeline.trace_lanes`: merged compute, comm events, clock-sync
markers, on the trace's own clock: a view of a few of 1,024 ranks then parses none).
All are computed per rank (each groups by rank), so reducing rank by rank and concatenating
gives the same rows as reducing all ranks' events at once: which is what lets a worker hold one
rank at a time, and the cache keep a rank's tables instead of its events.

``import_steps``, ``import_comm`` and ``import_facts`` are what ``dpcore import`` needs of a
trace (:func:`dpcore.read.importer.rows.rank_rows`: its steps and phases, its comm events, the
file's host, time span and metadata), so an import too reads each rank once, in a worker, and
never holds more than one rank's events.

``gpu``, ``gpu_causes`` and ``gpu_kernels`` are the GPU time ledger of the rank, its host idle by
cause (:func:`~dpcore.read.analysis.gpu_time.gpu_ledger`) and its GPU time by kernel class
(:func:`~dpcore.read.analysis.gpu_kernels.kernel_classes`): what ``gpu`` and summarize's GPU
columns read, empty for a CPU trace.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpcore.read.analysis.comm_overlap import TRACE_COLUMNS, overlap_from_trace
from dpcore.read.analysis.gpu_kernels import KERNEL_COLUMNS, device_name, kernel_classes
from dpcore.read.analysis.gpu_time import CAUSE_COLUMNS, LEDGER_COLUMNS, gpu_ledger
from dpcore.read.analysis.timeline import trace_lanes
from dpcore.read.analysis.trace_arrivals import TRACE_COMM_COLUMNS, trace_comm_rows
from dpcore.read.importer.rows import rank_rows
from dpcore.read.traces.reader import rank_of, read_trace_meta, trace_notes

#: The columns of a rank's comm table: trace_comm_rows' without job_id (the caller's to set).
COMM_COLUMNS = [c for c in TRACE_COMM_COLUMNS if c != "job_id"]
#: dtype of every column of the tables, so that a table read from the cache and one just
#: computed are the same frame (Parquet keeps dtypes, but an empty table has none to keep).
DTYPES: dict[str, dict[str, Any]]
DTYPES = {"overlap": {c: (np.int64 if c in ("rank", "step") else np.float64) for c in TRACE_COLUMNS},
          "comm": {"rank": np.int64, "step": np.int64, "op": object, "t_launch_ns": np.float64,
                   "t_start_ns": np.float64, "t_end_ns": np.float64, "p2p": bool, "enqueued": bool},
          "lanes": {"rank": np.int64, "step": np.int64, "lane": object, "name": object, "kind": object,
                    "start_us": np.float64, "end_us": np.float64},
          # dpcore import (dpcore.read.importer.rows: STEP_COLUMNS, COMM_COLUMNS, FACT_COLUMNS)
          "import_steps": {"rank": np.int64, "step": np.int64, "ts": np.float64, "dur": np.float64,
                           "fwd_ms": np.float64, "bwd_ms": np.float64, "opt_ms": np.float64},
          "import_comm": {"rank": np.int64, "step": np.int64, "seq": np.int64, "ts": np.float64,
                          "dur": np.float64, "op": object, "algo": object, "bytes": np.float64,
                          "arrival_ns": np.int64},
          "import_facts": {"host": object, "ts_min": np.float64, "end_max": np.float64, "ranks": object,
                           "dist_info": object, "props": np.int64, "device_names": object, "gpu": bool},
          # the GPU time ledger (dpcore.read.analysis.gpu_time): per window, and host idle per cause
          "gpu": {c: (object if c in ("window", "top_idle_cause") else bool if c == "host_bound"
                      else np.int64 if c in ("rank", "step") else np.float64) for c in LEDGER_COLUMNS},
          "gpu_causes": {c: (object if c in ("window", "cause") else np.int64 if c in ("rank", "step")
                             else np.float64) for c in CAUSE_COLUMNS},
          "gpu_kernels": {c: (object if c in ("kernel_class", "dtype", "device") else np.int64 if c in ("rank", "calls")
                              else np.float64) for c in KERNEL_COLUMNS}}


#: Tables a reduction builds only for a reader that asks for them (``need``): the Timeline's
#: lanes, import's rows and the GPU ledger. Most reads want none, and each costs 15-25 % of a first
#: read (measured on 20k-64k-event GPU ranks): the 1,024-rank first read must not pay for them.
LAZY = ("lanes", "import_steps", "import_comm", "import_facts", "gpu", "gpu_causes", "gpu_kernels")
_IMPORT_TABLES = ("import_steps", "import_comm", "import_facts")
_GPU_TABLES = ("gpu", "gpu_causes", "gpu_kernels")


#: The tables every reduction builds.
EAGER = tuple(t for t in DTYPES if t not in LAZY)


def built(need: tuple[str, ...]) -> tuple[str, ...]:
    """The tables a reduction for a reader of ``need`` builds: every eager table and the lazy
    ones in ``need`` (import's three together, the GPU tables' three together: one pass makes each group)."""
    together = [g for g in (_IMPORT_TABLES, _GPU_TABLES) if any(t in need for t in g)]
    return tuple(t for t in DTYPES if t not in LAZY or t in need or any(t in g for g in together))


def typed(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with table ``name``'s columns in order and dtypes (see DTYPES), a fresh index;
    built from numpy arrays (``astype`` per column costs ~15 ms a table, 1,024 ranks read)."""
    cols: dict[str, np.ndarray] = {}
    for c, dtype in DTYPES[name].items():
        if c not in df:
            cols[c] = np.empty(len(df), dtype=dtype)
        elif dtype is object:
            cols[c] = df[c].astype(str).to_numpy(dtype=object)
        else:
            cols[c] = df[c].to_numpy(dtype=dtype)
    return pd.DataFrame(cols, copy=False)


@dataclass
class RankTables:
    """What the read commands need of one rank's trace (see the module docstring).

    ``rank``: the trace's rank (distributedInfo, the file name, or 0 for the only trace read);
    ``world_size``: distributedInfo.world_size when the trace says; ``events``: how many events
    it had; ``notes``: the reader's notes on it (:func:`trace_notes`), one line each;
    ``built``: the tables it holds (the others are empty: not built, see :data:`LAZY`, or not
    read from the cache)."""
    rank: int
    world_size: int | None
    events: int
    notes: list[str] = field(default_factory=list)
    overlap: pd.DataFrame = field(default_factory=lambda: typed("overlap", pd.DataFrame()))
    comm: pd.DataFrame = field(default_factory=lambda: typed("comm", pd.DataFrame()))
    lanes: pd.DataFrame = field(default_factory=lambda: typed("lanes", pd.DataFrame()))
    import_steps: pd.DataFrame = field(default_factory=lambda: typed("import_steps", pd.DataFrame()))
    import_comm: pd.DataFrame = field(default_factory=lambda: typed("import_comm", pd.DataFrame()))
    import_facts: pd.DataFrame = field(default_factory=lambda: typed("import_facts", pd.DataFrame()))
    gpu: pd.DataFrame = field(default_factory=lambda: typed("gpu", pd.DataFrame()))
    gpu_causes: pd.DataFrame = field(default_factory=lambda: typed("gpu_causes", pd.DataFrame()))
    gpu_kernels: pd.DataFrame = field(default_factory=lambda: typed("gpu_kernels", pd.DataFrame()))
    built: tuple[str, ...] = tuple(DTYPES)


def _world_size(meta: dict) -> int | None:
    """``distributedInfo.world_size`` of a trace's metadata, when it is a positive integer."""
    info = meta.get("distributedInfo")
    ws = info.get("world_size") if isinstance(info, dict) else None
    return int(ws) if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None


def reduce_events(events: pd.DataFrame, rank: int, world_size: int | None = None,
                  meta: dict | None = None, tables: tuple[str, ...] = tuple(DTYPES)) -> RankTables:
    """The tables of one rank's events frame (:func:`read_trace_meta`'s, ``meta`` its top-level
    metadata): pure. ``tables``: which to build (:func:`built`); the others stay empty."""
    comm = trace_comm_rows(events)
    out = {"overlap": typed("overlap", overlap_from_trace(events)),
           "comm": typed("comm", comm.drop(columns="job_id"))}
    if "lanes" in tables:
        out["lanes"] = typed("lanes", trace_lanes(events))
    if any(t in tables for t in _IMPORT_TABLES):
        out.update({k: typed(k, v) for k, v in rank_rows(events, meta, comm).items()})
    if any(t in tables for t in _GPU_TABLES):
        ledger, causes = gpu_ledger(events)
        out.update(gpu=typed("gpu", ledger), gpu_causes=typed("gpu_causes", causes),
                   gpu_kernels=typed("gpu_kernels", kernel_classes(events, device_name(meta, events))))
    return RankTables(rank=rank, world_size=world_size, events=len(events), notes=trace_notes(events),
                      built=tuple(t for t in DTYPES if t in out), **out)


def reduce_trace(path: str | Path, only: bool = False, tables: tuple[str, ...] = tuple(DTYPES)) -> RankTables:
    """Read one rank's trace and reduce it (module-level: worker processes and Dask run it).
    ``only``: see :func:`dpcore.read.traces.reader.read_trace`; ``tables``: see
    :func:`reduce_events`. Raises TraceFormatError."""
    meta, events = read_trace_meta(path, only)
    rank = int(events["rank"].iloc[0]) if len(events) else (rank_of(meta, Path(path)) or 0)
    return reduce_events(events, rank, _world_size(meta), meta, tables)
