"""Per-job summaries, scaling curves and bucket sweeps (DataFrames in, DataFrames out).

Scaling follows docs/DESIGN.md: weak scaling (fixed batch per rank) S(N) = N·T(1)/T(N), efficiency
T(1)/T(N); strong scaling (fixed global batch) S(N) = T(1)/T(N), efficiency S(N)/N.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.read.analysis.metrics import NOISY_SPREAD, job_metrics, step_metrics
from dpcore.read.rundir.load import Run

SUMMARY_COLUMNS = ["job_id", "variant", "world_size", "bucket_mb", "status", "step_ms", "step_ms_p10",
                   "step_ms_p50", "step_ms_p90", "noisy", "fwd_ms", "bwd_ms", "sync_ms", "opt_ms", "compute_ms",
                   "overlapped_ms", "exposed_ms", "other_ms", "comm_ms", "comm_fraction", "overlap_pct",
                   "comm_source", "comm_steps", "overlap_pct_trace", "overlap_pct_intervals", "overlap_gap",
                   "sources_disagree", "comm_ops", "comm_bytes", "throughput", "oversubscribed", "n_steps",
                   "step_ms_std", "trace_inflation", "inflated", "gpus_shared"]
SCALING_COLUMNS = ["variant", "world_size", "bucket_mb", "step_ms", "step_ms_p10", "step_ms_p90", "throughput",
                   "speedup", "efficiency", "ideal_speedup", "oversubscribed", "noisy", "suspect", "mode",
                   "gpus_shared"]
#: Why a job whose ranks shared GPUs is no scaling point (the Scaling table's ``suspect``).
SHARED_SUSPECT = "ranks shared a GPU: not a scaling point"


def job_summary(run: Run, trace_steps: pd.DataFrame | None) -> pd.DataFrame:
    """One row per train job of the run (failed/skipped jobs too, with NaN metrics); the numbers
    are :func:`dpcore.read.analysis.metrics.job_metrics` of :func:`step_metrics` rows.

    ``trace_steps``: the run's per-step trace metrics, ``run_trace_steps(run)`` (from the rank
    cache, :mod:`dpcore.read.ranks`: what every command and the dashboard pass; the tests'
    events-path reference in ``tests/events_path.py`` gives the same rows); None for a run without
    traces (intervals only). A job recorded on a GPU (:func:`gpu_job_ids`) has its T split by its
    timed steps where the profiler inflated the traced ones (:func:`job_metrics`' ``timed_split``).
    """
    jobs = run.jobs[run.jobs["kind"].fillna("train") == "train"]
    per = job_metrics(step_metrics(run.steps, run.collectives, trace_steps, run.comm_calls),
                      gpu_job_ids(run))
    base = jobs[["job_id", "variant", "world_size", "bucket_mb", "status", "oversubscribed"]
                + (["gpus_shared"] if "gpus_shared" in jobs else [])]
    out = base.merge(per, on="job_id", how="left") if len(per.columns) > 1 else base.copy()
    for c in SUMMARY_COLUMNS:
        if c not in out:
            out[c] = np.nan
    for c in ("oversubscribed", "noisy", "sources_disagree", "inflated", "gpus_shared"):
        out[c] = out[c].astype("boolean").fillna(False).astype(bool)
    return out[SUMMARY_COLUMNS].reset_index(drop=True)


def shared_gpu_line(summary: pd.DataFrame) -> str:
    """One line on the jobs whose ranks shared GPUs (run.json's per-job ``gpus_shared``: more
    local ranks than GPUs, so the ranks are processes time-slicing the same device), "" when none.
    Why it is said wherever world sizes are compared: two ranks on one GPU take turns on it, so
    their step time against world size 1's measures that sharing, not what data parallelism buys;
    such a job is never a scaling point (:func:`scaling` leaves its speedup and efficiency empty)."""
    if summary is None or summary.empty or "gpus_shared" not in summary:
        return ""
    shared = summary[summary["gpus_shared"].astype("boolean").fillna(False).astype(bool)
                     & np.isfinite(pd.to_numeric(summary["step_ms"], errors="coerce"))]  # jobs with a step time
    if shared.empty:
        return ""
    sizes = sorted({int(n) for n in pd.to_numeric(shared["world_size"], errors="coerce").dropna()})
    names = (", ".join(str(j) for j in shared["job_id"]) if len(shared) <= 3 else
             f"{len(shared)} jobs at world size {', '.join(map(str, sizes))}")
    return (f"ranks shared a GPU in {names}: their processes took turns on one device, so their step times "
            "compare GPU sharing, not scaling; they are no scaling point (no speedup or efficiency)")


def recorded_on_gpu(run: Run) -> bool:
    """Whether the run's jobs ran on a GPU, as run.json's ``environment.device`` says ("cuda")."""
    env = run.meta.get("environment") if isinstance(run.meta, dict) else None
    return isinstance(env, dict) and str(env.get("device", "")).lower().startswith("cuda")


def gpu_job_ids(run: Run) -> list[str]:
    """The jobs that ran on a GPU: each job's own run.json ``device`` where the run records one per
    job (``profile --device``), else the run's ``environment.device``. Why per job: one run can
    hold CPU and GPU jobs (``--device`` chosen per world size by an older dpcore, or an import)."""
    jobs = run.jobs
    own = jobs["device"].astype("string").str.lower() if "device" in jobs else None
    run_gpu = recorded_on_gpu(run)
    if own is None:
        return list(jobs["job_id"]) if run_gpu else []
    on_gpu = own.str.startswith("cuda").fillna(run_gpu).astype(bool)
    return list(jobs.loc[on_gpu, "job_id"])


def _pick_bucket(g: pd.DataFrame, default: float | None) -> pd.Series:
    if default is not None and (g["bucket_mb"] == default).any():
        return g[g["bucket_mb"] == default].iloc[0]
    return g.sort_values("bucket_mb", na_position="first").iloc[-1]


def _noisy(row: pd.Series | dict) -> bool:
    p10, p90 = row.get("step_ms_p10", np.nan), row.get("step_ms_p90", np.nan)
    return bool(np.isfinite(p10) and np.isfinite(p90) and p10 > 0 and p90 / p10 > NOISY_SPREAD)


def scaling(summary: pd.DataFrame, mode: str, default_bucket: float | None = None) -> pd.DataFrame:
    """Speedup and efficiency vs world size per variant ("weak" or "strong", docs/DESIGN.md formulas).

    T(1) is the variant's own 1-rank job, else the `single` job. With several bucket sizes per
    (variant, N), ``default_bucket`` (the run's ``--bucket-mb``, run.json config) is used, else
    the most common bucket size of the run (the sweep itself is bucket_sweep's job).

    ``noisy`` is the cell's own step-time spread, the very flag of :func:`job_summary` (Overview
    and ``summarize`` show the same); ``suspect`` says why a speedup/efficiency built on it may
    still be wrong: "T(1) noisy" (its baseline's spread) or "above 100%" (superlinear on one host),
    else "". A job whose ranks shared GPUs (``gpus_shared``, :func:`shared_gpu_line`) is never a
    scaling point: its row keeps its step time and throughput, its speedup and efficiency are NaN
    and ``suspect`` is SHARED_SUSPECT (its ranks time-sliced one GPU: not what more GPUs buy).
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
            shared = bool(r.get("gpus_shared") is True or r.get("gpus_shared") == 1)
            speed = np.nan if shared else n * t1 / tn if mode == "weak" else t1 / tn
            eff = np.nan if shared else t1 / tn if mode == "weak" else speed / n
            # superlinear efficiency on one host, or a spread-out T(1), makes the ratio suspect
            # even where this cell's own steps are steady
            suspect = ", ".join(w for w, bad in (("T(1) noisy", base_noisy and n > 1 and not shared),
                                                  ("above 100%", np.isfinite(eff) and eff > 1.05 and n > 1),
                                                  (SHARED_SUSPECT, shared)) if bad)
            rows.append({"variant": variant, "world_size": n, "bucket_mb": r["bucket_mb"], "step_ms": tn,
                         "step_ms_p10": r.get("step_ms_p10"), "step_ms_p90": r.get("step_ms_p90"),
                         "throughput": r["throughput"], "speedup": speed, "efficiency": eff, "ideal_speedup": float(n),
                         "oversubscribed": bool(r["oversubscribed"]),
                         "noisy": bool(r["noisy"]) if "noisy" in r else _noisy(r), "suspect": suspect,
                         "mode": mode, "gpus_shared": shared})
    return pd.DataFrame(rows, columns=SCALING_COLUMNS)


def bucket_sweep(summary: pd.DataFrame, jobs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Rows of (variant, world size) cells measured at more than one bucket size. ``jobs``
    (``Run.jobs``): its comm-hook jobs are left out, so each cell is the plain variant's (a hook
    job beside it has the same variant, world size and bucket size: the Compression panel's)."""
    cols = ["variant", "world_size", "bucket_mb", "step_ms", "exposed_ms", "overlap_pct", "comm_ops"]
    ok = summary[np.isfinite(pd.to_numeric(summary["step_ms"], errors="coerce"))]
    if jobs is not None and "comm_hook" in jobs and "job_id" in ok:
        hooked = jobs.loc[jobs["comm_hook"].notna() & (jobs["comm_hook"].astype(str) != "none"), "job_id"]
        ok = ok[~ok["job_id"].isin(set(hooked.astype(str)))]
    n = ok.groupby(["variant", "world_size"])["bucket_mb"].transform("nunique")
    return ok[n > 1][cols].sort_values(["variant", "world_size", "bucket_mb"]).reset_index(drop=True)
