"""Intervals for the per-step timeline view (compute and comm lanes per rank), and the per-step
overlap of every traced job (the trace half of the metrics).

From the job's traces when they contain the step (merged compute so a 250k-event trace stays a
few hundred bars), else from steps.csv phases and collectives.csv rows. Times are ms relative to
the step's earliest start across ranks on the shared clock. Pure: the traces arrive as lanes
tables (:func:`trace_lanes`: what the timeline draws of each rank, per traced step, on the
trace's own clock), which the rank cache keeps (:func:`dpcore.read.ranks.pool.job_lanes`, what
the Timeline page reads), or as events frames read by :mod:`dpcore.read.rundir.job_traces`
(``job_trace_events``, ``step_trace_events``, ``traced_job_events``), reduced here the same way.

Why a lanes table between the events and the drawn rows: a rank's trace is parsed once and kept
as compact tables (:mod:`dpcore.read.ranks`); the lanes are per-rank data, so they are one of
them, and a view draws a step of 8 of 1,024 ranks without parsing a trace. Only placing them on
the shared clock needs the run (run.json's clock-sync samples), so that step stays here, after
the table.

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
    by_name,
    comm_start_ns,
    compute_intervals_ns,
    overlap_from_trace,
    trace_sets,
)
from dpcore.read.rundir.load import Run
from dpcore.read.traces.kinds import comm_op

#: ``op``: the collective family of a comm row (:func:`comm_op` of its name), "" on compute rows.
COLUMNS = ["rank", "lane", "name", "op", "start_ms", "end_ms"]
#: A lanes table (:func:`trace_lanes`): per rank one ``lane`` "rank" row (step -1, its first
#: event start .. last event end: the rank has events), per rank and traced step (``step`` >= 0)
#: one "step" row (the step's first event start .. last event end: the step has events), its merged
#: compute ("compute", named "compute") and its comm events ("comm", the event's name); per rank
#: its clock-sync markers ("sync", step -1, named ``dpcore_clock_sync#k``). ``start_us`` and
#: ``end_us`` are the trace's own ``ts`` and ``ts + dur`` (µs on the profiler's clock), unrounded.
LANE_COLUMNS = ["rank", "step", "lane", "name", "start_us", "end_us"]


def trace_lanes(events: pd.DataFrame, steps: Iterable[int] | None = None) -> pd.DataFrame:
    """The lanes table (:data:`LANE_COLUMNS`) of an events frame: what :func:`timeline` draws of
    each rank in each traced step (only ``steps`` when given), before it is placed on the shared
    clock. Rank by rank (each rank's rows depend only on its own events), so the tables of ranks
    reduced one at a time concatenate to the table of all of them at once. Built as whole
    columns, one frame at the end (a frame per step and lane cost half the reduction)."""
    cols: dict[str, list[np.ndarray]] = {c: [] for c in LANE_COLUMNS}
    want = None if steps is None else {int(s) for s in steps}

    def add(rank: int, step: int, lane: str, names: str | Iterable[object], start: np.ndarray, end: np.ndarray) -> None:
        n = len(start)
        labels = np.empty(n, dtype=object)
        labels[:] = names if isinstance(names, str) else [str(x) for x in names]
        for c, v in (("rank", np.full(n, rank, np.int64)), ("step", np.full(n, step, np.int64)),
                     ("lane", np.full(n, lane, dtype=object)), ("name", labels),
                     ("start_us", np.asarray(start, np.float64)), ("end_us", np.asarray(end, np.float64))):
            cols[c].append(v)

    for rank, all_ev in events.groupby("rank", sort=True):
        rank = int(rank)
        ts, end = all_ev["ts"].to_numpy(np.float64), (all_ev["ts"] + all_ev["dur"]).to_numpy(np.float64)
        add(rank, -1, "rank", "", ts.min(keepdims=True), end.max(keepdims=True))
        marks = by_name(all_ev["name"], lambda n: n.startswith(SYNC_MARKER))
        add(rank, -1, "sync", all_ev["name"][marks], ts[marks], end[marks])
        traced = all_ev[all_ev["step"] >= 0]
        for step, ev in traced.groupby("step", sort=True):
            if want is not None and int(step) not in want:
                continue
            ts, end = ev["ts"].to_numpy(np.float64), (ev["ts"] + ev["dur"]).to_numpy(np.float64)
            add(rank, int(step), "step", "", ts.min(keepdims=True), end.max(keepdims=True))
            _, (p_s, p_e) = trace_sets(ev)
            p_s, p_e = merge(p_s, p_e)
            add(rank, int(step), "compute", "compute", p_s, p_e)
            comm = (ev["kind"] == "comm").to_numpy()
            add(rank, int(step), "comm", ev["name"][comm], ts[comm], end[comm])
    empty = {"rank": np.int64, "step": np.int64, "lane": object, "name": object, "start_us": np.float64,
             "end_us": np.float64}
    return pd.DataFrame({c: np.concatenate(v) if v else np.empty(0, empty[c]) for c, v in cols.items()})


def _sync_shift_us(marks: pd.DataFrame, sync: object, rank: int) -> float | None:
    """µs to add to a rank's trace ``ts`` to land on the shared clock, from its lanes table's
    "sync" rows (the rank's ``dpcore_clock_sync#k`` markers).

    The profiler's clock is not ours; dpcore's worker brackets ``dpcore_clock_sync#k`` ranges
    with shared-clock reads saved in run.json (``clock_sync_ns``); see dpcore.contract.clocksync.
    """
    if not isinstance(sync, dict) or not isinstance(sync.get(str(rank)), list):
        return None
    return trace_shift_us(marks["name"], marks["start_us"], sync[str(rank)])


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
                lanes: pd.DataFrame | None) -> pd.DataFrame | None:
    """The drawn rows of ``step`` from a lanes table, on the shared clock; None (the caller
    falls back to steps.csv) when a rank has no event in the step or cannot be placed."""
    if lanes is None or lanes.empty:
        return None
    job = run.jobs[run.jobs["job_id"] == job_id]
    sync = job["clock_sync_ns"].iloc[0] if "clock_sync_ns" in job and len(job) else None
    # imported runs (dpcore import): no sync markers in a foreign trace; the importer recorded
    # each rank's shift instead (0 on one host, minus the estimated offset across hosts)
    shifts = job["clock_shift_us"].iloc[0] if "clock_shift_us" in job and len(job) else None
    cols: dict[str, list[np.ndarray]] = {c: [] for c in ("rank", "lane", "name", "start_ms", "end_ms")}
    for rank, mine in lanes.groupby("rank", sort=True):
        rows = mine[mine["step"] == step]
        if not (rows["lane"] == "step").any():
            return None
        shift_us = _sync_shift_us(mine[mine["lane"] == "sync"], sync, int(rank))
        if shift_us is None and isinstance(shifts, dict) and shifts.get(str(rank)) is not None:
            shift_us = float(shifts[str(rank)])
        if shift_us is None:
            return None
        to_ms = lambda us, shift_us=shift_us: ((np.asarray(us) + shift_us) * 1e3 - t0_ns) / MS_NS  # noqa: E731
        for lane in ("compute", "comm"):
            r = rows[rows["lane"] == lane]
            for c, v in (("rank", np.full(len(r), int(rank), np.int64)), ("lane", r["lane"].to_numpy(object)),
                         ("name", r["name"].to_numpy(object)), ("start_ms", to_ms(r["start_us"])),
                         ("end_ms", to_ms(r["end_us"]))):
                cols[c].append(v)
    # one frame from whole columns: its text columns get the dtype pandas infers for strings
    return pd.DataFrame({c: np.concatenate(v) for c, v in cols.items()}).reindex(columns=COLUMNS)


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


def timeline(run: Run, job_id: str, step: int, events: pd.DataFrame | None = None,
             lanes: pd.DataFrame | None = None) -> pd.DataFrame:
    """rank, lane ('compute'|'comm'), name, op, start_ms, end_ms of one step of one job.

    ``op`` is the collective family of a comm row (``all_reduce``, ``all_gather``,
    ``reduce_scatter``, ``broadcast``, ``send_recv`` or ``other``; :func:`comm_op` of its name)
    and "" on compute rows.

    ``lanes``: the job's lanes table (:func:`trace_lanes`) when the step is traced, else None:
    :func:`dpcore.read.ranks.pool.job_lanes` reads it from the rank cache (the Timeline page).
    Or ``events``: the job's trace events (:func:`dpcore.read.rundir.job_traces.step_trace_events`,
    or ``job_trace_events`` read once for several steps), reduced here by :func:`trace_lanes`;
    both give the same frame.

    From the trace when it holds the step; a rank whose trace shows no comm (gloo runs
    point-to-point transfers of the from-scratch ring/central/naive off any traced thread)
    gets its comm lane from collectives.csv, which is on the same shared clock.
    """
    st = run.steps[(run.steps["job_id"] == job_id) & (run.steps["step"] == step)]
    t0 = float(st["t_start_ns"].min()) if not st.empty else 0.0
    if lanes is None and events is not None and not events.empty:
        lanes = trace_lanes(events, steps=[step])
    df = _from_trace(run, job_id, step, t0, lanes)
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
