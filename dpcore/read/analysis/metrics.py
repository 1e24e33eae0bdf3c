"""One definition per metric: rows per (job, rank, step), and one way to aggregate them.

Why: a profiler is worth its numbers only if the same steps always give the same value. Every
number dpcore shows (``summarize``, ``analyze``, every dashboard view and card, the docs) is
computed here, from the same rows, by the same functions:

* :func:`step_metrics` gives one row per (job, rank, step) with step time T, the phases, and
  compute / comm C / exposed comm E / overlap from two measurement methods where both exist:
  the *intervals* (steps.csv phases minus comm_calls.csv, collectives.csv; every step) and the
  *trace* (torch.profiler, the traced steps only; columns ``trace_*``). Both measure the same
  quantities by the same definitions (:mod:`dpcore.read.analysis.comm_overlap`), each within the
  step's window, so in every row compute + E + other = T with other >= 0.
* :func:`rank_metrics` aggregates them per (job, rank) and :func:`job_metrics` per job.

Which steps each number comes from (docs/DESIGN.md, issue "Numbers a user can trust"):

* T and the phases: the timed steps (run without the profiler), median and p10/p90 over every
  (rank, step).
* compute, C, E and overlap: the traced steps, from the trace where it shows communication (or
  where neither method sees any), else from the recorded intervals on those same steps
  (``comm_source`` says which). A run without traced steps uses the intervals of its timed steps.
* Aggregation over steps is a ratio of sums per rank (overlap % = Σ overlapped / Σ comm, the
  HTA definition over a rank's steps; comm fraction = Σ E / Σ T; ms columns are per-step means),
  then a mean over ranks. So a job's overlap in ``summarize`` is exactly the mean over ranks of
  ``analyze`` on its traces.
* The job's breakdown of T (:func:`job_metrics`): the traced steps are slower than the timed ones
  (the profiler's cost), so their milliseconds do not add up to the timed T. What carries over is
  each part's *share* of the step: compute_ms = T · Σ compute / Σ T_traced, likewise comm,
  overlapped and exposed, and other = T − compute − exposed. The parts add up to T, and comm
  fraction = E / T is the exposed share, never above 1.
* The profiler's own effect: ``trace_inflation`` = median traced step / median timed step; above
  :data:`INFLATION_LIMIT` the job is ``inflated``. On a GPU job that means the traced steps are not
  the timed ones slowed down evenly: the profiler's per-call overhead on the CPU made the step
  host-bound (many small kernels or collectives), the GPU idles in the trace where it computes in
  the timed steps, so the traced shares do not describe the timed step and T is split by the
  recorded intervals of the timed steps instead (``comm_source`` "intervals"; the ``timed_split``
  jobs). On CPU the profiler slows the very operators it measures, and the traced shares stay.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from dpcore.contract.intervals import has_peers
from dpcore.contract.runformat import parse_bools
from dpcore.read.analysis.comm_overlap import TRACE_COLUMNS, peers_of, step_breakdown

KEY = ["job_id", "rank", "step"]
_PARTS = ["step_ms", "compute_ms", "comm_ms", "overlapped_ms", "exposed_ms"]
TRACE_PARTS = [f"trace_{c}" for c in _PARTS]
#: Above this gap (percentage points) between the trace's and the intervals' overlap of the same
#: steps, the two measurement methods disagree and every view says so.
SOURCE_GAP_POINTS = 5.0
#: A job whose p90 step time exceeds 1.5x its p10 was disturbed (another process, threads
#: fighting for a core): its median is not a number to decide on.
NOISY_SPREAD = 1.5
#: A job whose median traced step is over 1.2x its median timed step is inflated by the profiler.
INFLATION_LIMIT = 1.2
RANK_COLUMNS = ["job_id", "rank", "steps", "overlap_pct", "comm_ms", "exposed_comm_ms", "compute_ms",
                "overlapped_ms", "step_ms", "comm_fraction"]


def step_metrics(steps: pd.DataFrame, collectives: pd.DataFrame,
                 trace_steps: pd.DataFrame | None = None, calls: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (job, rank, step) of every step: the interval breakdown (``traced`` says
    whether the step was profiled) plus the trace's ``trace_*`` columns where a trace covers it.

    ``trace_steps``: :func:`dpcore.read.analysis.comm_overlap.overlap_from_trace` rows with a
    ``job_id`` column (see :func:`trace_step_metrics`), or None for a run without traces.
    ``calls``: the run's comm_calls.csv (``Run.comm_calls``), cut out of the phases' compute.
    At world size 1 the trace's collectives are no communication either (no peer).
    """
    every = step_breakdown(steps, collectives, profiled=None, calls=calls)
    if steps is not None and "profiled" in steps and len(every):
        traced = np.asarray(parse_bools(steps["profiled"].tolist()), dtype=bool)
    else:
        traced = np.zeros(len(every), dtype=bool)
    # the timed steps' rows first, then the traced ones', each in steps.csv's order
    timed, prof = every[~traced].assign(traced=False), every[traced].assign(traced=True)
    rows = pd.concat([f for f in (timed, prof) if not f.empty] or [timed], ignore_index=True)
    for c in TRACE_PARTS + ["trace_overlap_pct"]:
        rows[c] = np.nan
    if trace_steps is not None and not trace_steps.empty and not rows.empty:
        t = trace_steps[trace_steps["step"] >= 0].rename(
            columns={c: f"trace_{c}" for c in TRACE_COLUMNS if c not in ("rank", "step")})
        rows = rows.drop(columns=TRACE_PARTS + ["trace_overlap_pct"]).merge(
            t[KEY + TRACE_PARTS + ["trace_overlap_pct"]], on=KEY, how="left")
        peers = [has_peers(peers_of(r)) for r in rows[["variant", "world_size"]].to_dict("records")]
        alone = ~np.asarray(peers, dtype=bool) & rows["trace_comm_ms"].notna().to_numpy()
        if alone.any():
            rows.loc[alone, ["trace_comm_ms", "trace_overlapped_ms", "trace_exposed_ms"]] = 0.0
            rows.loc[alone, "trace_overlap_pct"] = np.nan
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


def rank_metrics(rows: pd.DataFrame, source: str = "trace") -> pd.DataFrame:
    """Per (job, rank) over the traced steps: overlap % as Σ overlapped / Σ comm (HTA's per-rank
    definition), comm fraction as Σ exposed / Σ T, ms columns per step (mean; ``step_ms`` is the
    mean window the parts were measured in), ``steps`` how many steps that is.

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
    g = sel.groupby(["job_id", "rank"], sort=False)
    comm = g[f"{prefix}comm_ms"].sum()
    ov = g[f"{prefix}overlapped_ms"].sum(min_count=1)  # all missing (unknown phases): missing, not 0
    exposed = g[f"{prefix}exposed_ms"].sum(min_count=1)
    t = g[f"{prefix}step_ms"].sum(min_count=1)
    n = g.size()
    out = pd.DataFrame({"job_id": comm.index.get_level_values(0),
                        "rank": comm.index.get_level_values(1).astype(int), "steps": n.to_numpy(),
                        "overlap_pct": (100.0 * ov / comm).where(comm > 0).to_numpy(),
                        "comm_ms": (comm / n).to_numpy(), "exposed_comm_ms": (exposed / n).to_numpy(),
                        "compute_ms": (g[f"{prefix}compute_ms"].sum(min_count=1) / n).to_numpy(),
                        "overlapped_ms": (ov / n).to_numpy(), "step_ms": (t / n).to_numpy(),
                        "comm_fraction": (exposed / t).where(t > 0).to_numpy()})
    return out[RANK_COLUMNS] if len(out) else pd.DataFrame(columns=RANK_COLUMNS)


def _mean_over_ranks(per_rank: pd.DataFrame) -> pd.DataFrame:
    """Per job, mean over ranks of each rank's overlap and of each part's share of the step."""
    t = per_rank["step_ms"].where(per_rank["step_ms"] > 0)
    shares = per_rank.assign(**{f"{c}_share": per_rank[c] / t for c in
                                ("compute_ms", "comm_ms", "exposed_comm_ms", "overlapped_ms")})
    return shares.groupby("job_id", sort=False).agg(
        overlap_pct=("overlap_pct", "mean"), compute_share=("compute_ms_share", "mean"),
        comm_share=("comm_ms_share", "mean"), exposed_share=("exposed_comm_ms_share", "mean"),
        overlapped_share=("overlapped_ms_share", "mean"), comm_steps=("steps", "max"),
        any_comm=("comm_ms", "max"))


def job_metrics(rows: pd.DataFrame, timed_split: Iterable[str] = ()) -> pd.DataFrame:
    """Per job: T spread over the timed steps, phases (medians), and the breakdown of T (compute,
    C, E, overlap) from the traced steps (trace where it shows comm, else intervals), both
    methods' overlap side by side with their gap.

    The breakdown is T times each part's share of the traced steps (module docstring), so
    compute_ms + exposed_ms + other_ms = step_ms, other_ms >= 0 and comm_fraction = E / T <= 1.

    Columns: job_id, step_ms (median), step_ms_p10, step_ms_p50, step_ms_p90, step_ms_std,
    n_steps, noisy, fwd_ms, bwd_ms, sync_ms, opt_ms, compute_ms, comm_ms, exposed_ms,
    overlapped_ms, other_ms, overlap_pct, comm_fraction, comm_source, comm_steps,
    overlap_pct_trace, overlap_pct_intervals, overlap_gap, sources_disagree, comm_ops,
    comm_bytes, throughput, trace_inflation (median traced / median timed step; NaN without
    both), inflated (trace_inflation > INFLATION_LIMIT). ``timed_split``: the jobs (GPU jobs) whose
    T is split by their timed steps' intervals when inflated (module docstring).
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
                       for c in ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms", "comm_ops", "comm_bytes")}})
    df = pd.DataFrame(out)
    p10, p90 = df["step_ms_p10"], df["step_ms_p90"]
    df["noisy"] = ((p10 > 0) & (p90 / p10 > NOISY_SPREAD)).fillna(False).astype(bool)
    trace = _mean_over_ranks(rank_metrics(rows, "trace"))
    ivals = _mean_over_ranks(rank_metrics(rows, "intervals"))
    trace = trace[np.asarray(trace_is_source(trace["any_comm"], ivals["any_comm"].reindex(trace.index)), dtype=bool)]
    chosen = pd.concat([trace.assign(comm_source="trace"),
                        ivals[~ivals.index.isin(trace.index)].assign(comm_source="intervals")])
    traced_t = rows[rows["traced"]].groupby("job_id")["step_ms"].median()
    timed_t = rows[~rows["traced"]].groupby("job_id")["step_ms"].median()
    df["trace_inflation"] = df["job_id"].map((traced_t / timed_t.where(timed_t > 0)).dropna())
    df["inflated"] = (df["trace_inflation"] > INFLATION_LIMIT).fillna(False).astype(bool)
    jobs = set(df.loc[df["inflated"], "job_id"]) & set(timed_split)
    if jobs:  # the timed steps' own intervals split T (module docstring)
        own = _mean_over_ranks(rank_metrics(rows[~rows["traced"] & rows["job_id"].isin(jobs)], "intervals"))
        chosen = pd.concat([chosen[~chosen.index.isin(own.index)], own.assign(comm_source="intervals")])
    df = df.merge(chosen.drop(columns="any_comm"), left_on="job_id", right_index=True, how="left")
    t = df["step_ms"]
    df["compute_ms"] = df["compute_share"] * t
    df["comm_ms"] = df["comm_share"] * t
    df["exposed_ms"] = df["exposed_share"] * t
    df["overlapped_ms"] = df["overlapped_share"] * t
    df["comm_fraction"] = df["exposed_share"].where(t > 0)
    df["other_ms"] = (t - df["compute_ms"] - df["exposed_ms"].fillna(0)).clip(lower=0)
    with_comm = trace[trace["any_comm"] > 0]
    df["overlap_pct_trace"] = df["job_id"].map(with_comm["overlap_pct"])
    df["overlap_pct_intervals"] = df["job_id"].map(ivals["overlap_pct"])
    df["overlap_gap"] = df["overlap_pct_trace"] - df["overlap_pct_intervals"]
    df["sources_disagree"] = (df["overlap_gap"].abs() > SOURCE_GAP_POINTS).fillna(False).astype(bool)
    return df.drop(columns=["compute_share", "comm_share", "exposed_share", "overlapped_share"]
                   ).reset_index(drop=True)


def trace_is_source(trace_comm: pd.Series | float, interval_comm: pd.Series | float) -> np.ndarray | np.bool_:
    """Whether C, E and overlap come from the trace, given the most comm (ms) each method saw in
    the steps a trace covers: the trace unless it misses communication the recorded intervals saw
    (gloo runs the from-scratch algorithms' point-to-point transfers off any traced thread). Where
    neither saw any (world size 1: no peer), the trace, which measured the same steps.

    Why one function: the job's ``comm_source`` and each drawn step's "measured from" must name
    the same method for the same data (the Timeline shows both side by side)."""
    return np.logical_or(np.greater(trace_comm, 0), np.logical_not(np.greater(interval_comm, 0)))


def step_ranks(rows: pd.DataFrame, job_id: str, step: int, source: str | None = None) -> pd.DataFrame:
    """Per rank, the numbers of ONE step (what the Timeline draws): T, C, E and overlap, from the
    trace when the step is traced and :func:`trace_is_source` says so (and ``source``, the job's,
    does not say intervals), else from the intervals.
    Columns: rank, step_ms, comm_ms, exposed_ms, overlap_pct, source."""
    cols = ["rank", "step_ms", "comm_ms", "exposed_ms", "overlap_pct", "source"]
    g = rows[(rows["job_id"] == job_id) & (rows["step"] == step)].sort_values("rank")
    if g.empty:
        return pd.DataFrame(columns=cols)
    covered = bool(g["traced"].all() and g["trace_comm_ms"].notna().all())
    has_trace = covered and bool(trace_is_source(g["trace_comm_ms"].max(), g["comm_ms"].max()))
    use_trace = has_trace if source is None else (source == "trace" and has_trace)
    p = "trace_" if use_trace else ""
    return pd.DataFrame({"rank": g["rank"].astype(int), "step_ms": g["step_ms"], "comm_ms": g[f"{p}comm_ms"],
                         "exposed_ms": g[f"{p}exposed_ms"], "overlap_pct": g[f"{p}overlap_pct"],
                         "source": "trace" if use_trace else "intervals"}, columns=cols).reset_index(drop=True)
