"""What ``python -m dpcore analyze PATH [--csv]`` prints: overlap per rank, per traced step.

The CLI and the dashboard show the same numbers because both call the same analysis functions
(:mod:`dpcore.read.analysis.metrics`); this module only loads PATH and lays the rows out.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from dpcore.contract.intervals import has_peers
from dpcore.contract.options import AnalyzeOptions
from dpcore.contract.units import percent_number
from dpcore.read.analysis.comm_overlap import OVERLAP_TABLE
from dpcore.read.analysis.metrics import rank_metrics, step_metrics, trace_rows
from dpcore.read.ranks import Scale
from dpcore.read.report.resolve import load_run_reporting, resolve, scale_of, trace_steps_reporting
from dpcore.read.report.table_text import csv_table, text_table
from dpcore.read.rundir.load import RunLoadError
from dpcore.read.tables import folder_tables
from dpcore.read.traces.reader import TraceFormatError

#: docs/DESIGN.md's columns of `analyze --csv` (ms per traced step), then how many steps they cover,
#: the mean step window they were measured in, and comm fraction = Σ exposed / Σ step_ms.
ANALYZE_COLUMNS = ["rank", "overlap_pct", "comm_ms", "exposed_comm_ms", "compute_ms", "steps", "step_ms",
                   "comm_fraction"]
#: What analyze's and summarize's numbers are, in one place (both print it; docs/DESIGN.md's definitions).
COMPUTE_NOTE = ("compute = forward, backward and optimizer work of the rank's main thread (CPU: the time in "
                "dpcore's phases minus the time inside communication calls -- launching, a blocking "
                "collective, waiting; a foreign CPU trace: its main-thread operators; GPU: compute kernels). "
                "comm = union of the rank's collective intervals (none at world size 1: no peer). "
                "exposed = comm not under compute; overlap = overlapped / comm (HTA).")
_ANALYZE_NOTE = ("ms columns: means per traced step; step_ms: the step's window they were measured in (from "
                 "forward to the end of optimizer, the ProfilerStep of a foreign CPU trace, a GPU step's "
                 "kernels); comm_% = exposed / step_ms over those steps, in percent (the --csv column "
                 "comm_fraction is the fraction). " + COMPUTE_NOTE)


def _text(df: pd.DataFrame) -> str:
    """The text table of ANALYZE_COLUMNS rows: percentages in percent, as summarize and the dashboard."""
    view = df[ANALYZE_COLUMNS].assign(comm_fraction=100 * df["comm_fraction"])
    return text_table(view.rename(columns={"comm_fraction": "comm_%", "overlap_pct": "overlap_%"}),
                      formatters={"comm_%": percent_number, "overlap_%": percent_number})


def _trace_folder_ranks(trace_dir: Path, scale: Scale | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Per rank over the steps of a folder of traces (the whole trace as one step when it has no
    ProfilerStep markers), and the reader's notes on the traces (the rules they needed)."""
    try:
        tables = folder_tables(trace_dir, scale, need=(OVERLAP_TABLE,))
    except TraceFormatError as exc:
        raise ValueError(str(exc)) from None
    overlap = pd.concat([t[OVERLAP_TABLE] for t in tables], ignore_index=True)
    df = rank_metrics(trace_rows(overlap), "trace")
    return df, [n for t in tables for n in t.notes] + short_step_notes(df)


#: A step shorter than this (ms) holds no training loop: launching one kernel takes microseconds,
#: one forward and backward of the smallest model tens of them.
MIN_STEP_MS = 0.1


def short_step_notes(df: pd.DataFrame) -> list[str]:
    """One note per rank whose steps average under MIN_STEP_MS: its step ranges hold almost
    nothing (markers around work the trace did not record, e.g. an old JSON-array trace of CPU
    events), so its numbers describe those ranges, not a training step; said rather than shown
    as if it were one."""
    short = df[pd.to_numeric(df["step_ms"], errors="coerce") < MIN_STEP_MS]
    return [f"rank {int(r.rank)}: its {int(r.steps)} step(s) average {float(r.step_ms):.4g} ms, shorter than any "
            f"training step (< {MIN_STEP_MS:g} ms): its step ranges hold almost none of the work (markers around "
            "a loop the trace did not record?), and the numbers describe those ranges only"
            for r in short.itertuples()]


def analyze(path: str, csv: bool = False, scale: Scale | None = None) -> str:
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
        df, notes = _trace_folder_ranks(p, scale)
        if df.empty:  # a JSON list of numbers, or a trace without one timed event: nothing to show
            raise ValueError(f"no events to analyse in {p}: not a torch.profiler trace (a JSON object or "
                             "list of trace events), or one that recorded no step")
        if csv:  # the notes go to stderr: stdout stays one CSV table
            for n in notes:
                print(f"note: {n}", file=sys.stderr)
            return csv_table(df[ANALYZE_COLUMNS])
        return (f"{p}  (ms per step)\n{_text(df)}\n" + "".join(f"note: {n}\n" for n in notes)
                + f"\n{_ANALYZE_NOTE}\n")
    run = load_run_reporting(p)
    per = rank_metrics(step_metrics(run.steps, run.collectives, trace_steps_reporting(run, scale), run.comm_calls),
                       "trace")
    if per.empty:
        raise RunLoadError(f"no rank traces in run {p} (traces/<job_id>/rank<r>.json.gz)")
    if csv:
        return csv_table(per[["job_id"] + ANALYZE_COLUMNS])
    parts = []
    sizes = dict(zip(run.jobs["job_id"], run.jobs["world_size"]))
    for job_id, df in per.groupby("job_id", sort=False):
        note = ""
        if not has_peers(sizes.get(job_id)) and (run.collectives["job_id"] == job_id).any():
            note = "\n  (world size 1: no peer, so its collectives move nothing and are no communication)"
        elif (df["comm_ms"] <= 0).all() and (run.collectives["job_id"] == job_id).any():
            note = ("\n  (no comm in the trace: gloo runs the point-to-point transfers of the "
                    "from-scratch algorithms off the traced threads; `summarize` has this job's "
                    "comm from collectives.csv)")
        parts.append(f"{job_id}  (ms per traced step)\n{_text(df)}{note}")
    return "\n\n".join(parts) + f"\n\n{_ANALYZE_NOTE}\n"


def analyze_command(options: AnalyzeOptions) -> str:
    """The ``analyze`` command: exactly what it prints (the text with a blank line after it; a CSV as is)."""
    out = analyze(options.path, csv=options.csv, scale=scale_of(options))
    return out if options.csv else out + "\n"
