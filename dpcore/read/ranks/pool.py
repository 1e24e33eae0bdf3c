"""Which ranks to read and where: the cache first, then the misses in worker processes
(``--workers``) or on a Dask cluster (``--scheduler``), one rank per task.

Why one rank per task: a worker holds one rank's events at a time and hands back only its
compact tables (:mod:`dpcore.read.ranks.reduce`), so the peak memory of a read is one rank's
parse per worker plus the tables of all ranks, not the events of all ranks (which grow with the
number of ranks: 1.76 GB at 256 ranks x 20k events when they were held at once). The parent stores every
table it receives in the cache, so Dask workers need no write access to the run.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from dpcore.contract import runformat as rf
from dpcore.contract.limits import usable_cpus
from dpcore.read.analysis.comm_overlap import OVERLAP_TABLE, TRACE_COLUMNS
from dpcore.read.analysis.gpu_kernels import KERNELS_TABLE
from dpcore.read.analysis.gpu_time import GPU_CAUSES_TABLE, GPU_TABLE
from dpcore.read.analysis.lanes import LANE_EVENTS_TABLE, trace_lanes
from dpcore.read.analysis.trace_arrivals import COMM_TABLE
from dpcore.read.ranks import cache
from dpcore.read.ranks.reduce import RankTables, reduce_trace
from dpcore.read.rundir.job_traces import FALLBACK, missing_traces_noted, note_problem, untraced_noted
from dpcore.read.rundir.load import Run
from dpcore.read.traces.files import json_bytes, trace_files
from dpcore.read.traces.rank_table import RankTable
from dpcore.read.traces.reader import TraceFormatError
from dpcore.read.traces.workers import PARALLEL_MIN_BYTES, fork_map
from dpcore.read.traces.world import check_one_world

#: What a rank's read gives: its tables, or the error that names the file.
Result = RankTables | TraceFormatError

#: The tables every read that parses a rank builds, whatever it asked for: cheap beside the
#: parse, and most commands read one of them (analyze, summarize: overlap; stragglers: comm), so
#: a later command finds them cached. The others (lanes, import's rows, the GPU ledger: 15-25 %
#: of a first read each, measured on 20k-64k-event GPU ranks) are built only for a reader that
#: asks: the 1,024-rank first read must not pay for them.
EAGER: tuple[RankTable, ...] = (OVERLAP_TABLE, COMM_TABLE)
#: The GPU time ledger's tables, read together by the gpu command and view.
GPU_TABLES: tuple[RankTable, ...] = (GPU_TABLE, GPU_CAUSES_TABLE, KERNELS_TABLE)


def built(need: tuple[RankTable, ...]) -> tuple[RankTable, ...]:
    """The tables a reduction for a reader of ``need`` builds: :data:`EAGER` and ``need`` (once each)."""
    return tuple({t.name: t for t in (*EAGER, *need)}.values())


#: A Dask scheduler address dpcore accepts: tcp:// or tls:// HOST:PORT (an IPv6 host in
#: brackets), or inproc:// (a cluster in this process).
_SCHEDULER = r"(tcp|tls)://([^\s/:\[\]]+|\[[0-9A-Fa-f:.]+\]):\d{1,5}|inproc://\S+"


@dataclass(frozen=True)
class Scale:
    """How to read many ranks. ``workers``: processes parsing one rank each (None: the cores,
    used only when the misses hold 64 MB of JSON or more; 1: in this process); ``scheduler``:
    a Dask distributed scheduler's address (the misses are reduced there instead); ``cache``:
    use and fill ``cache/`` (False: read every trace, store nothing)."""
    workers: int | None = None
    scheduler: str | None = None
    cache: bool = True

    def __post_init__(self) -> None:
        if self.workers is not None and (isinstance(self.workers, bool) or int(self.workers) < 1):
            raise ValueError(f"--workers must be a whole number of processes >= 1, not {self.workers!r}")
        if self.scheduler is not None and not re.fullmatch(_SCHEDULER, self.scheduler):
            # checked here, not when first used: a read whose ranks all hit the cache never
            # contacts the scheduler, and a typo must not pass unnoticed (nor reach Dask's
            # comm layer, which fails on a scheme it has no backend for with a TypeError)
            raise ValueError(f"--scheduler must be a Dask scheduler address tcp://HOST:PORT or "
                             f"tls://HOST:PORT (e.g. tcp://127.0.0.1:8786; inproc:// for a cluster "
                             f"in this process), got {self.scheduler!r}")


def _reduce(path: str, only: bool, tables: tuple[RankTable, ...]) -> Result:
    """:func:`reduce_trace`, its TraceFormatError returned (so one bad rank fails no other task)."""
    try:
        return reduce_trace(path, only, tables)
    except TraceFormatError as exc:
        return exc


def _local(files: list[Path], only: bool, workers: int | None, tables: tuple[RankTable, ...]) -> list[Result]:
    n = min(len(files), workers or usable_cpus())
    if workers is None and sum(json_bytes(f) for f in files) < PARALLEL_MIN_BYTES:
        n = 1
    return list(fork_map(_reduce, n, [str(f) for f in files], [only] * len(files), [tables] * len(files)))


def _dask(files: list[Path], only: bool, address: str, tables: tuple[RankTable, ...]) -> list[Result]:
    """The misses reduced by a Dask distributed cluster (its workers must see the same paths)."""
    try:
        from distributed import Client
    except ImportError:
        raise ValueError("--scheduler needs Dask distributed: pip install 'dask[distributed]' "
                         "(or dpcore's extra: pip install '.[scale]')") from None
    try:
        client = Client(address, timeout=10)
    except TypeError:  # Dask's comm layer: tls:// without a TLS context in Dask's configuration
        raise ValueError(f"cannot connect to the Dask scheduler at {address}: tls:// needs Dask's TLS "
                         "configuration (distributed.comm.tls.ca-file, .client.cert and .client.key); "
                         "without it give tcp://HOST:PORT (or inproc:// for a cluster in this "
                         "process)") from None
    except (OSError, TimeoutError, ValueError) as exc:
        raise ValueError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    try:
        futures = client.map(_reduce, [str(f) for f in files], [only] * len(files), [tables] * len(files),
                             pure=False)
        return client.gather(futures)
    finally:
        client.close()


def rank_tables(files: list[Path], root: Path, scale: Scale | None = None,
                only: bool | None = None, need: tuple[RankTable, ...] = EAGER) -> list[Result]:
    """The tables of every rank trace in ``files`` (in this order): from ``root``'s cache where
    it matches, else read (see :class:`Scale`) and stored. ``root``: the run directory or the
    traces folder the files belong to. ``only``: a lone trace without a rank reads as rank 0
    (default: when ``files`` is one file). ``need``: the tables the caller uses (a cache hit
    reads only those, and the RankTables hold only those)."""
    scale = scale or Scale()
    only = len(files) == 1 if only is None else only
    out: list[Result | None] = [None] * len(files)
    if scale.cache:
        for i, hit in cache.load(root, files, only, need).items():
            out[i] = hit
    miss = [i for i, r in enumerate(out) if r is None]
    if miss:
        keys = {}
        for i in miss:
            try:
                keys[i] = cache.stat_key(files[i], only)
            except OSError:  # the read reports the file by name
                pass
        todo = [files[i] for i in miss]
        tables = built(need)
        if scale.cache:  # an eager table the cache holds for every trace read is not built again
            asked = {t.name for t in need}
            tables = tuple(t for t in tables if t.name in asked
                           or len(cache.held(root, todo, only, t)) < len(todo))
        got = (_dask(todo, only, scale.scheduler, tables) if scale.scheduler
               else _local(todo, only, scale.workers, tables))
        for i, r in zip(miss, got):
            out[i] = r
        if scale.cache:
            cache.store(root, [(files[i], only, keys[i], t) for i in miss
                               if isinstance(t := out[i], RankTables) and i in keys], tables)
    return out  # type: ignore[return-value]


def folder_tables(p: Path, scale: Scale | None = None,
                  need: tuple[RankTable, ...] = EAGER) -> list[RankTables]:
    """The reduced tables of every rank trace at ``p`` (a folder, searched recursively, or one
    file), sorted by rank, from the cache beside them where it matches (:mod:`dpcore.read.ranks`).
    TraceFormatError naming the file for a bad trace, or for two traces of one rank."""
    files = trace_files(p)
    tables: list[RankTables] = []
    found: list[tuple[Path, int, int | None]] = []
    for f, t in zip(files, rank_tables(files, p if p.is_dir() else p.parent, scale, need=need)):
        if isinstance(t, TraceFormatError):
            raise t
        if t.events:
            found.append((f, t.rank, t.world_size))
        tables.append(t)
    check_one_world(found)
    return sorted(tables, key=lambda t: t.rank)


def job_rank_tables(run: Run, scale: Scale | None = None, need: tuple[RankTable, ...] = EAGER,
                    problems: list[str] | None = None) -> Iterable[tuple[str, list[RankTables]]]:
    """(job_id, its ranks' tables) of every job with traced steps and readable, non-empty rank
    traces of all its ranks, in run.json's job order: a job with a missing or unreadable rank
    trace is left out (its numbers then come from the recorded collectives) and named in
    ``problems``. All jobs' ranks in one read."""
    jobs = []
    for job_id in run.jobs["job_id"].drop_duplicates():
        job_id = str(job_id)
        if not run.traced_steps(job_id):
            untraced_noted(run, job_id, problems)
            continue
        files = [v for k, v in sorted(run.trace_files(job_id).items()) if rf.is_rank_trace(k)]
        if not files:
            continue
        if missing_traces_noted(run, job_id, problems):
            continue
        jobs.append((job_id, files))
    flat = [f for _, files in jobs for f in files]
    results = rank_tables(flat, Path(run.path), scale, only=False, need=need) if flat else []
    at = 0
    for job_id, files in jobs:
        got, at = results[at:at + len(files)], at + len(files)
        bad = [r for r in got if isinstance(r, TraceFormatError)]
        if bad:
            note_problem(problems, f"job {job_id}: {bad[0]}; {FALLBACK}")
            continue
        ok = cast(list[RankTables], got)  # no error is left
        if not sum(r.events for r in ok):
            continue
        yield job_id, ok


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
