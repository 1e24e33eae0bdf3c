"""What the Live page shows of a running job, from live.csv's rows (pure pandas).

Which rank is slow: in data parallelism every rank waits for the slowest at each collective, so
step times are nearly equal; the rank that makes the others wait is the one with the most work
outside communication. A step's ``busy_ms`` is therefore ``step_ms - comm_ms`` where comm is
recorded (else ``step_ms``), and the step's slowest rank is the one with the largest busy_ms.
A rank slowest in at least :data:`PERSISTENT_SHARE` of the last :data:`WINDOW` steps (and at
least :data:`MIN_STEPS` of them) is a persistent straggler; one slow step is a stall, not a
straggler.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: steps the Live page summarises (the last ones)
WINDOW = 20
#: share of the window a rank must be slowest in to be flagged as a persistent straggler
PERSISTENT_SHARE = 0.5
#: and at least this many steps (a job with 3 steps so far flags nobody)
MIN_STEPS = 5


def latest_job(live: pd.DataFrame) -> str | None:
    """The job whose row arrived last (the one running now, or the last one that ran)."""
    if live.empty:
        return None
    wall = pd.to_numeric(live["wall_time"], errors="coerce").to_numpy(dtype=float)
    at = int(np.nanargmax(wall)) if (~np.isnan(wall)).any() else -1  # the latest row, else the last one
    return str(live["job_id"].iloc[at])


def job_rows(live: pd.DataFrame, job_id: str, last: int | None = WINDOW) -> pd.DataFrame:
    """One job's rows, its last ``last`` steps (None: all), with ``busy_ms``."""
    df = live[live["job_id"] == job_id].copy()
    if last is not None and not df.empty:
        df = df[df["step"] > df["step"].max() - last]
    comm = pd.to_numeric(df["comm_ms"], errors="coerce")
    df["busy_ms"] = (df["step_ms"] - comm.fillna(0.0)).clip(lower=0.0)
    return df.sort_values(["step", "rank"]).reset_index(drop=True)


def rank_stats(rows: pd.DataFrame) -> pd.DataFrame:
    """Per rank over ``rows``: steps, median and p90 step time, median comm and exposed comm
    (NaN where not recorded)."""
    cols = ["rank", "steps", "step_ms_p50", "step_ms_p90", "comm_ms", "exposed_comm_ms"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    g = rows.groupby("rank")
    out = pd.DataFrame({
        "steps": g["step"].count(),
        "step_ms_p50": g["step_ms"].median(),
        "step_ms_p90": g["step_ms"].quantile(0.9),
        "comm_ms": g["comm_ms"].median(),
        "exposed_comm_ms": pd.to_numeric(rows["exposed_comm_ms"], errors="coerce")
        .groupby(rows["rank"]).median(),
    }).reset_index()
    return out[cols]


def slowest_counts(rows: pd.DataFrame, world_size: int | None = None) -> pd.DataFrame:
    """Per rank: in how many of the steps every rank has reported it was the slowest
    (largest busy_ms), and whether that makes it a persistent straggler."""
    cols = ["rank", "slowest", "steps", "persistent"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    ranks = sorted(rows["rank"].unique())
    n = world_size or len(ranks)
    complete = rows.groupby("step").filter(lambda g: g["rank"].nunique() == n)
    if complete.empty:
        return pd.DataFrame({"rank": ranks, "slowest": 0, "steps": 0, "persistent": False})[cols]
    winners = complete.loc[complete.groupby("step")["busy_ms"].idxmax(), "rank"]
    steps = complete["step"].nunique()
    counts = winners.value_counts().reindex(ranks, fill_value=0)
    out = pd.DataFrame({"rank": ranks, "slowest": counts.to_numpy(), "steps": steps})
    need = max(MIN_STEPS, PERSISTENT_SHARE * steps)
    out["persistent"] = (out["slowest"] >= need) & (n > 1)
    return out[cols]
