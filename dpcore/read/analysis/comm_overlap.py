"""Communication/computation overlap, per rank and step (the Holistic Trace Analysis definition).

overlap % = |comm ∩ compute| / |comm|, with comm and compute taken as *unions* of intervals
(HTA ``get_comm_comp_overlap``); exposed comm E = |comm \\ compute| is what communication adds to
the step, and comm fraction = E / T (docs/DESIGN.md).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.contract.intervals import comm_start, overlap_stats, step_comm, subtract
from dpcore.contract.runformat import parse_bools

MS_NS = 1e6
BREAKDOWN_COLUMNS = ["job_id", "variant", "world_size", "bucket_mb", "rank", "step", "step_ms", "fwd_ms", "bwd_ms",
                     "sync_ms", "opt_ms", "compute_ms",
                     "comm_ms", "overlapped_ms", "exposed_ms", "other_ms", "overlap_pct", "comm_fraction",
                     "comm_ops", "comm_bytes", "samples"]
TRACE_COLUMNS = ["rank", "step", "compute_ms", "comm_ms", "overlapped_ms", "exposed_ms", "overlap_pct"]
RANK_COLUMNS = ["rank", "overlap_pct", "comm_ms", "exposed_comm_ms", "compute_ms"]


def comm_start_ns(collectives: pd.DataFrame) -> np.ndarray:
    """When each collective began: t_start_ns when the backend reported it, else t_launch_ns."""
    launch = pd.to_numeric(collectives["t_launch_ns"], errors="coerce").to_numpy(np.float64)
    if "t_start_ns" not in collectives:
        return launch
    return comm_start(launch, pd.to_numeric(collectives["t_start_ns"], errors="coerce").to_numpy(np.float64))


def compute_intervals_ns(row: "pd.Series | dict") -> tuple[np.ndarray, np.ndarray]:
    """Main-thread compute of one steps.csv row on the shared clock: fwd, bwd, then opt after sync."""
    t0 = float(row["t_start_ns"])
    fwd, bwd, sync, opt = (float(row[k]) * MS_NS for k in ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms"))
    starts = np.array([t0, t0 + fwd, t0 + fwd + bwd + sync])
    return starts, starts + np.array([fwd, bwd, opt])


def step_breakdown(steps: pd.DataFrame, collectives: pd.DataFrame,
                   profiled: bool = False) -> pd.DataFrame:
    """One row per timed (profiled == False) step and rank; see ANALYSIS_API.md for the columns.

    ``profiled=True`` selects the profiled steps instead: the ones with a trace, so the same
    steps can be measured both ways (this interval method vs :func:`overlap_from_trace`).

    Comm intervals are the rank's collectives of that step clipped to the step window
    [t_start, t_start + step_ms]; compute is fwd + bwd + opt (the main thread's phases), so the
    intersection is exact on the shared clock.
    """
    if steps is None or steps.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    if "profiled" in steps:
        is_prof = np.asarray(parse_bools(steps["profiled"].tolist()), dtype=bool)
        st = steps[is_prof if profiled else ~is_prof]
    else:
        st = steps if not profiled else steps.iloc[0:0]
    groups: dict = {}
    have_coll = collectives is not None and not collectives.empty
    if have_coll:
        c_start, c_end = comm_start_ns(collectives), collectives["t_end_ns"].to_numpy(np.float64)
        c_bytes = pd.to_numeric(collectives["bytes"], errors="coerce").to_numpy(np.float64)  # NaN: unknown
        keys = list(zip(collectives["job_id"], collectives["rank"].astype(int), collectives["step"].astype(int)))
        for i, k in enumerate(keys):
            groups.setdefault(k, []).append(i)
    rows = []
    for rec in st.to_dict("records"):
        t0, step_ms = float(rec["t_start_ns"]), float(rec["step_ms"])
        idx = groups.get((rec["job_id"], int(rec["rank"]), int(rec["step"])), [])
        comm = step_comm(c_start[idx], c_end[idx], t0, step_ms) if idx else (np.empty(0), np.empty(0))
        compute = compute_intervals_ns(rec)
        s = overlap_stats(comm, compute)
        if np.isnan(compute[0]).any() or np.isnan(compute[1]).any():
            # a phase is unknown (an imported trace names no such range): where compute lay in
            # the step is unknown too, so overlap and exposed comm are missing, not guessed
            s = {**s, "overlapped": np.nan, "exposed": np.nan, "overlap_pct": np.nan}
        compute_ms = sum(float(rec[k]) for k in ("fwd_ms", "bwd_ms", "opt_ms"))
        exposed = s["exposed"] / MS_NS
        rows.append({
            "job_id": rec["job_id"], "variant": rec.get("variant"), "world_size": rec.get("world_size"),
            "bucket_mb": rec.get("bucket_mb"), "rank": int(rec["rank"]), "step": int(rec["step"]),
            "step_ms": step_ms, **{k: float(rec[k]) for k in ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms")},
            "compute_ms": compute_ms, "comm_ms": s["comm"] / MS_NS,
            "overlapped_ms": s["overlapped"] / MS_NS, "exposed_ms": exposed,
            "other_ms": max(0.0, step_ms - compute_ms - exposed) if not np.isnan(exposed + compute_ms) else np.nan,
            "overlap_pct": s["overlap_pct"],
            "comm_fraction": exposed / step_ms if step_ms > 0 else float("nan"),
            # counted from collectives.csv when the run has it (one definition), else steps.csv's
            "comm_ops": len(idx) if have_coll else rec.get("comm_ops"),
            "comm_bytes": _known_sum(c_bytes[idx]) if have_coll else rec.get("comm_bytes"),
            "samples": rec.get("samples"),
        })
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)


def _known_sum(nbytes: np.ndarray) -> float:
    """Σ bytes of a step's collectives (an int); NaN when any of them is unknown (an imported
    trace without collective metadata): unknown reads as unknown, never as 0."""
    return int(nbytes.sum()) if np.isfinite(nbytes).all() else float("nan")


def _trace_sets(ev: pd.DataFrame) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(comm, compute) interval unions in µs of one rank's events.

    Compute excludes waits/launches on the compute threads (kind 'sync' on the same pid/tid as
    compute events): on CPU a hook's collective launch inside backward is not model compute.
    """
    kind = ev["kind"].to_numpy()
    ts, end = ev["ts"].to_numpy(np.float64), (ev["ts"] + ev["dur"]).to_numpy(np.float64)
    comm, comp, sync = kind == "comm", kind == "compute", kind == "sync"
    compute = (ts[comp], end[comp])
    if sync.any() and comp.any():
        threads = ev["pid"].astype(str) + "/" + ev["tid"].astype(str)
        hole = sync & threads.isin(set(threads[comp])).to_numpy()
        if hole.any():
            compute = subtract(ts[comp], end[comp], ts[hole], end[hole])
    return (ts[comm], end[comm]), compute


def _row(rank: int, step: int, ev: pd.DataFrame) -> dict:
    s = overlap_stats(*_trace_sets(ev))
    return {"rank": rank, "step": step, "compute_ms": s["compute"] / 1e3, "comm_ms": s["comm"] / 1e3,
            "overlapped_ms": s["overlapped"] / 1e3, "exposed_ms": s["exposed"] / 1e3, "overlap_pct": s["overlap_pct"]}


def overlap_from_trace(events: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, ProfilerStep) overlap from trace events; step = -1 (whole trace) without steps."""
    rows = []
    for rank, ev in events.groupby("rank", sort=True):
        steps = sorted(int(s) for s in ev["step"].unique() if s >= 0)
        if not steps:
            rows.append(_row(int(rank), -1, ev))
        for step, sev in ev[ev["step"] >= 0].groupby("step", sort=True):
            rows.append(_row(int(rank), int(step), sev))
    return pd.DataFrame(rows, columns=TRACE_COLUMNS)


def overlap_by_rank(events: pd.DataFrame) -> pd.DataFrame:
    """Per rank over the whole trace (what `dpcore analyze` prints; comparable to HTA per rank)."""
    rows = []
    for rank, ev in events.groupby("rank", sort=True):
        r = _row(int(rank), -1, ev)
        rows.append({"rank": int(rank), "overlap_pct": r["overlap_pct"], "comm_ms": r["comm_ms"],
                     "exposed_comm_ms": r["exposed_ms"], "compute_ms": r["compute_ms"]})
    return pd.DataFrame(rows, columns=RANK_COLUMNS)
