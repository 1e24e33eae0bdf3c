"""Opening run directories: run.json and the CSV tables into a `Run` (load.py, the only reader of
run files), and which of a job's rank traces a read may use (job_traces.py).
"""
from __future__ import annotations

from dpcore.read.rundir.load import Run, RunLoadError, list_runs, load_run

__all__ = ["Run", "RunLoadError", "load_run", "list_runs"]
