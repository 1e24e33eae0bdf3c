"""What ``python -m dpcore analyze PATH [--csv]`` prints: overlap per rank, per traced step.

The CLI and the dashboard show the same numbers because both call the same analysis functions
(:mod:`dpcore.read.analysis.metrics`); this module only loads PATH and lays the rows out.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from dpcore.read.analysis.comm_overlap import overlap_from_trace
from dpcore.read.analysis.metrics import rank_metrics, step_metrics, trace_rows
from dpcore.read.analysis.timeline import trace_step_metrics
from dpcore.read.report.resolve import load_run_reporting, resolve
from dpcore.read.report.tables import csv_table, text_table
from dpcore.read.rundir.job_traces import traced_job_events
from dpcore.read.rundir.load import RunLoadError
from dpcore.read.traces.reader import TraceFormatError, read_trace_dir, trace_notes

#: docs/DESIGN.md's columns of `analyze --csv` (ms per traced step), then how many steps they cover.
ANALYZE_COLUMNS = ["rank", "overlap_pct", "comm_ms", "exposed_comm_ms", "compute_ms", "steps"]


def _trace_folder_ranks(trace_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """Per rank over the steps of a folder of traces (the whole trace as one step when it has no
    ProfilerStep markers), and the reader's notes on the traces (the rules they needed)."""
    try:
        events = read_trace_dir(trace_dir)
    except TraceFormatError as exc:
        raise ValueError(str(exc)) from None
    return rank_metrics(trace_rows(overlap_from_trace(events)), "trace"), trace_notes(events)


def analyze(path: str, csv: bool = False) -> str:
    """Per-rank overlap % (HTA definition), comm, exposed comm and compute, per traced step.

    PATH is a folder of per-rank torch.profiler traces (ours or foreign; searched recursively,
    see :func:`dpcore.read.traces.reader.trace_files`), one trace file, or a run directory; for
    a run directory every job with traces is analysed (on the steps steps.csv marks profiled:
    the rows `summarize` uses, so its overlap of a job is the mean over ranks of these) and CSV
    rows gain a leading job_id column. ms columns are means per step; ``steps`` says how many.
    Raises ValueError (RunLoadError for broken runs) with a one-line message.
    """
    p, kind = resolve(path)
    if kind == "traces":  # one trace file, or a folder of them (recursive)
        df, notes = _trace_folder_ranks(p)
        if csv:  # the notes go to stderr: stdout stays one CSV table
            for n in notes:
                print(f"note: {n}", file=sys.stderr)
            return csv_table(df[ANALYZE_COLUMNS])
        return f"{p}  (ms per step)\n{text_table(df[ANALYZE_COLUMNS])}\n" + "".join(f"note: {n}\n" for n in notes)
    run = load_run_reporting(p)
    per = rank_metrics(step_metrics(run.steps, run.collectives, trace_step_metrics(traced_job_events(run))),
                       "trace")
    if per.empty:
        raise RunLoadError(f"no rank traces in run {p} (traces/<job_id>/rank<r>.json.gz)")
    if csv:
        return csv_table(per[["job_id"] + ANALYZE_COLUMNS])
    parts = []
    for job_id, df in per.groupby("job_id", sort=False):
        note = ""
        if (df["comm_ms"] <= 0).all() and (run.collectives["job_id"] == job_id).any():
            note = ("\n  (no comm in the trace: gloo runs the point-to-point transfers of the "
                    "from-scratch algorithms off the traced threads; `summarize` has this job's "
                    "comm from collectives.csv)")
        parts.append(f"{job_id}  (ms per traced step)\n{text_table(df[ANALYZE_COLUMNS])}{note}")
    return "\n\n".join(parts) + "\n"
