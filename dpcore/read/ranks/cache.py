"""A rank's reduced tables on disk: ``cache/`` beside the run (or the traces folder), Parquet.

Why: every ``summarize``, ``analyze``, ``stragglers``, ``whatif`` and the dashboard's first open
otherwise re-read every rank's trace (the parse is 95 % of their time). The first read of a rank
stores its :class:`~dpcore.read.ranks.tables.RankTables` here; a later read whose trace has the
same size and mtime, read by the same reduction (:data:`CACHE_VERSION`), loads them instead.

Never authoritative: deleting ``cache/`` changes no number (tests compare the two paths), a
cache file that cannot be read is a miss, and one that cannot be written is skipped (the read
goes on). Where the folder is not writable (someone else's traces) the cache lives in the user's
cache directory (``$XDG_CACHE_HOME/dpcore``, else ``~/.cache/dpcore``), one folder per traces
folder. Nothing is pickled: one Parquet file per table per folder (``ranks``: rank, world size,
events and notes of each trace; one per table of :data:`TABLES` (``overlap``, ``comm``, the
``import_*`` tables): every trace's rows, a ``_trace`` column naming it), each listing the
traces it holds and their keys in its schema metadata (JSON). One file per table, not per
rank: reading 1,024 small files costs more than the rows in them. Without pyarrow there is no
cache (the same numbers, read every time).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.read.ranks.tables import DTYPES, RankTables, typed

TABLES = tuple(DTYPES)

#: Bump when the reader or the reduction changes what a rank's tables hold: every cache entry
#: written by an older version is then a miss. 2: the ``lanes`` and ``import_*`` tables. 3: gloo's spans
#: are comm in a GPU trace without NCCL kernels (gloo over CUDA tensors). 4: the lanes' ``kind``
#: column and GPU ranks' launch-thread and stream lanes. 5: the GEMMs' FLOPs, TFLOP/s and MFU in
#: ``gpu_kernels`` (the reader keeps matrix products' shapes).
CACHE_VERSION = 5
CACHE_DIR = "cache"
_META = b"dpcore"


def _pa():
    """pyarrow and its Parquet module, or None where pyarrow is not installed (no cache)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    return pa, pq


def trace_key(path: Path, only: bool) -> list:
    """What must match for a cache entry to stand for ``path``: size, mtime (ns), the version,
    and ``only`` (a lone trace without a rank reads as rank 0; one of several is an error)."""
    st = path.stat()
    return [int(st.st_size), int(st.st_mtime_ns), CACHE_VERSION, bool(only)]


def user_cache_dir(root: Path) -> Path:
    """The user's cache folder for the traces under ``root`` (when ``root`` is not writable)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpcore"
    return base / hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16]


def cache_dir(root: Path) -> Path:
    """``root/cache`` where root is writable, else :func:`user_cache_dir`; under
    ``$DPCORE_CACHE_DIR`` (one folder per ``root``) when that is set: a test suite or a read-only
    deployment keeps every cache out of the folders it reads."""
    if os.environ.get("DPCORE_CACHE_DIR"):
        return Path(os.environ["DPCORE_CACHE_DIR"]) / hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16]
    here = root / CACHE_DIR
    if os.access(here if here.is_dir() else root, os.W_OK):
        return here
    return user_cache_dir(root)


def _name(root: Path, trace: Path) -> str:
    """How the cache names a trace: its path under ``root`` (its absolute path when outside)."""
    try:
        return trace.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:  # a trace outside root (a symlink)
        return str(trace.resolve())


def _path(root: Path, table: str) -> Path:
    return cache_dir(root) / f"{table}.parquet"


def _read(pq, root: Path, table: str) -> tuple[dict[str, list], object]:
    """({trace name: key} of the entries a table file holds, the pyarrow table), or ({}, None)."""
    try:
        t = pq.read_table(_path(root, table))
        entries = json.loads((t.schema.metadata or {}).get(_META, b"{}"))
    except (OSError, ValueError, KeyError, TypeError):  # missing, truncated or foreign: all misses
        return {}, None
    return (entries, t) if isinstance(entries, dict) else ({}, None)


def _split(df: pd.DataFrame, names: pd.Series) -> dict[str, pd.DataFrame]:
    """{trace name: its rows} of a table whose rows are stored trace by trace (contiguous), by
    slicing: a groupby of 1,024 traces costs more than reading them."""
    names = names.to_numpy()
    if not len(names):
        return {}
    cut = np.flatnonzero(names[1:] != names[:-1]) + 1
    starts, ends = np.r_[0, cut], np.r_[cut, len(names)]
    return {names[a]: df.iloc[a:b].reset_index(drop=True) for a, b in zip(starts, ends)}


def load(root: Path, traces: list[Path], only: bool, need: tuple[str, ...] = TABLES) -> dict[int, RankTables]:
    """{position in ``traces``: cached tables} of the traces whose entry matches :func:`trace_key`
    in every table of ``need`` (the others stay empty in the RankTables: not read)."""
    mods = _pa()
    if mods is None or not traces:
        return {}
    _, pq = mods
    want: dict[str, tuple[int, list]] = {}
    for i, f in enumerate(traces):
        try:
            want[_name(root, f)] = (i, trace_key(f, only))
        except OSError:
            continue
    entries, info = _read(pq, root, "ranks")
    hits = {n for n, (_, k) in want.items() if entries.get(n) == k}
    frames: dict[str, pd.DataFrame] = {}
    for table in need:
        got, t = _read(pq, root, table)
        hits = {n for n in hits if got.get(n) == entries[n]}
        if hits and t is not None:
            frames[table] = t.to_pandas()
    if not hits or info is None:
        return {}
    ranks = info.to_pandas()
    ranks = ranks[ranks["_trace"].isin(hits)]
    parts = {table: _split(typed(table, df[df["_trace"].isin(hits)]), df.loc[df["_trace"].isin(hits), "_trace"])
             for table, df in frames.items()}
    out = {}
    empty = {k: typed(k, pd.DataFrame()) for k in TABLES}  # one shared empty frame per table: not read
    held = tuple(t for t in TABLES if t in frames)
    for name, rank, ws, events, notes in zip(ranks["_trace"], ranks["rank"], ranks["world_size"],
                                             ranks["events"], ranks["notes"]):
        tables = {table: parts[table].get(name, empty[table]) if table in parts else empty[table] for table in TABLES}
        out[want[name][0]] = RankTables(rank=int(rank), world_size=None if ws < 0 else int(ws), events=int(events),
                                        notes=json.loads(notes), built=held, **tables)
    return out


def store(root: Path, entries: list[tuple[Path, bool, list, RankTables]]) -> bool:
    """Add (trace, only, key, tables) entries to ``root``'s cache (``key``: :func:`trace_key` taken
    *before* the trace was read, so a trace rewritten meanwhile misses next time), keeping the
    other traces' entries. Each table file is rewritten to a temporary name and renamed; a table
    file lists the entries it holds, so a reader never pairs tables of different writers. False
    where it could not be written (the read goes on)."""
    mods = _pa()
    if mods is None or not entries:
        return False
    pa, pq = mods
    new = {_name(root, f): (key, t) for f, _, key, t in entries}
    rows = pd.DataFrame({"_trace": list(new), "rank": [t.rank for _, t in new.values()],
                         "world_size": [-1 if t.world_size is None else t.world_size for _, t in new.values()],
                         "events": [t.events for _, t in new.values()],
                         "notes": [json.dumps(t.notes) for _, t in new.values()]})
    try:
        d = cache_dir(root)
        d.mkdir(parents=True, exist_ok=True)
        for table in ("ranks", *TABLES):
            # a table this read did not build (tables.LAZY) keeps its entries of the same key
            mine = new if table == "ranks" else {n: v for n, v in new.items() if table in v[1].built}
            old, t = _read(pq, root, table)
            keep = {n: k for n, k in old.items() if n not in mine and (n not in new or new[n][0] == k)}
            if not mine and (len(keep) == len(old)):
                continue  # nothing to add, nothing stale to drop
            df = rows if table == "ranks" else pd.concat(
                [getattr(tb, table).assign(_trace=n) for n, (_, tb) in mine.items()]
                or [typed(table, pd.DataFrame()).assign(_trace=pd.Series(dtype=object))], ignore_index=True)
            if t is not None and keep:
                prev = t.to_pandas()
                df = pd.concat([prev[prev["_trace"].isin(keep)], df], ignore_index=True)
            meta = json.dumps({**keep, **{n: k for n, (k, _) in mine.items()}}).encode()
            at = pa.Table.from_pandas(df, preserve_index=False)
            at = at.replace_schema_metadata({**(at.schema.metadata or {}), _META: meta})
            f = _path(root, table)
            tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
            pq.write_table(at, tmp)
            os.replace(tmp, f)
    except (OSError, ValueError, TypeError):
        return False
    return True
