"""The rank tables dpcore's readers declare, and the reads that hand them to :mod:`dpcore.read.ranks`.

:mod:`dpcore.read.ranks` is the generic machinery: it reduces, caches and loads whatever
:class:`~dpcore.read.traces.rank_table.RankTable` declarations it is handed, and knows none by
name. Which tables exist, which are built at every parse and which reader combines which tables
is the consumers' knowledge, so it lives here, one module above both:

- :data:`EAGER`: the tables every parse builds, whatever it was asked for (handed to every read
  below as ``eager``), and :data:`GPU_TABLES`, the GPU time ledger's group;
- :func:`rank_tables`, :func:`folder_tables`, :func:`job_rank_tables`: the ranks reads with
  :data:`EAGER` handed in (what every command and view calls);
- the per-consumer reads: the overlap rows (:func:`run_trace_steps`), the GPU ledger
  (:func:`run_gpu`, :func:`folder_gpu`, :func:`run_steps_gpu`) and the Timeline's lanes
  (:func:`job_lane_events`, :func:`job_lanes`).

Why here and not beside the analyses that declare the tables: these functions read a run (or a
traces folder) from disk, through the cache, and analysis/ is pure pandas on frames it is given;
nor in ranks/, which would then import every analysis module (ranks/ must stay generic: a new
reader declares its table and hands it in, without touching ranks/). Not in report/ either: the
dashboard and the importer read the same tables, and report/ is the CLI's text.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from dpcore.contract import runformat as rf
from dpcore.read.analysis.comm_overlap import OVERLAP_TABLE, TRACE_COLUMNS
from dpcore.read.analysis.gpu_kernels import KERNELS_TABLE
from dpcore.read.analysis.gpu_time import GPU_CAUSES_TABLE, GPU_TABLE
from dpcore.read.analysis.lanes import LANE_EVENTS_TABLE, trace_lanes
from dpcore.read.analysis.trace_arrivals import COMM_TABLE
from dpcore.read.ranks import RankTables, Scale, pool
from dpcore.read.ranks.pool import Result
from dpcore.read.rundir.job_traces import FALLBACK, missing_traces_noted, note_problem
from dpcore.read.rundir.load import Run
from dpcore.read.traces.files import trace_files
from dpcore.read.traces.rank_table import RankTable
from dpcore.read.traces.reader import TraceFormatError
from dpcore.read.traces.world import check_one_world

#: The tables every read that parses a rank builds, whatever it asked for: cheap beside the
#: parse, and most commands read one of them (analyze, summarize: overlap; stragglers: comm), so
#: a later command finds them cached. The others (lane events, import's rows, the GPU ledger:
#: 15-25 % of a first read each, measured on 20k-64k-event GPU ranks) are built only for a reader
#: that asks: the 1,024-rank first read must not pay for them. A read that misses only another
#: table does not build these again where the cache holds them.
EAGER: tuple[RankTable, ...] = (OVERLAP_TABLE, COMM_TABLE)
#: The GPU time ledger's tables, read together by the gpu command and view.
GPU_TABLES: tuple[RankTable, ...] = (GPU_TABLE, GPU_CAUSES_TABLE, KERNELS_TABLE)


def rank_tables(files: list[Path], root: Path, scale: Scale | None = None, only: bool | None = None,
                need: tuple[RankTable, ...] = EAGER) -> list[Result]:
    """:func:`dpcore.read.ranks.pool.rank_tables` with :data:`EAGER` built on a miss."""
    return pool.rank_tables(files, root, scale, only, need, eager=EAGER)


def folder_tables(p: Path, scale: Scale | None = None, need: tuple[RankTable, ...] = EAGER) -> list[RankTables]:
    """:func:`dpcore.read.ranks.pool.folder_tables` with :data:`EAGER` built on a miss."""
    return pool.folder_tables(p, scale, need, eager=EAGER)


def job_rank_tables(run: Run, scale: Scale | None = None, need: tuple[RankTable, ...] = EAGER,
                    problems: list[str] | None = None) -> Iterable[tuple[str, list[RankTables]]]:
    """:func:`dpcore.read.ranks.pool.job_rank_tables` with :data:`EAGER` built on a miss."""
    return pool.job_rank_tables(run, scale, need, problems, eager=EAGER)


def job_lane_events(run: Run, job_id: str, ranks: Iterable[int] | None = None, scale: Scale | None = None,
                    problems: list[str] | None = None) -> list[pd.DataFrame] | None:
    """The ``lane_events`` tables (:data:`dpcore.read.analysis.lanes.LANE_EVENTS_TABLE`) of a job's
    rank traces (only those of ``ranks`` when given: a view draws a few of 1,024 ranks), one frame
    per trace in the files' order, from the cache (a hit reads that table only, and parses no
    trace): what the lanes of any step are reduced from. None where the job has no rank trace,
    lacks one of its ranks' traces, or one is unreadable or two are of one rank (a line naming
    the file goes to ``problems``); or its traces hold no event."""
    want = None if ranks is None else {f"rank{int(r)}" for r in ranks}
    files = [v for k, v in sorted(run.trace_files(job_id).items())
             if rf.is_rank_trace(k) and (want is None or k in want)]
    if not files or missing_traces_noted(run, job_id, problems):
        return None
    got = rank_tables(files, Path(run.path), scale, only=False, need=(LANE_EVENTS_TABLE,))
    try:
        for r in got:
            if isinstance(r, TraceFormatError):
                raise r
        check_one_world([(f, r.rank, r.world_size) for f, r in zip(files, got)
                         if isinstance(r, RankTables) and r.events])
    except TraceFormatError as exc:
        note_problem(problems, f"job {job_id}: {exc}; {FALLBACK}")
        return None
    ok = cast(list[RankTables], got)  # an error returned above
    if not sum(r.events for r in ok):
        return None
    return [r[LANE_EVENTS_TABLE] for r in ok]


def job_lanes(run: Run, job_id: str, ranks: Iterable[int] | None = None, scale: Scale | None = None,
              problems: list[str] | None = None, steps: Iterable[int] | None = None) -> pd.DataFrame | None:
    """The lanes table (:func:`dpcore.read.analysis.lanes.trace_lanes`) of a job's rank traces
    (only those of ``ranks`` when given), of the traced ``steps`` only when given (the Timeline
    draws one: a 30,000-step trace's other steps are never reduced), one frame: the ``lanes``
    argument of :func:`dpcore.read.analysis.timeline.timeline`. Reduced from
    :func:`job_lane_events` (the cache; None where that is None)."""
    events = job_lane_events(run, job_id, ranks, scale, problems)
    if events is None:
        return None
    wanted = None if steps is None else [int(s) for s in steps]
    return pd.concat([trace_lanes(ev, wanted) for ev in events], ignore_index=True)


def run_trace_steps(run: Run, scale: Scale | None = None, problems: list[str] | None = None) -> pd.DataFrame:
    """Per (job, rank, traced step) overlap of every traced job: the frame of
    overlap_from_trace of each job's events (the same rows), from the cache.
    ``problems``: one line per job left out, naming the file (:func:`job_rank_tables`)."""
    return _trace_steps(job_rank_tables(run, scale, (OVERLAP_TABLE,), problems))


def run_steps_gpu(run: Run, scale: Scale | None = None,
                  problems: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(:func:`run_trace_steps`, the ledger of :func:`run_gpu`) of a run from ONE read of its rank
    tables: what ``summarize`` needs (a trace read is its cost; reading twice would pay it twice)."""
    pairs = list(job_rank_tables(run, scale, (OVERLAP_TABLE, *GPU_TABLES), problems))
    return _trace_steps(pairs), _with_job([(j, t[GPU_TABLE]) for j, tables in pairs
                                           for t in sorted(tables, key=lambda t: t.rank)], GPU_TABLE)


def _trace_steps(pairs: Iterable[tuple[str, list[RankTables]]]) -> pd.DataFrame:
    """The overlap tables of (job_id, ranks' tables) pairs as one frame with job_id (see run_trace_steps)."""
    frames, jobs = [], []
    for job_id, tables in pairs:
        for t in sorted(tables, key=lambda t: t.rank):  # by rank, as a groupby
            overlap = t[OVERLAP_TABLE]
            if len(overlap):
                frames.append(overlap)
                jobs.append((job_id, len(overlap)))
    if not frames:
        return pd.DataFrame(columns=["job_id", *TRACE_COLUMNS])
    out = pd.concat(frames, ignore_index=True)  # one job_id column for all (1,024 assigns cost 0.5 s)
    out["job_id"] = np.repeat(np.array([j for j, _ in jobs], dtype=object), [n for _, n in jobs])
    return out[[*TRACE_COLUMNS, "job_id"]]


def _with_job(frames: list[tuple[str, pd.DataFrame]], table: RankTable) -> pd.DataFrame:
    """The frames (of rank table ``table``) as one, each row led by its job_id."""
    parts = [df.assign(job_id=job) for job, df in frames if len(df)]
    if not parts:
        return table.empty().assign(job_id=pd.Series(dtype=object))[["job_id", *table.dtypes]]
    out = pd.concat(parts, ignore_index=True)
    return out[["job_id", *[c for c in out.columns if c != "job_id"]]]


def run_gpu(run: Run, scale: Scale | None = None,
            problems: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(ledger, causes, kernels) of the GPU time ledger (:func:`dpcore.read.analysis.gpu_time.gpu_ledger`)
    and the kernel counts (:func:`dpcore.read.analysis.gpu_kernels.kernel_counts`, unrated) of every traced
    job of a run, a leading job_id column, from the cache (the lazy ``gpu``, ``gpu_causes`` and
    ``gpu_kernels`` tables). Jobs without GPU events have no rows; ``problems``: as
    :func:`job_rank_tables`."""
    led, cau, ker = [], [], []
    for job_id, tables in job_rank_tables(run, scale, GPU_TABLES, problems):
        for t in sorted(tables, key=lambda t: t.rank):
            led.append((job_id, t[GPU_TABLE]))
            cau.append((job_id, t[GPU_CAUSES_TABLE]))
            ker.append((job_id, t[KERNELS_TABLE]))
    return _with_job(led, GPU_TABLE), _with_job(cau, GPU_CAUSES_TABLE), _with_job(ker, KERNELS_TABLE)


def folder_gpu(p: Path, scale: Scale | None = None
               ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """(ledger, causes, kernels, reader notes) of every trace at ``p`` (a folder, searched recursively, or
    one file). Each folder that holds traces is a job, named by its path under ``p`` (``p``'s own
    name for the traces directly in it): a job's traces folder is one job, a run's ``traces/``
    folder one job per sub-folder. TraceFormatError naming the file for a bad trace, or for two
    traces of one rank in one folder."""
    files = trace_files(p)
    root = p if p.is_dir() else p.parent
    groups: dict[Path, list[int]] = {}
    for i, f in enumerate(files):
        groups.setdefault(f.parent, []).append(i)
    only = all(len(ix) == 1 for ix in groups.values())
    got = rank_tables(files, root, scale, only=only, need=GPU_TABLES)
    led, cau, ker, notes = [], [], [], []
    for parent, ix in groups.items():
        job = root.name if parent == root else parent.relative_to(root).as_posix()
        mine = sorted(ix, key=lambda i: getattr(got[i], "rank", 0))
        for i in mine:
            if isinstance(t := got[i], TraceFormatError):
                raise t
        check_one_world([(files[i], t.rank, t.world_size) for i in mine if (t := cast(RankTables, got[i])).events])
        for i in mine:
            t = cast(RankTables, got[i])
            led.append((job, t[GPU_TABLE]))
            cau.append((job, t[GPU_CAUSES_TABLE]))
            ker.append((job, t[KERNELS_TABLE]))
            notes += t.notes
    return _with_job(led, GPU_TABLE), _with_job(cau, GPU_CAUSES_TABLE), _with_job(ker, KERNELS_TABLE), notes
