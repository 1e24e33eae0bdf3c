"""One rank's trace -> the compact tables its readers declared (:class:`~dpcore.read.traces.rank_table.RankTable`).

Why: a rank of 20k-250k events is 1-45 MB of JSON and ~45 bytes per event once parsed, but what
the analysis keeps of it is small: one overlap row per traced step, one row per comm event, the
events the Timeline's lanes are made from, import's rows, the GPU ledger. Each reader declares
its table beside its code (``OVERLAP_TABLE`` in comm_overlap, ``COMM_TABLE`` in trace_arrivals,
``LANE_EVENTS_TABLE`` in lanes, ``GPU_TABLE``/``GPU_CAUSES_TABLE`` in gpu_time,
``KERNELS_TABLE`` in gpu_kernels, ``IMPORT_TABLES`` in the importer's rows;
:mod:`dpcore.read.tables` hands them to the read); this module reduces a rank to whatever it is
given, without knowing the names. Every table is computed per rank (each groups by rank), so
reducing rank by rank and concatenating gives the same rows as reducing all ranks' events at
once: which is what lets a worker hold one rank at a time, and the cache keep a rank's tables
instead of its events.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dpcore.read.traces.rank_table import RankTable, columns_read, reduce_tables
from dpcore.read.traces.reader import read_trace_meta, trace_notes
from dpcore.read.traces.world import rank_of


@dataclass
class RankTables:
    """What the readers asked for of one rank's trace.

    ``rank``: the trace's rank (distributedInfo, the file name, or 0 for the only trace read);
    ``world_size``: distributedInfo.world_size when the trace says; ``events``: how many events
    it had; ``notes``: the reader's notes on it (:func:`trace_notes`), one line each;
    ``frames``: {table name: rows} of the tables it holds. A table reads as ``tables[TABLE]``
    (empty, typed, when not held) or as ``tables.<name>`` (only when held)."""
    rank: int
    world_size: int | None
    events: int
    notes: list[str] = field(default_factory=list)
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def built(self) -> tuple[str, ...]:
        """The names of the tables it holds."""
        return tuple(self.frames)

    def __getitem__(self, table: RankTable) -> pd.DataFrame:
        got = self.frames.get(table.name)
        return table.empty() if got is None else got

    def __getattr__(self, name: str) -> pd.DataFrame:
        frames = self.__dict__.get("frames")
        if name.startswith("_") or frames is None or name not in frames:
            raise AttributeError(f"{type(self).__name__} holds no table {name!r}")
        return frames[name]


def world_size_of(meta: dict) -> int | None:
    """``distributedInfo.world_size`` of a trace's metadata, when it is a positive integer."""
    info = meta.get("distributedInfo")
    ws = info.get("world_size") if isinstance(info, dict) else None
    return int(ws) if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None


def reduce_events(events: pd.DataFrame, rank: int, world_size: int | None = None,
                  meta: dict | None = None, tables: tuple[RankTable, ...] = ()) -> RankTables:
    """``tables`` of one rank's events frame (:func:`read_trace_meta`'s, ``meta`` its top-level
    metadata): pure."""
    return RankTables(rank=rank, world_size=world_size, events=len(events), notes=trace_notes(events),
                      frames=reduce_tables(tables, events, meta or {}))


def reduce_trace(path: str | Path, only: bool = False, tables: tuple[RankTable, ...] = ()) -> RankTables:
    """Read one rank's trace and reduce it to ``tables`` (module-level: worker processes and
    Dask run it). ``only``: see :func:`dpcore.read.traces.reader.read_trace`. Raises TraceFormatError."""
    meta, events = read_trace_meta(path, only, columns_read(tables))
    rank = int(events["rank"].iloc[0]) if len(events) else (rank_of(meta, Path(path)) or 0)
    return reduce_events(events, rank, world_size_of(meta), meta, tables)
