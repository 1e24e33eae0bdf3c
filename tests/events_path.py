"""The events path, for tests only: a job's rank traces read whole into one events frame, and what
the analysis makes of such frames directly.

Why it is here and not in the package: every command and view reads traces through the per-rank
tables (:mod:`dpcore.read.ranks`: each rank reduced to the tables its readers declare, cached).
Reading all ranks' events at once is the independent reference those tables are checked
against: the same rows must come out of both (tests/read/ranks, the golden outputs).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import pandas as pd

from dpcore.contract import runformat as rf
from dpcore.read.analysis.comm_overlap import TRACE_COLUMNS, overlap_from_trace
from dpcore.read.analysis.lanes import trace_lanes
from dpcore.read.rundir.job_traces import FALLBACK, missing_traces_noted, note_problem, untraced_noted
from dpcore.read.rundir.load import Run
from dpcore.read.traces.reader import TraceFormatError
from tests.trace_helpers import read_trace_files


def job_trace_events(run: Run, job_id: str, problems: list[str] | None = None,
                     ranks: Iterable[int] | None = None) -> pd.DataFrame | None:
    """All rank traces of one job (only those of ``ranks`` when given: a view of a few of 1,024
    ranks reads a few traces) as one events frame, or None when the job has no rank trace,
    lacks one of its ranks' traces or one is unreadable (then a line naming the file goes to
    ``problems``). Read it once per job and pass it to
    :func:`dpcore.read.analysis.timeline.timeline` for every step, instead of re-reading the
    traces per step."""
    want = None if ranks is None else {f"rank{int(r)}" for r in ranks}
    files = [v for k, v in sorted(run.trace_files(job_id).items())
             if rf.is_rank_trace(k) and (want is None or k in want)]
    if not files:
        return None
    if missing_traces_noted(run, job_id, problems):
        return None
    try:
        return read_trace_files(files)  # the reader of read_trace_dir, on the run's rank files
    except TraceFormatError as exc:
        note_problem(problems, f"job {job_id}: {exc}; {FALLBACK}")
        return None


def traced_job_events(run: Run, problems: list[str] | None = None) -> Iterator[tuple[str, pd.DataFrame]]:
    """(job_id, events) of every job of the run that has traced steps and readable, non-empty
    rank traces of all its ranks, in run.json's job order: the input of
    :func:`dpcore.read.analysis.timeline.trace_step_metrics`. A generator, so one job's events
    (up to millions of rows) are held at a time. A job whose traces are missing or unreadable
    is left out (its numbers then come from the recorded collectives) and named in ``problems``."""
    for job_id in run.jobs["job_id"].drop_duplicates():
        if not run.traced_steps(str(job_id)):
            untraced_noted(run, str(job_id), problems)
            continue
        events = job_trace_events(run, str(job_id), problems)
        if events is not None and not events.empty:
            yield str(job_id), events


def step_trace_events(run: Run, job_id: str, step: int,
                      problems: list[str] | None = None) -> pd.DataFrame | None:
    """The job's trace events when ``step`` is traced (:meth:`Run.traced_steps`), else None:
    the ``events`` argument of :func:`dpcore.read.analysis.timeline.timeline` for one step."""
    return job_trace_events(run, job_id, problems) if step in run.traced_steps(job_id) else None


def trace_step_metrics(job_events: Iterable[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """Per (job, rank, traced step) overlap from every traced job's events, as
    :func:`overlap_from_trace` rows with a ``job_id`` column (what
    :func:`dpcore.read.tables.run_trace_steps` gives from the rank tables). ``job_events``:
    (job_id, events) pairs, :func:`traced_job_events` of a run."""
    frames = []
    for job_id, events in job_events:
        frames.append(overlap_from_trace(events).assign(job_id=str(job_id)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["job_id", *TRACE_COLUMNS])


def lanes_of(events: pd.DataFrame | None) -> pd.DataFrame | None:
    """The lanes table of an events frame (the ``lanes`` of
    :func:`dpcore.read.analysis.timeline.timeline`), None for no events."""
    return None if events is None or events.empty else trace_lanes(events)


def step_trace_lanes(run: Run, job_id: str, step: int) -> pd.DataFrame | None:
    """:func:`lanes_of` the job's events when ``step`` is traced, else None."""
    return lanes_of(step_trace_events(run, job_id, step))
