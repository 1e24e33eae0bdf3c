"""The per-step timeline view: each rank's lanes (compute and comm, or a GPU rank's launch threads
and streams) of one step of one job, on the shared clock.

From the job's lanes table (:func:`dpcore.read.analysis.lanes.trace_lanes` of the step, reduced
from the rank cache's lane events: :func:`dpcore.read.tables.job_lanes`) when it holds
the step, else from steps.csv phases and collectives.csv rows. Times are ms relative to the
step's earliest start across ranks on the shared clock. Pure: only placing the lanes on the
shared clock needs the run (run.json's clock-sync samples), so that step is here.

Why the collective family (``op``) is a column here: which collective a comm span is lives only
in its name (``dpcore.read.traces.kinds.comm_op``); classifying it is analysis, so the plot layer
colours by the column and never re-reads event names.
"""
from __future__ import annotations

from typing import SupportsInt, cast

import numpy as np
import pandas as pd

from dpcore.contract.clocksync import trace_shift_us
from dpcore.read.analysis.comm_overlap import MS_NS, comm_start_ns, compute_intervals_ns
from dpcore.read.rundir.load import Run
from dpcore.read.traces.kinds import comm_op

#: ``op``: the collective family of a comm row (:func:`comm_op` of its name), "" on compute rows.
#: ``kind``: what a row is: "compute" or "comm" on a CPU trace's two lanes; on a GPU rank's lanes
#: "cpu" (a launch thread's outermost op) or the GPU event's kind (compute, comm, memcpy, sync, other).
COLUMNS = ["rank", "lane", "name", "op", "kind", "start_ms", "end_ms"]


def _sync_shift_us(marks: pd.DataFrame, sync: object, rank: int) -> float | None:
    """µs to add to a rank's trace ``ts`` to land on the shared clock, from its lanes table's
    "sync" rows (the rank's ``dpcore_clock_sync#k`` markers).

    The profiler's clock is not ours; dpcore's worker brackets ``dpcore_clock_sync#k`` ranges
    with shared-clock reads saved in run.json (``clock_sync_ns``); see dpcore.contract.clocksync.
    """
    if not isinstance(sync, dict) or not isinstance(sync.get(str(rank)), list):
        return None
    return trace_shift_us(marks["name"], marks["start_us"], sync[str(rank)])


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
    cols: dict[str, list[np.ndarray]] = {c: [] for c in ("rank", "lane", "name", "kind", "start_ms", "end_ms")}
    for key, mine in lanes.groupby("rank", sort=True):
        rank = int(cast(SupportsInt, key))
        rows = mine[mine["step"] == step]
        if not (rows["lane"] == "step").any():
            return None
        shift_us = _sync_shift_us(mine[mine["lane"] == "sync"], sync, rank)
        if shift_us is None and isinstance(shifts, dict) and shifts.get(str(rank)) is not None:
            shift_us = float(shifts[str(rank)])
        if shift_us is None:
            return None
        to_ms = lambda us, shift_us=shift_us: ((np.asarray(us) + shift_us) * 1e3 - t0_ns) / MS_NS  # noqa: E731
        lane = rows["lane"].astype(str)
        gpu = lane.str.startswith("stream ")
        kind = rows["kind"] if "kind" in rows else rows["lane"]  # a lanes table without kinds: CPU lanes
        if gpu.any():  # launch threads and streams; gloo's host spans too where no kernel is comm
            host_comm = (lane == "comm") & ~(gpu & (kind == "comm")).any()
            drawn = rows[lane.str.startswith("thread ") | gpu | host_comm]
        else:
            drawn = rows[lane.isin(["compute", "comm"])]
        kind = kind.loc[drawn.index]
        for c, v in (("rank", np.full(len(drawn), rank, np.int64)), ("lane", drawn["lane"].to_numpy(object)),
                     ("name", drawn["name"].to_numpy(object)), ("kind", kind.to_numpy(object)),
                     ("start_ms", to_ms(drawn["start_us"])), ("end_ms", to_ms(drawn["end_us"]))):
            cols[c].append(v)
    # one frame from whole columns: its text columns get the dtype pandas infers for strings
    return pd.DataFrame({c: np.concatenate(v) for c, v in cols.items()}).reindex(columns=COLUMNS)


def _comm_from_csv(run: Run, job_id: str, step: int, t0: float) -> list[dict]:
    """Comm lanes from collectives.csv (launch .. completion on the shared clock)."""
    c = run.collectives[(run.collectives["job_id"] == job_id) & (run.collectives["step"] == step)]
    if c.empty:
        return []
    start = comm_start_ns(c)
    return [{"rank": int(rk), "lane": "comm", "name": f"{op} #{sq}", "kind": "comm", "start_ms": (a - t0) / MS_NS,
             "end_ms": (b - t0) / MS_NS}
            for rk, op, sq, a, b in zip(c["rank"], c["op"], c["seq"], start, c["t_end_ns"])]


def _with_op(df: pd.DataFrame) -> pd.DataFrame:
    """Fill ``op``: the family of each comm row's name (one classification per distinct name)."""
    names = df["name"].astype(str)
    ops = names.map({n: comm_op(n) for n in names.unique()})
    return df.assign(op=ops.where(df["kind"] == "comm", ""))[COLUMNS]


def timeline(run: Run, job_id: str, step: int, lanes: pd.DataFrame | None = None) -> pd.DataFrame:
    """rank, lane, name, op, kind, start_ms, end_ms of one step of one job.

    ``lane`` is 'compute' or 'comm' (``kind`` the same) on a CPU rank; on a rank whose trace has
    GPU events in the step, 'thread <tid>' (``kind`` 'cpu') and 'stream <n>' (``kind`` the GPU
    event's: compute, comm, memcpy, sync, other): see :func:`gpu_lanes`.

    ``op`` is the collective family of a comm row (``all_reduce``, ``all_gather``,
    ``reduce_scatter``, ``broadcast``, ``send_recv`` or ``other``; :func:`comm_op` of its name)
    and "" on compute rows.

    ``lanes``: the job's lanes table (:func:`dpcore.read.analysis.lanes.trace_lanes`, of this step
    at least) when the step is traced, else None: :func:`dpcore.read.tables.job_lanes` reduces it
    from the rank cache.

    From the trace when it holds the step; a rank whose trace shows no comm (gloo runs
    point-to-point transfers of the from-scratch ring/central/naive off any traced thread)
    gets its comm lane from collectives.csv, which is on the same shared clock.
    """
    st = run.steps[(run.steps["job_id"] == job_id) & (run.steps["step"] == step)]
    t0 = float(st["t_start_ns"].min()) if not st.empty else 0.0
    df = _from_trace(run, job_id, step, t0, lanes)
    if df is not None and not df.empty:
        has_comm = set(df.loc[df["kind"] == "comm", "rank"])
        extra = [r for r in _comm_from_csv(run, job_id, step, t0) if r["rank"] not in has_comm]
        if extra:
            df = pd.concat([df, pd.DataFrame(extra, columns=COLUMNS)], ignore_index=True)
        return _with_op(df.sort_values(["rank", "lane", "start_ms"]).reset_index(drop=True))
    rows = []
    for r in st.to_dict("records"):
        # the same phase layout the overlap numbers use (fwd, bwd, then opt after the sync wait)
        starts, ends = compute_intervals_ns(r)
        rows += [{"rank": int(r["rank"]), "lane": "compute", "name": n, "kind": "compute",
                  "start_ms": (a - t0) / MS_NS, "end_ms": (b - t0) / MS_NS}
                 for n, a, b in zip(("forward", "backward", "optimizer"), starts, ends)]
    rows += _comm_from_csv(run, job_id, step, t0)
    return _with_op(pd.DataFrame(rows, columns=COLUMNS).sort_values(["rank", "lane", "start_ms"])
                    .reset_index(drop=True))
