"""Opening run directories: run.json and the CSV tables into a `Run` (load.py, the only reader of
run files), and a job's rank traces as events frames (job_traces.py, through `dpcore.read.traces`).
"""
from __future__ import annotations

from dpcore.read.rundir.job_traces import job_trace_events, step_trace_events, traced_job_events
from dpcore.read.rundir.load import Run, RunLoadError, list_runs, load_run

__all__ = ["Run", "RunLoadError", "load_run", "list_runs", "job_trace_events", "traced_job_events",
           "step_trace_events"]
