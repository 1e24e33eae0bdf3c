"""A job's torch.profiler traces, read from its run directory: the loading half of the trace
metrics and of the timeline (their pure halves are in :mod:`dpcore.read.analysis.timeline`).

Why here and not in analysis: which files of a run are a job's rank traces and which steps they
cover is run-directory knowledge (:meth:`Run.trace_files`, :meth:`Run.traced_steps`), and reading
them is disk access; the analysis only ever receives the events frames these return.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import pandas as pd

from dpcore.read.rundir.load import Run
from dpcore.read.traces.reader import TraceFormatError, read_trace_files


def job_trace_events(run: Run, job_id: str, ranks: Iterable[int] | None = None) -> pd.DataFrame | None:
    """All rank traces of one job (only those of ``ranks`` when given: a view of a few of 1,024
    ranks reads a few traces) as one events frame, or None when the job has no rank trace or
    one is unreadable. Read it once per job and pass it to
    :func:`dpcore.read.analysis.timeline.timeline` for every step, instead of re-reading the
    traces per step."""
    want = None if ranks is None else {f"rank{int(r)}" for r in ranks}
    files = [v for k, v in sorted(run.trace_files(job_id).items())
             if k.startswith("rank") and (want is None or k in want)]
    if not files:
        return None
    try:
        return read_trace_files(files)  # the reader of read_trace_dir, on the run's rank files
    except TraceFormatError:
        return None


def traced_job_events(run: Run) -> Iterator[tuple[str, pd.DataFrame]]:
    """(job_id, events) of every job of the run that has traced steps and readable, non-empty
    rank traces, in run.json's job order: the input of
    :func:`dpcore.read.analysis.timeline.trace_step_metrics`. A generator, so one job's events
    (up to millions of rows) are held at a time. A job whose traces are missing or unreadable
    is left out (its numbers then come from the recorded collectives)."""
    for job_id in run.jobs["job_id"]:
        if not run.traced_steps(str(job_id)):
            continue
        events = job_trace_events(run, str(job_id))
        if events is not None and not events.empty:
            yield str(job_id), events


def step_trace_events(run: Run, job_id: str, step: int) -> pd.DataFrame | None:
    """The job's trace events when ``step`` is traced (:meth:`Run.traced_steps`), else None:
    the ``events`` argument of :func:`dpcore.read.analysis.timeline.timeline` for one step."""
    return job_trace_events(run, job_id) if step in run.traced_steps(job_id) else None
