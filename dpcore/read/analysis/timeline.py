"""Intervals for the per-step timeline view (compute and comm lanes per rank), and the per-step
overlap of every traced job (the trace half of the metrics).

From the job's traces when they contain the step (merged compute so a 250k-event trace stays a
few hundred bars), else from steps.csv phases and collectives.csv rows. Times are ms relative to
the step's earliest start across ranks on the shared clock. Pure: the traces arrive as events
frames, read by :mod:`dpcore.read.rundir.job_traces` (``job_trace_events``,
``step_trace_events``, ``traced_job_events``).

Why the collective family (``op``) is a column here: which collective a comm span is lives only
in its name (``dpcore.read.traces.kinds.comm_op``); classifying it is analysis, so the plot layer
colours by the column and never re-reads event names.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from dpcore.contract.clocksync import SYNC_MARKER, trace_shift_us
from dpcore.contract.intervals import merge
from dpcore.read.analysis.comm_overlap import (
    MS_NS,
    TRACE_COLUMNS,
    _trace_sets,
    comm_start_ns,
    compute_intervals_ns,
    overlap_from_trace,
)
from dpcore.read.rundir.load import Run
from dpcore.read.traces.kinds import comm_op

#: ``op``: the collective family of a comm row (:func:`comm_op` of its name), "" on compute rows.
COLUMNS = ["rank", "lane", "name", "op", "start_ms", "end_ms"]


def _sync_shift_us(events: pd.DataFrame, sync: object, rank: int) -> float | None:
    """µs to add to a rank's trace ``ts`` to land on the shared clock.

    The profiler's clock is not ours; dpcore's worker brackets ``dpcore_clock_sync#k`` ranges
    with shared-clock reads saved in run.json (``clock_sync_ns``); see dpcore.contract.clocksync.
    """
    if not isinstance(sync, dict) or not isinstance(sync.get(str(rank)), list):
        return None
    marks = events[events["name"].astype(str).str.startswith(SYNC_MARKER)]
    return trace_shift_us(marks["name"], marks["ts"], sync[str(rank)])


def trace_step_metrics(job_events: Iterable[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """Per (job, rank, traced step) overlap from every traced job's events, as
    :func:`overlap_from_trace` rows with a ``job_id`` column. ``job_events``: (job_id, events)
    pairs, :func:`dpcore.read.rundir.job_traces.traced_job_events` of a run. A job left out
    (traces missing or unreadable) has no rows (its numbers then come from the recorded
    collectives)."""
    frames = []
    for job_id, events in job_events:
        frames.append(overlap_from_trace(events).assign(job_id=str(job_id)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["job_id", *TRACE_COLUMNS])


def _from_trace(run: Run, job_id: str, step: int, t0_ns: float,
                events: pd.DataFrame | None) -> pd.DataFrame | None:
    if events is None or events.empty:
        return None
    job = run.jobs[run.jobs["job_id"] == job_id]
    sync = job["clock_sync_ns"].iloc[0] if "clock_sync_ns" in job and len(job) else None
    # imported runs (dpcore import): no sync markers in a foreign trace; the importer recorded
    # each rank's shift instead (0 on one host, minus the estimated offset across hosts)
    shifts = job["clock_shift_us"].iloc[0] if "clock_shift_us" in job and len(job) else None
    rows = []
    for rank, all_ev in events.groupby("rank", sort=True):
        ev = all_ev[all_ev["step"] == step]
        if ev.empty:
            return None
        shift_us = _sync_shift_us(all_ev, sync, int(rank))
        if shift_us is None and isinstance(shifts, dict) and shifts.get(str(rank)) is not None:
            shift_us = float(shifts[str(rank)])
        if shift_us is None:
            return None
        to_ms = lambda us, shift_us=shift_us: ((np.asarray(us) + shift_us) * 1e3 - t0_ns) / MS_NS  # noqa: E731
        (c_s, c_e), (p_s, p_e) = _trace_sets(ev)
        p_s, p_e = merge(p_s, p_e)
        rows += [{"rank": int(rank), "lane": "compute", "name": "compute", "start_ms": a, "end_ms": b}
                 for a, b in zip(to_ms(p_s), to_ms(p_e))]
        comm = ev[ev["kind"] == "comm"]
        rows += [{"rank": int(rank), "lane": "comm", "name": str(n), "start_ms": a, "end_ms": b}
                 for n, a, b in zip(comm["name"], to_ms(comm["ts"]), to_ms(comm["ts"] + comm["dur"]))]
    return pd.DataFrame(rows, columns=COLUMNS)


def _comm_from_csv(run: Run, job_id: str, step: int, t0: float) -> list[dict]:
    """Comm lanes from collectives.csv (launch .. completion on the shared clock)."""
    c = run.collectives[(run.collectives["job_id"] == job_id) & (run.collectives["step"] == step)]
    if c.empty:
        return []
    start = comm_start_ns(c)
    return [{"rank": int(rk), "lane": "comm", "name": f"{op} #{sq}", "start_ms": (a - t0) / MS_NS,
             "end_ms": (b - t0) / MS_NS}
            for rk, op, sq, a, b in zip(c["rank"], c["op"], c["seq"], start, c["t_end_ns"])]


def _with_op(df: pd.DataFrame) -> pd.DataFrame:
    """Fill ``op``: the family of each comm row's name (one classification per distinct name)."""
    names = df["name"].astype(str)
    ops = names.map({n: comm_op(n) for n in names.unique()})
    return df.assign(op=ops.where(df["lane"] == "comm", ""))[COLUMNS]


def timeline(run: Run, job_id: str, step: int, events: pd.DataFrame | None) -> pd.DataFrame:
    """rank, lane ('compute'|'comm'), name, op, start_ms, end_ms of one step of one job.

    ``op`` is the collective family of a comm row (``all_reduce``, ``all_gather``,
    ``reduce_scatter``, ``broadcast``, ``send_recv`` or ``other``; :func:`comm_op` of its name)
    and "" on compute rows.

    ``events``: the job's trace events when the step is traced, else None
    (:func:`dpcore.read.rundir.job_traces.step_trace_events`; a caller drawing several steps
    reads ``job_trace_events`` once and passes it for each traced step).

    From the trace when it holds the step; a rank whose trace shows no comm (gloo runs
    point-to-point transfers of the from-scratch ring/central/naive off any traced thread)
    gets its comm lane from collectives.csv, which is on the same shared clock.
    """
    st = run.steps[(run.steps["job_id"] == job_id) & (run.steps["step"] == step)]
    t0 = float(st["t_start_ns"].min()) if not st.empty else 0.0
    df = _from_trace(run, job_id, step, t0, events)
    if df is not None and not df.empty:
        has_comm = set(df.loc[df["lane"] == "comm", "rank"])
        extra = [r for r in _comm_from_csv(run, job_id, step, t0) if r["rank"] not in has_comm]
        if extra:
            df = pd.concat([df, pd.DataFrame(extra, columns=COLUMNS)], ignore_index=True)
        return _with_op(df.sort_values(["rank", "lane", "start_ms"]).reset_index(drop=True))
    rows = []
    for r in st.to_dict("records"):
        # the same phase layout the overlap numbers use (fwd, bwd, then opt after the sync wait)
        starts, ends = compute_intervals_ns(r)
        rows += [{"rank": int(r["rank"]), "lane": "compute", "name": n, "start_ms": (a - t0) / MS_NS,
                  "end_ms": (b - t0) / MS_NS}
                 for n, a, b in zip(("forward", "backward", "optimizer"), starts, ends)]
    rows += _comm_from_csv(run, job_id, step, t0)
    return _with_op(pd.DataFrame(rows, columns=COLUMNS).sort_values(["rank", "lane", "start_ms"])
                    .reset_index(drop=True))
