"""The declaration of a table reduced from one rank's trace: what a consumer needs of every rank.

Why: reading many ranks (:mod:`dpcore.read.ranks`) reduces each rank's events to compact
tables once and caches them; which tables, and how each is made, belongs to the code that
reads it (the overlap numbers, stragglers' comm rows, the Timeline's lanes, import's rows, the
GPU ledger), not to the cache. A consumer declares its table beside its code as a
:class:`RankTable` (a name, its columns' dtypes, the function that reduces one rank's events
to it, a version) and passes it to the read; the cache stores whatever it is given, one file per
table name, each entry keyed by the table's version too, so changing one reduction misses only
its table. Here, the lowest layer of the read wing, so that analysis and the importer can
declare and ranks can read without either importing the other.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

#: ``reduce(events, meta)``: one rank's events frame (:func:`dpcore.read.traces.reader.read_trace_meta`'s)
#: and its trace's top-level metadata -> the table's rows, or {table name: rows} for tables one
#: pass makes together (each of them declares the same function).
Reduce = Callable[[pd.DataFrame, dict[str, Any]], "pd.DataFrame | dict[str, pd.DataFrame]"]


@dataclass(frozen=True)
class RankTable:
    """One table of every rank. ``reduce`` must be a module-level function: worker processes
    and Dask workers receive the declaration pickled (by the function's name). ``version``: bump
    when ``reduce`` changes what the table holds (cache entries of another version are misses).
    ``columns``: the events frame's columns ``reduce`` reads (None: any). A read whose tables all
    say leaves out the derived columns none of them reads (:data:`DERIVED`): what a table is
    cannot change with it, only what the read costs."""
    name: str
    dtypes: Mapping[str, Any]
    reduce: Reduce
    version: int = 1
    columns: frozenset[str] | None = None

    def typed(self, df: pd.DataFrame) -> pd.DataFrame:
        """``df`` with this table's columns in order and dtypes, a fresh index: a table read from
        the cache and one just computed are the same frame (an empty table has no dtypes to keep).
        Built from numpy arrays (``astype`` per column costs ~15 ms a table, 1,024 ranks read)."""
        cols: dict[str, np.ndarray] = {}
        for c, dtype in self.dtypes.items():
            if c not in df:
                cols[c] = np.empty(len(df), dtype=dtype)
            elif dtype is object:
                cols[c] = df[c].astype(str).to_numpy(dtype=object)
            else:
                cols[c] = df[c].to_numpy(dtype=dtype)
        return pd.DataFrame(cols, copy=False)

    def empty(self) -> pd.DataFrame:
        """The table with no rows (its columns and dtypes)."""
        return self.typed(pd.DataFrame())


#: The events frame's columns that every read builds: the trace's own fields, the kind and the step.
BASE = frozenset({"ts", "dur", "name", "category", "pid", "tid", "stream", "corr", "rank", "kind", "step"})
#: The events frame's columns computed from other events (the collective and its bytes from the
#: ``record_param_comms`` range around a kernel's launch; a matrix product's FLOPs and dtype from
#: its recorded shapes): ~10 % of reading a 250k-event GPU rank, skipped when no table reads them.
DERIVED = frozenset({"collective", "bytes", "flops", "mm_dtype"})


def columns_read(tables: Iterable[RankTable]) -> frozenset[str] | None:
    """The events frame's columns that ``tables`` read together (None: any, when one does not say)."""
    out: set[str] = set()
    for t in tables:
        if t.columns is None:
            return None
        out |= t.columns
    return frozenset(out)


def reduce_tables(tables: Iterable[RankTable], events: pd.DataFrame, meta: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """{name: typed rows} of ``tables`` for one rank: each distinct ``reduce`` called once."""
    made: dict[Reduce, pd.DataFrame | dict[str, pd.DataFrame]] = {}
    out = {}
    for t in tables:
        if t.reduce not in made:
            made[t.reduce] = t.reduce(events, meta)
        got = made[t.reduce]
        out[t.name] = t.typed(got[t.name] if isinstance(got, dict) else got)
    return out

