"""Text/CSV renderings behind `dpcore analyze` and `dpcore summarize` (the CLI only prints them).

The CLI and the dashboard show the same numbers because both call the same analysis functions.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .load import RunLoadError, load_run
from .overlap import RANK_COLUMNS, overlap_by_rank
from .summary import job_summary
from .traces import TraceFormatError, read_trace_dir

_SUMMARY_VIEW = ["job_id", "status", "step_ms", "step_ms_p10", "step_ms_p90", "compute_ms", "comm_ms",
                 "exposed_ms", "overlap_pct", "comm_fraction", "throughput", "oversubscribed"]


def _fmt(df: pd.DataFrame) -> str:
    return df.to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="-")


def _per_rank(trace_dir: Path) -> pd.DataFrame:
    try:
        return overlap_by_rank(read_trace_dir(trace_dir))
    except TraceFormatError as exc:
        raise ValueError(str(exc)) from None


def analyze(path: str, csv: bool = False) -> str:
    """Per-rank overlap % (HTA definition), comm, exposed comm and compute from traces.

    PATH is a folder of per-rank torch.profiler traces (ours or foreign) or a run directory; for
    a run directory every job with traces is analysed and CSV rows gain a leading job_id column.
    Raises ValueError (RunLoadError for broken runs) with a one-line message.
    """
    p = Path(path)
    if not p.exists():
        raise ValueError(f"no such file or directory: {p}")
    if p.is_file():
        raise ValueError(f"expected a run directory or a folder of traces, got a file: {p}")
    if not (p / "run.json").exists():
        df = _per_rank(p)
        if csv:
            return df.to_csv(index=False, columns=RANK_COLUMNS, float_format="%.4f")
        return f"{p}\n{_fmt(df)}\n"
    run = load_run(p)
    parts, frames = [], []
    for job_id in run.jobs["job_id"]:
        d = p / "traces" / str(job_id)
        if not any(k.startswith("rank") for k in run.trace_files(str(job_id))):
            continue
        df = _per_rank(d)
        frames.append(df.assign(job_id=job_id))
        note = ""
        if (df["comm_ms"] <= 0).all() and (run.collectives["job_id"] == job_id).any():
            note = ("\n  (no comm in the trace: gloo runs the point-to-point transfers of the "
                    "from-scratch algorithms off the traced threads; `summarize` has this job's "
                    "comm from collectives.csv)")
        parts.append(f"{job_id}\n{_fmt(df)}{note}")
    if not frames:
        raise RunLoadError(f"no rank traces in run {p} (traces/<job_id>/rank<r>.json.gz)")
    if csv:
        return pd.concat(frames)[["job_id"] + RANK_COLUMNS].to_csv(index=False, float_format="%.4f")
    return "\n\n".join(parts) + "\n"


def summarize(path: str) -> str:
    """The per-job table (job_summary) of a run directory as readable text."""
    p = Path(path)
    run = load_run(p)
    s = job_summary(run)
    if s.empty:
        return f"{run.meta.get('run_id', p.name)}: no train jobs\n"
    view = s[_SUMMARY_VIEW].rename(columns={"overlap_pct": "overlap_%", "throughput": "samples/s"})
    return f"{run.meta.get('run_id', p.name)} ({run.meta.get('status', '?')})\n{_fmt(view)}\n"
