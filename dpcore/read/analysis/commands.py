"""Text/CSV renderings behind `dpcore analyze` and `dpcore summarize` (the CLI only prints them).

The CLI and the dashboard show the same numbers because both call the same analysis functions.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpcore.read.analysis.load import RunLoadError, load_run
from dpcore.read.analysis.overlap import RANK_COLUMNS, overlap_by_rank
from dpcore.read.analysis.summary import job_summary
from dpcore.read.analysis.traces import TraceFormatError, read_trace_dir

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


def run_end_table(path: str) -> tuple[str, int]:
    """What ``profile`` prints when its run ends: the completed jobs' summary (median step time,
    comm fraction, overlap, throughput), then one line per failed, skipped or interrupted job.
    Returns the text and the number of failed jobs."""
    run = load_run(Path(path))
    summary = job_summary(run)
    summary = summary[summary["status"] == "complete"]
    lines = []
    if summary.empty:
        lines.append("(no completed training jobs)")
    else:
        cols = {"job_id": "job", "step_ms": "step ms (median)", "comm_fraction": "comm fraction",
                "overlap_pct": "overlap %", "throughput": "samples/s"}
        table = summary[list(cols)].rename(columns=cols)
        lines.append(table.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
    failed = 0
    for job in run.meta.get("jobs", []):
        if job.get("status") in ("failed", "skipped", "interrupted"):
            failed += job.get("status") == "failed"
            why = (job.get("error") or job.get("skip_reason") or "").strip().splitlines()
            lines.append(f"{job['id']}: {job['status']}" + (f" - {why[0]}" if why else ""))
    return "\n".join(lines), failed
