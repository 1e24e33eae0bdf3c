"""One torch.profiler Chrome trace file -> one events DataFrame with a ``kind`` per event.

Reading one file is here (its columns, its rank, a merged trace's several ranks); what each
event counts as (compute, comm, memcpy, sync, other) and which step it belongs to is decided in
:mod:`dpcore.read.traces.kinds`, whose docstring gives the rules; which collective a comm kernel
runs and its bytes in :mod:`dpcore.read.traces.collectives`. Which files of a folder are rank
traces is :mod:`dpcore.read.traces.files`; which rank a file is and whether files can be one
job's ranks, :mod:`dpcore.read.traces.world`; worker processes, :mod:`dpcore.read.traces.workers`.
Many ranks are read one rank at a time into tables (:mod:`dpcore.read.ranks`), never into one
frame of every rank's events.

Where a trace needed one of those rules (no rank, no steps, legacy categories, kernels launched
before the trace began), the frame says so in ``attrs["notes"]`` (one line each, naming the
file): every command that reads traces prints them, so a number is never silently re-based.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpcore.contract.tracefile import DEVICE_CATS, TraceFormatError
from dpcore.read.traces.collectives import collective_meta
from dpcore.read.traces.columns import Columns, read_columns
from dpcore.read.traces.kinds import KINDS, STEP_RE, classify
from dpcore.read.traces.matmuls import kernel_matmuls
from dpcore.read.traces.world import merged_ranks, rank_of

__all__ = ["TraceFormatError", "events_frame", "on_host", "read_trace", "read_trace_meta", "step_ranges",
           "trace_notes"]


def _codes_to_cat(codes: np.ndarray, table: list[Any]) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=pd.Index(table, dtype=object))


def _subset(cols: Columns, keep: np.ndarray) -> Columns:
    """The events of ``cols`` where ``keep`` (codes still index the whole file's tables)."""
    return Columns(cols.ts[keep], cols.dur[keep], cols.corr[keep], cols.stream[keep],
                   {f: c[keep] for f, c in cols.codes.items()}, cols.tables,
                   {f: n[keep] for f, n in cols.nums.items()})


def _no_rank(path: Path) -> TraceFormatError:
    return TraceFormatError(f"cannot tell the rank of trace {path}: no distributedInfo.rank and no "
                            f"'rank<r>' in the file name, and it is not the only trace read")


def events_frame(meta: dict[str, Any], cols: Columns, rank: int, columns: frozenset[str] | None = None) -> pd.DataFrame:
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
        "kind": pd.Categorical.from_codes(kind, categories=pd.Index(list(KINDS))),
        "step": step, **derived,
    }, copy=False)
    df.attrs["notes"] = notes
    return df


def read_trace_meta(path: str | Path, only: bool = True,
                    columns: frozenset[str] | None = None) -> tuple[dict[str, Any], pd.DataFrame]:
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
    """The notes :func:`read_trace` (and the ranks' reduction, :mod:`dpcore.read.ranks`) left on a frame
    (see the module docstring)."""
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
        per_num = per.str.extract("^" + STEP_RE.pattern, expand=False).to_numpy(dtype=object)
        num = pd.Series(per_num[names.cat.codes.to_numpy()], index=host.index, dtype=object)
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
