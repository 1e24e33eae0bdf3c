"""Per-job summaries, scaling curves and bucket sweeps (DataFrames in, DataFrames out).

Scaling follows DESIGN.md: weak scaling (fixed batch per rank) S(N) = N·T(1)/T(N), efficiency
T(1)/T(N); strong scaling (fixed global batch) S(N) = T(1)/T(N), efficiency S(N)/N.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.read.analysis.load import Run
from dpcore.read.analysis.overlap import step_breakdown

SUMMARY_COLUMNS = ["job_id", "variant", "world_size", "bucket_mb", "status", "step_ms", "step_ms_p10",
                   "step_ms_p90", "compute_ms", "overlapped_ms", "exposed_ms", "other_ms", "comm_ms",
                   "comm_fraction", "overlap_pct", "comm_ops", "comm_bytes", "throughput", "oversubscribed",
                   "n_steps", "step_ms_std", "overlap_pct_p10", "overlap_pct_p90"]
SCALING_COLUMNS = ["variant", "world_size", "bucket_mb", "step_ms", "throughput", "speedup", "efficiency",
                   "ideal_speedup", "oversubscribed", "noisy", "mode"]
#: A job whose p90 step time is this many times its p10 was disturbed (another process, OpenMP
#: threads fighting for a core): its median is not a number to scale a job on.
NOISY_SPREAD = 3.0
_MEDIANS = ["compute_ms", "overlapped_ms", "exposed_ms", "other_ms", "comm_ms", "comm_fraction", "overlap_pct",
            "comm_ops", "comm_bytes"]


def summarize_breakdown(bd: pd.DataFrame) -> pd.DataFrame:
    """Per job: medians over all (rank, step) rows, p10/p90 spread, global throughput.

    Throughput per step = samples of all ranks / slowest rank's step time (a DP step ends when the
    last rank does), then the median over steps.
    """
    rows = []
    for job_id, g in bd.groupby("job_id", sort=False):
        per_step = g.groupby("step").agg(samples=("samples", "sum"), t=("step_ms", "max"))
        thr = (per_step["samples"] / (per_step["t"] / 1e3)).replace([np.inf], np.nan)
        row = {"job_id": job_id, "step_ms": g["step_ms"].median(), "step_ms_p10": g["step_ms"].quantile(0.1),
               "step_ms_p90": g["step_ms"].quantile(0.9), "step_ms_std": g["step_ms"].std(ddof=0),
               "throughput": thr.median(), "n_steps": int(g["step"].nunique()),
               "overlap_pct_p10": g["overlap_pct"].quantile(0.1), "overlap_pct_p90": g["overlap_pct"].quantile(0.9)}
        row.update({c: pd.to_numeric(g[c], errors="coerce").median() for c in _MEDIANS})
        # Medians of parts don't add up to the median of the whole; keep the stacked parts
        # summing to T by taking "other" as the remainder at job level.
        row["other_ms"] = max(0.0, row["step_ms"] - row["compute_ms"] - row["exposed_ms"])
        rows.append(row)
    return pd.DataFrame(rows)


def job_summary(run: Run) -> pd.DataFrame:
    """One row per train job of the run (failed/skipped jobs too, with NaN metrics)."""
    jobs = run.jobs[run.jobs["kind"].fillna("train") == "train"]
    per = summarize_breakdown(step_breakdown(run.steps, run.collectives))
    base = jobs[["job_id", "variant", "world_size", "bucket_mb", "status", "oversubscribed"]]
    out = base.merge(per, on="job_id", how="left") if not per.empty else base.assign(
        **{c: np.nan for c in SUMMARY_COLUMNS if c not in base})
    for c in SUMMARY_COLUMNS:
        if c not in out:
            out[c] = np.nan
    out["oversubscribed"] = out["oversubscribed"].fillna(False).astype(bool)
    return out[SUMMARY_COLUMNS].reset_index(drop=True)


def _pick_bucket(g: pd.DataFrame, default: float | None) -> pd.Series:
    if default is not None and (g["bucket_mb"] == default).any():
        return g[g["bucket_mb"] == default].iloc[0]
    return g.sort_values("bucket_mb", na_position="first").iloc[-1]


def _noisy(row: "pd.Series | dict") -> bool:
    p10, p90 = row.get("step_ms_p10", np.nan), row.get("step_ms_p90", np.nan)
    return bool(np.isfinite(p10) and np.isfinite(p90) and p10 > 0 and p90 / p10 > NOISY_SPREAD)


def scaling(summary: pd.DataFrame, mode: str, default_bucket: float | None = None) -> pd.DataFrame:
    """Speedup and efficiency vs world size per variant ("weak" or "strong", DESIGN.md formulas).

    T(1) is the variant's own 1-rank job, else the `single` job. With several bucket sizes per
    (variant, N), ``default_bucket`` (the run's ``--bucket-mb``, run.json config) is used, else
    the most common bucket size of the run (the sweep itself is bucket_sweep's job).
    """
    if mode not in ("weak", "strong"):
        raise ValueError(f"unknown scaling mode {mode!r}; valid choices: weak, strong")
    ok = summary[np.isfinite(pd.to_numeric(summary["step_ms"], errors="coerce"))]
    if ok.empty:
        return pd.DataFrame(columns=SCALING_COLUMNS)
    modes = ok["bucket_mb"].dropna().mode()
    default = (float(default_bucket) if default_bucket is not None
               else float(modes.iloc[0]) if len(modes) else None)
    cells = [_pick_bucket(g, default) for _, g in ok.groupby(["variant", "world_size"], sort=True)]
    cells_df = pd.DataFrame(cells)
    single = cells_df[(cells_df["variant"] == "single") & (cells_df["world_size"] == 1)]
    rows = []
    for variant, g in cells_df.groupby("variant", sort=True):
        own = g[g["world_size"] == 1]
        base = own if not own.empty else single
        t1 = float(base["step_ms"].iloc[0]) if not base.empty else np.nan
        base_noisy = bool(_noisy(base.iloc[0])) if not base.empty else False
        for r in g.sort_values("world_size").to_dict("records"):
            n, tn = int(r["world_size"]), float(r["step_ms"])
            speed = n * t1 / tn if mode == "weak" else t1 / tn
            eff = t1 / tn if mode == "weak" else speed / n
            # superlinear efficiency on one host, or a spread-out T(1)/T(N), means noise
            noisy = base_noisy or _noisy(r) or (np.isfinite(eff) and eff > 1.05 and n > 1)
            rows.append({"variant": variant, "world_size": n, "bucket_mb": r["bucket_mb"], "step_ms": tn,
                         "throughput": r["throughput"], "speedup": speed, "efficiency": eff, "ideal_speedup": float(n),
                         "oversubscribed": bool(r["oversubscribed"]), "noisy": bool(noisy),
                         "mode": mode})
    return pd.DataFrame(rows, columns=SCALING_COLUMNS)


def bucket_sweep(summary: pd.DataFrame) -> pd.DataFrame:
    """Rows of (variant, world size) cells measured at more than one bucket size."""
    cols = ["variant", "world_size", "bucket_mb", "step_ms", "exposed_ms", "overlap_pct", "comm_ops"]
    ok = summary[np.isfinite(pd.to_numeric(summary["step_ms"], errors="coerce"))]
    n = ok.groupby(["variant", "world_size"])["bucket_mb"].transform("nunique")
    return ok[n > 1][cols].sort_values(["variant", "world_size", "bucket_mb"]).reset_index(drop=True)
