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

from dpcore.contract import runformat as rf
from dpcore.contract.limits import usable_cpus
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

def built(need: tuple[RankTable, ...], eager: tuple[RankTable, ...] = ()) -> tuple[RankTable, ...]:
    """The tables a reduction for a reader of ``need`` builds: ``eager`` and ``need`` (once each)."""
    return tuple({t.name: t for t in (*eager, *need)}.values())


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
                only: bool | None = None, need: tuple[RankTable, ...] = (),
                eager: tuple[RankTable, ...] = ()) -> list[Result]:
    """The tables of every rank trace in ``files`` (in this order): from ``root``'s cache where
    it matches, else read (see :class:`Scale`) and stored. ``root``: the run directory or the
    traces folder the files belong to. ``only``: a lone trace without a rank reads as rank 0
    (default: when ``files`` is one file). ``need``: the tables the caller uses (a cache hit
    reads only those, and the RankTables hold only those). ``eager``: tables a miss builds and
    stores too (unless the cache holds them for every trace it reads), for later readers: the
    caller's declarations (:data:`dpcore.read.tables.EAGER`), never chosen here."""
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
        tables = built(need, eager)
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
                  need: tuple[RankTable, ...] = (), eager: tuple[RankTable, ...] = ()) -> list[RankTables]:
    """The reduced tables of every rank trace at ``p`` (a folder, searched recursively, or one
    file), sorted by rank, from the cache beside them where it matches (:mod:`dpcore.read.ranks`).
    TraceFormatError naming the file for a bad trace, or for two traces of one rank. ``need``,
    ``eager``: as :func:`rank_tables`."""
    files = trace_files(p)
    tables: list[RankTables] = []
    found: list[tuple[Path, int, int | None]] = []
    for f, t in zip(files, rank_tables(files, p if p.is_dir() else p.parent, scale, need=need, eager=eager)):
        if isinstance(t, TraceFormatError):
            raise t
        if t.events:
            found.append((f, t.rank, t.world_size))
        tables.append(t)
    check_one_world(found)
    return sorted(tables, key=lambda t: t.rank)


def job_rank_tables(run: Run, scale: Scale | None = None, need: tuple[RankTable, ...] = (),
                    problems: list[str] | None = None,
                    eager: tuple[RankTable, ...] = ()) -> Iterable[tuple[str, list[RankTables]]]:
    """(job_id, its ranks' tables) of every job with traced steps and readable, non-empty rank
    traces of all its ranks, in run.json's job order: a job with a missing or unreadable rank
    trace is left out (its numbers then come from the recorded collectives) and named in
    ``problems``. All jobs' ranks in one read. ``need``, ``eager``: as :func:`rank_tables`."""
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
    results = rank_tables(flat, Path(run.path), scale, only=False, need=need, eager=eager) if flat else []
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
