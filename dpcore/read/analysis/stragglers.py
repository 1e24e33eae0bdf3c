"""Stragglers and skew: which rank makes the others wait at each collective.

A collective completes only when every rank has joined it, so the rank that arrives last sets
its pace; every other rank's time in the collective is partly waiting for that rank, partly
moving data. DESIGN.md "collective wait (stragglers)": for one collective matched across ranks,

* a rank's **wait** = latest arrival − its own arrival; the rank with wait 0 arrived last
  (with exact ties every tied rank counts as last, so per job the ranks' last-arrival shares
  add up to ≥ 100 %);
* **start skew** = latest − earliest start; **end skew** = latest − earliest end;
* a rank's comm time (end − arrival) splits into **wait** and **transfer** = comm − wait
  (= end − latest arrival, clipped at 0): the part after everyone had arrived.

Arrival is when the rank reached the collective: ``t_launch_ns`` of collectives.csv. A
collective is matched by (job_id, step, seq) and kept only when every rank of the job recorded
it: one seen on fewer ranks cannot be matched and is dropped (so are jobs of one rank). For
asynchronous collectives (``overlap``, ``bucketed``, DDP) the wait is time the collective sat
waiting for its peers, which the rank may have spent computing: it measures skew, not idleness.

Pure pandas/numpy: DataFrames in, DataFrames out (the ``stragglers`` command's text and its
verdict sentence are :mod:`dpcore.read.report.stragglers`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.read.analysis.comm_overlap import MS_NS, comm_start_ns

KEY = ["job_id", "step", "seq"]
WAIT_COLUMNS = ["job_id", "step", "seq", "rank", "op", "bytes", "arrival_ns", "end_ns", "wait_ms", "last",
                "start_skew_ms", "end_skew_ms", "comm_ms", "transfer_ms"]
SUMMARY_COLUMNS = ["job_id", "rank", "collectives", "last_arrival_pct", "mean_wait_ms", "p90_wait_ms",
                   "wait_ms", "transfer_ms", "comm_ms", "wait_fraction", "mean_start_skew_ms",
                   "mean_end_skew_ms"]


def _num(s: pd.Series) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(np.float64)


def collective_waits(collectives: pd.DataFrame) -> pd.DataFrame:
    """One row per (job_id, step, seq, rank) of every collective seen on all ranks of its job.

    ``collectives`` has collectives.csv's columns (``t_start_ns`` optional). Start skew uses the
    backend's start where it reported one (``t_start_ns``, NCCL), else the launch: on gloo, which
    never reports a start, start skew therefore equals the collective's largest wait.
    Columns: WAIT_COLUMNS (times ``*_ns`` on the shared clock, durations in ms).
    """
    if collectives is None or collectives.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    c = collectives.assign(rank=_num(collectives["rank"]), step=_num(collectives["step"]),
                           seq=_num(collectives["seq"]), arrival_ns=_num(collectives["t_launch_ns"]),
                           end_ns=_num(collectives["t_end_ns"]), _start=comm_start_ns(collectives))
    c = c.dropna(subset=["rank", "step", "seq", "arrival_ns", "end_ns"])
    c = c.drop_duplicates(subset=KEY + ["rank"], keep="first")
    if c.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    for col in ("rank", "step", "seq"):
        c[col] = c[col].astype(np.int64)
    job_ranks = c.groupby("job_id")["rank"].transform("nunique")
    seen_on = c.groupby(KEY)["rank"].transform("size")
    c = c[(seen_on == job_ranks) & (job_ranks >= 2)]
    if c.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    g = c.groupby(KEY)
    latest = g["arrival_ns"].transform("max")
    wait = (latest - c["arrival_ns"]) / MS_NS
    comm = (c["end_ns"] - c["arrival_ns"]) / MS_NS
    out = c.assign(
        wait_ms=wait, last=wait <= 0,
        start_skew_ms=(g["_start"].transform("max") - g["_start"].transform("min")) / MS_NS,
        end_skew_ms=(g["end_ns"].transform("max") - g["end_ns"].transform("min")) / MS_NS,
        comm_ms=comm, transfer_ms=(comm - wait).clip(lower=0.0))
    for col in ("op", "bytes"):
        if col not in out:
            out[col] = np.nan
    return out[WAIT_COLUMNS].sort_values(KEY + ["rank"]).reset_index(drop=True)


def straggler_summary(waits: pd.DataFrame) -> pd.DataFrame:
    """Per (job_id, rank): how often the rank arrived last and how long it waited for the others.

    last_arrival_pct = 100 · (collectives where the rank had wait 0) / collectives; wait_ms,
    transfer_ms and comm_ms are totals over the matched collectives; wait_fraction = wait / comm
    (NaN without comm time); mean_start_skew_ms / mean_end_skew_ms average the skews of the
    collectives the rank took part in (the same for every rank of a job). Columns: SUMMARY_COLUMNS.
    wait + transfer = comm, except where a rank's collective ended before the last rank arrived
    (impossible for an all-reduce on one clock: a clock error, or the root of a broadcast):
    transfer is then 0 and wait_fraction can exceed 1, which flags that timing.
    """
    if waits is None or waits.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    g = waits.groupby(["job_id", "rank"], sort=False)
    s = g.agg(collectives=("wait_ms", "size"), last_n=("last", "sum"), mean_wait_ms=("wait_ms", "mean"),
              p90_wait_ms=("wait_ms", lambda w: float(np.quantile(w, 0.9))), wait_ms=("wait_ms", "sum"),
              transfer_ms=("transfer_ms", "sum"), comm_ms=("comm_ms", "sum"),
              mean_start_skew_ms=("start_skew_ms", "mean"), mean_end_skew_ms=("end_skew_ms", "mean")).reset_index()
    s["last_arrival_pct"] = 100.0 * s["last_n"] / s["collectives"]
    s["wait_fraction"] = (s["wait_ms"] / s["comm_ms"].where(s["comm_ms"] > 0)).astype(float)
    s["collectives"] = s["collectives"].astype(np.int64)
    s["rank"] = s["rank"].astype(np.int64)
    order = {j: i for i, j in enumerate(dict.fromkeys(waits["job_id"]))}
    s = s.assign(_o=s["job_id"].map(order)).sort_values(["_o", "rank"])
    return s[SUMMARY_COLUMNS].reset_index(drop=True)


def stragglers_from_traces(events: pd.DataFrame, job_id: str = "") -> pd.DataFrame:
    """:func:`collective_waits` of a folder of torch.profiler traces (``read_trace_dir``'s events).

    Comm events (kind ``comm``: NCCL kernels on GPU, ``gloo:*`` spans on a gloo worker thread on
    CPU) are matched by order: the n-th comm event of every rank within one ProfilerStep (step
    −1 outside every step) is the same collective, because data-parallel ranks issue their
    collectives in the same order. A step in which the ranks saw different numbers of comm
    events cannot be matched by order and is dropped whole.

    Arrival is the event's ``ts``: on GPU when the NCCL kernel started on its stream, on CPU when
    the gloo thread picked the collective up (slightly after the main thread launched it). The
    traces must share one clock: torch.profiler stamps events with the host's clock, so ranks of
    one host compare directly; traces of several hosts need a clock shift first. ``bytes`` is
    unknown in traces (NaN) and start = arrival, so start skew is the largest wait.
    """
    comm = events[events["kind"] == "comm"] if events is not None and len(events) else None
    if comm is None or comm.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    ranks = sorted(int(r) for r in events["rank"].unique())
    comm = comm.sort_values(["rank", "step", "ts"], kind="stable")
    counts = comm.groupby(["step", "rank"]).size().unstack(fill_value=0).reindex(columns=ranks, fill_value=0)
    same = counts.index[counts.min(axis=1) == counts.max(axis=1)]
    comm = comm[comm["step"].isin(same)]
    ts_ns = comm["ts"].to_numpy(np.float64) * 1e3
    rows = pd.DataFrame({
        "job_id": job_id, "rank": comm["rank"].to_numpy(np.int64), "step": comm["step"].to_numpy(np.int64),
        "seq": comm.groupby(["rank", "step"]).cumcount().to_numpy(np.int64), "op": comm["name"].astype(str).to_numpy(),
        "bytes": np.nan, "t_launch_ns": ts_ns, "t_start_ns": ts_ns,
        "t_end_ns": ts_ns + comm["dur"].to_numpy(np.float64) * 1e3})
    return collective_waits(rows)


def straggler_threshold_pct(world_size: int) -> float:
    """Share of last arrivals that makes a rank *the* straggler: halfway between chance (100/N)
    and always (100 %), never below 50 %. With two ranks one of them is last at least half of
    the time by pure chance, so "≥ 50 %" alone would name a straggler in every 2-rank job."""
    n = max(1, int(world_size))
    return max(50.0, (100.0 / n + 100.0) / 2.0)
