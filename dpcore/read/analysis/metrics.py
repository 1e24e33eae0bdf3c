"""One definition per metric: rows per (job, rank, step), and one way to aggregate them.

Why: a profiler is worth its numbers only if the same steps always give the same value. Every
number dpcore shows (``summarize``, ``analyze``, every dashboard view and card, the README) is
computed here, from the same rows, by the same functions:

* :func:`step_metrics` gives one row per (job, rank, step) with step time T, the phases, and
  comm C / exposed comm E / overlap from two measurement methods where both exist:
  the *intervals* (steps.csv phases and collectives.csv, every step) and the *trace*
  (torch.profiler, the traced steps only; columns ``trace_*``).
* :func:`rank_metrics` aggregates them per (job, rank) and :func:`job_metrics` per job.

Which steps each number comes from (docs/DESIGN.md, issue "Numbers a user can trust"):

* T and the phases: the timed steps (run without the profiler), median and p10/p90 over every
  (rank, step).
* C, E and overlap: the traced steps, from the trace where it shows communication, else from
  the recorded collectives on those same steps (``comm_source`` says which). A run without
  traced steps uses the intervals of its timed steps.
* Aggregation over steps is a ratio of sums per rank (overlap % = Σ overlapped / Σ comm, the
  HTA definition over a rank's steps; ms columns are per-step means), then a mean over ranks.
  So a job's overlap in ``summarize`` is exactly the mean over ranks of ``analyze`` on its traces.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.read.analysis.comm_overlap import TRACE_COLUMNS, step_breakdown

KEY = ["job_id", "rank", "step"]
_PARTS = ["compute_ms", "comm_ms", "overlapped_ms", "exposed_ms"]
TRACE_PARTS = [f"trace_{c}" for c in _PARTS]
#: Above this gap (percentage points) between the trace's and the intervals' overlap of the same
#: steps, the two measurement methods disagree and every view says so.
SOURCE_GAP_POINTS = 5.0
#: A job whose p90 step time exceeds 1.5x its p10 was disturbed (another process, threads
#: fighting for a core): its median is not a number to decide on.
NOISY_SPREAD = 1.5
RANK_COLUMNS = ["job_id", "rank", "steps", "overlap_pct", "comm_ms", "exposed_comm_ms", "compute_ms",
                "overlapped_ms"]


def step_metrics(steps: pd.DataFrame, collectives: pd.DataFrame,
                 trace_steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (job, rank, step) of every step: the interval breakdown (``traced`` says
    whether the step was profiled) plus the trace's ``trace_*`` columns where a trace covers it.

    ``trace_steps``: :func:`dpcore.read.analysis.comm_overlap.overlap_from_trace` rows with a
    ``job_id`` column (see :func:`trace_step_metrics`), or None for a run without traces.
    """
    timed = step_breakdown(steps, collectives, profiled=False).assign(traced=False)
    prof = step_breakdown(steps, collectives, profiled=True).assign(traced=True)
    rows = pd.concat([f for f in (timed, prof) if not f.empty] or [timed], ignore_index=True)
    for c in TRACE_PARTS + ["trace_overlap_pct"]:
        rows[c] = np.nan
    if trace_steps is not None and not trace_steps.empty and not rows.empty:
        t = trace_steps[trace_steps["step"] >= 0].rename(
            columns={c: f"trace_{c}" for c in TRACE_COLUMNS if c not in ("rank", "step")})
        rows = rows.drop(columns=TRACE_PARTS + ["trace_overlap_pct"]).merge(
            t[KEY + TRACE_PARTS + ["trace_overlap_pct"]], on=KEY, how="left")
    rows["traced"] = rows["traced"].astype(bool)
    return rows


def trace_rows(trace_steps: pd.DataFrame) -> pd.DataFrame:
    """:func:`overlap_from_trace` rows of a folder of traces (no steps.csv) as traced step rows,
    so :func:`rank_metrics` aggregates them exactly as it does a run's. A trace without
    ProfilerStep markers has one row per rank (step -1) covering the whole trace."""
    t = trace_steps.rename(columns={c: f"trace_{c}" for c in TRACE_COLUMNS if c not in ("rank", "step")})
    if "job_id" not in t:
        t = t.assign(job_id="")
    has_steps = t.groupby("rank")["step"].transform("max") >= 0
    return t[(t["step"] >= 0) | ~has_steps].assign(traced=True)


def _ratio_of_sums(g: pd.DataFrame, prefix: str) -> dict:
    comm = g[f"{prefix}comm_ms"].sum()
    ov = g[f"{prefix}overlapped_ms"].sum(min_count=1)  # all missing (unknown phases): missing, not 0
    n = len(g)
    return {"steps": n, "overlap_pct": 100.0 * ov / comm if comm > 0 else np.nan,
            "comm_ms": comm / n, "exposed_comm_ms": g[f"{prefix}exposed_ms"].sum(min_count=1) / n,
            "compute_ms": g[f"{prefix}compute_ms"].sum() / n, "overlapped_ms": ov / n}


def rank_metrics(rows: pd.DataFrame, source: str = "trace") -> pd.DataFrame:
    """Per (job, rank) over the traced steps: overlap % as Σ overlapped / Σ comm (HTA's per-rank
    definition), ms columns per step (mean), ``steps`` how many steps that is.

    ``source``: ``"trace"`` (the ``trace_*`` columns of traced steps that a trace covers) or
    ``"intervals"`` (the interval columns of the traced steps, else of the timed steps).
    This is what ``analyze`` prints for a run.
    """
    if source == "trace":
        sel, prefix = rows[rows["traced"] & rows["trace_comm_ms"].notna()], "trace_"
    elif source == "intervals":
        traced = rows[rows["traced"]]
        has = set(traced["job_id"])
        sel = pd.concat([traced, rows[~rows["traced"] & ~rows["job_id"].isin(has)]])
        prefix = ""
    else:
        raise ValueError(f"unknown source {source!r}; valid choices: trace, intervals")
    out = [{"job_id": j, "rank": int(r), **_ratio_of_sums(g, prefix)}
           for (j, r), g in sel.groupby(["job_id", "rank"], sort=False)]
    return pd.DataFrame(out, columns=RANK_COLUMNS)


def _mean_over_ranks(per_rank: pd.DataFrame) -> pd.DataFrame:
    return per_rank.groupby("job_id", sort=False).agg(
        overlap_pct=("overlap_pct", "mean"), comm_ms=("comm_ms", "mean"),
        exposed_ms=("exposed_comm_ms", "mean"), overlapped_ms=("overlapped_ms", "mean"),
        comm_steps=("steps", "max"))


def job_metrics(rows: pd.DataFrame) -> pd.DataFrame:
    """Per job: T spread over the timed steps, phases (medians), and C/E/overlap from the traced
    steps (trace where it shows comm, else intervals), both methods side by side with their gap.

    Columns: job_id, step_ms (median), step_ms_p10, step_ms_p50, step_ms_p90, step_ms_std,
    n_steps, noisy, fwd_ms, bwd_ms, sync_ms, opt_ms, compute_ms, comm_ms, exposed_ms,
    overlapped_ms, other_ms, overlap_pct, comm_fraction, comm_source, comm_steps,
    overlap_pct_trace, overlap_pct_intervals, overlap_gap, sources_disagree, comm_ops,
    comm_bytes, throughput.
    """
    if rows.empty:
        return pd.DataFrame(columns=["job_id"])
    timed = rows[~rows["traced"]]
    timed = pd.concat([timed, rows[rows["traced"] & ~rows["job_id"].isin(set(timed["job_id"]))]])
    out = []
    for job_id, g in timed.groupby("job_id", sort=False):
        per_step = g.groupby("step").agg(samples=("samples", "sum"), known=("samples", "count"),
                                         t=("step_ms", "max"))
        # no sample count (an imported trace never has one): throughput is missing, not 0
        thr = (per_step["samples"].where(per_step["known"] > 0) / (per_step["t"] / 1e3)).replace([np.inf], np.nan)
        q = g["step_ms"].quantile([0.1, 0.5, 0.9])
        out.append({"job_id": job_id, "step_ms": q[0.5], "step_ms_p10": q[0.1], "step_ms_p50": q[0.5],
                    "step_ms_p90": q[0.9], "step_ms_std": g["step_ms"].std(ddof=0),
                    "n_steps": int(g["step"].nunique()), "throughput": thr.median(),
                    **{c: pd.to_numeric(g[c], errors="coerce").median()
                       for c in ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms", "compute_ms", "comm_ops", "comm_bytes")}})
    df = pd.DataFrame(out)
    p10, p90 = df["step_ms_p10"], df["step_ms_p90"]
    df["noisy"] = ((p10 > 0) & (p90 / p10 > NOISY_SPREAD)).fillna(False).astype(bool)
    per_rank_trace = rank_metrics(rows, "trace")
    # no phases recorded (an imported trace that names none): every such step is traced, so
    # compute is the trace's compute (the same union the overlap is measured against), not 0
    df["compute_ms"] = df["compute_ms"].fillna(df["job_id"].map(per_rank_trace.groupby("job_id")["compute_ms"].mean()))
    trace = _mean_over_ranks(per_rank_trace)
    trace = trace[trace["comm_ms"] > 0]  # a trace that shows no comm cannot measure overlap
    ivals = _mean_over_ranks(rank_metrics(rows, "intervals"))
    chosen = pd.concat([trace.assign(comm_source="trace"),
                        ivals[~ivals.index.isin(trace.index)].assign(comm_source="intervals")])
    df = df.merge(chosen, left_on="job_id", right_index=True, how="left")
    df["overlap_pct_trace"] = df["job_id"].map(trace["overlap_pct"])
    df["overlap_pct_intervals"] = df["job_id"].map(ivals["overlap_pct"])
    df["overlap_gap"] = df["overlap_pct_trace"] - df["overlap_pct_intervals"]
    df["sources_disagree"] = (df["overlap_gap"].abs() > SOURCE_GAP_POINTS).fillna(False).astype(bool)
    df["comm_fraction"] = (df["exposed_ms"] / df["step_ms"]).where(df["step_ms"] > 0)
    df["other_ms"] = (df["step_ms"] - df["compute_ms"] - df["exposed_ms"].fillna(0)).clip(lower=0)
    return df.reset_index(drop=True)


def step_ranks(rows: pd.DataFrame, job_id: str, step: int, source: str | None = None) -> pd.DataFrame:
    """Per rank, the numbers of ONE step (what the Timeline draws): T, C, E and overlap, from the
    trace when the step is traced and the trace shows comm (or ``source`` says so), else from
    the intervals. Columns: rank, step_ms, comm_ms, exposed_ms, overlap_pct, source."""
    cols = ["rank", "step_ms", "comm_ms", "exposed_ms", "overlap_pct", "source"]
    g = rows[(rows["job_id"] == job_id) & (rows["step"] == step)].sort_values("rank")
    if g.empty:
        return pd.DataFrame(columns=cols)
    has_trace = bool(g["traced"].all() and g["trace_comm_ms"].notna().all() and g["trace_comm_ms"].sum() > 0)
    use_trace = has_trace if source is None else (source == "trace" and has_trace)
    p = "trace_" if use_trace else ""
    return pd.DataFrame({"rank": g["rank"].astype(int), "step_ms": g["step_ms"], "comm_ms": g[f"{p}comm_ms"],
                         "exposed_ms": g[f"{p}exposed_ms"], "overlap_pct": g[f"{p}overlap_pct"],
                         "source": "trace" if use_trace else "intervals"}, columns=cols).reset_index(drop=True)
