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

Why GPU ranks get other lanes: on a GPU the question is what each CUDA stream runs and whether
the CPU thread that launches the kernels keeps up; a "compute" lane that merges every stream
hides both. A rank with GPU events in a step is drawn as its launch thread(s) (the outermost CPU
op at each moment: ``kind`` "cpu") and one lane per stream whose rows carry their own ``kind``
(compute kernel, ``comm`` for NCCL kernels, ``memcpy`` for copies and sets, ``sync``), so the
gaps between kernels and what the CPU was doing over them sit one above the other. A CPU trace
keeps its two lanes, compute and comm.

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
from dpcore.read.traces.kinds import STEP_RE, comm_op
from dpcore.read.traces.rank_table import RankTable
from dpcore.read.traces.reader import on_host

#: ``op``: the collective family of a comm row (:func:`comm_op` of its name), "" on compute rows.
#: ``kind``: what a row is: "compute" or "comm" on a CPU trace's two lanes; on a GPU rank's lanes
#: "cpu" (a launch thread's outermost op) or the GPU event's kind (compute, comm, memcpy, sync, other).
COLUMNS = ["rank", "lane", "name", "op", "kind", "start_ms", "end_ms"]
#: Host categories a launch thread's lane is drawn from (the step markers left out: they span it all).
LAUNCH_THREAD_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
#: Device categories: the events a stream lane draws.
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: A lanes table (:func:`trace_lanes`): per rank one ``lane`` "rank" row (step -1, its first
#: event start .. last event end: the rank has events), per rank and traced step (``step`` >= 0)
#: one "step" row (the step's first event start .. last event end: the step has events), its merged
#: compute ("compute", named "compute") and its comm events ("comm", the event's name, its span as
#: the overlap numbers take it: :func:`dpcore.read.analysis.comm_overlap.trace_sets`); per rank
#: its clock-sync markers ("sync", step -1, named ``dpcore_clock_sync#k``). ``start_us`` and
#: ``end_us`` are the trace's own ``ts`` and ``ts + dur`` (µs on the profiler's clock), unrounded.
#: A rank with GPU events in a step also gets, for that step, lanes "thread <tid>" (each thread
#: that launches GPU work: its outermost ops, ``kind`` "cpu") and "stream <n>" (each GPU event,
#: ``kind`` its event kind); ``kind`` is the lane itself on compute/comm rows and "" elsewhere.
LANE_COLUMNS = ["rank", "step", "lane", "name", "kind", "start_us", "end_us"]


def trace_lanes(events: pd.DataFrame, steps: Iterable[int] | None = None) -> pd.DataFrame:
    """The lanes table (:data:`LANE_COLUMNS`) of an events frame: what :func:`timeline` draws of
    each rank in each traced step (only ``steps`` when given), before it is placed on the shared
    clock. Rank by rank (each rank's rows depend only on its own events), so the tables of ranks
    reduced one at a time concatenate to the table of all of them at once. Built as whole
    columns, one frame at the end (a frame per step and lane cost half the reduction)."""
    cols: dict[str, list[np.ndarray]] = {c: [] for c in LANE_COLUMNS}
    want = None if steps is None else {int(s) for s in steps}

    def add(rank: int, step: int, lane: str, names: str | Iterable[object], start: np.ndarray, end: np.ndarray,
            kind: str | Iterable[object] = "") -> None:
        n = len(start)
        labels, kinds = np.empty(n, dtype=object), np.empty(n, dtype=object)
        labels[:] = names if isinstance(names, str) else [str(x) for x in names]
        kinds[:] = kind if isinstance(kind, str) else [str(x) for x in kind]
        for c, v in (("rank", np.full(n, rank, np.int64)), ("step", np.full(n, step, np.int64)),
                     ("lane", np.full(n, lane, dtype=object)), ("name", labels), ("kind", kinds),
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
            # the comm spans as the overlap numbers measure them (a DDP all-reduce ends with the
            # backward that waited for it), so a bar and the step's C and overlap agree
            (c_s, c_e), (p_s, p_e) = trace_sets(ev)
            p_s, p_e = merge(p_s, p_e)
            add(rank, int(step), "compute", "compute", p_s, p_e, "compute")
            comm = (ev["kind"] == "comm").to_numpy()
            add(rank, int(step), "comm", ev["name"][comm], c_s, c_e, "comm")
            for lane, names, start, stop, kind in gpu_lanes(ev):
                add(rank, int(step), lane, names, start, stop, kind)
    empty = {"rank": np.int64, "step": np.int64, "lane": object, "name": object, "kind": object,
             "start_us": np.float64, "end_us": np.float64}
    return pd.DataFrame({c: np.concatenate(v) if v else np.empty(0, empty[c]) for c, v in cols.items()})


def lanes_table(events: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """:data:`LANES_TABLE`'s reduction: :func:`trace_lanes` of one rank."""
    return trace_lanes(events)


#: The per-rank lanes table (LANE_COLUMNS): what the Timeline draws of the rank.
LANES_TABLE = RankTable("lanes", {"rank": np.int64, "step": np.int64, "lane": object, "name": object, "kind": object,
                                  "start_us": np.float64, "end_us": np.float64}, lanes_table)


def gpu_lanes(ev: pd.DataFrame) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, str | np.ndarray]]:
    """A GPU rank's lanes of one step's events: ``(lane, names, start_us, end_us, kind)`` per
    launch thread ("thread <tid>", its outermost ops, kind "cpu") and per stream ("stream <n>",
    every GPU event, kind its event kind). Empty when the events hold no GPU event (a CPU trace).

    A launch thread is a host thread with a CUDA runtime or driver call; its lane keeps an op only
    where no earlier op of the thread still runs (the outermost op: ``Optimizer.step``, a
    DataLoader's ``__next__``, ``forward``), so a few bars say what the CPU did over each GPU gap."""
    cat = ev["category"].astype(str).to_numpy()
    stream = ev["stream"].to_numpy()
    device = (stream >= 0) & np.isin(cat, GPU_CATS)
    if not device.any():
        return []
    ts, end = ev["ts"].to_numpy(np.float64), (ev["ts"] + ev["dur"]).to_numpy(np.float64)
    names = ev["name"].astype(str).to_numpy()
    host = on_host(ev)
    tid = ev["tid"].astype(str).to_numpy()
    out: list[tuple[str, np.ndarray, np.ndarray, np.ndarray, str | np.ndarray]] = []
    launchers = sorted(set(tid[host & np.isin(cat, ("cuda_runtime", "cuda_driver"))]))
    marker = np.fromiter((bool(STEP_RE.match(n)) for n in names), bool, len(names))
    for t in launchers:
        idx = np.flatnonzero(host & (tid == t) & np.isin(cat, LAUNCH_THREAD_CATS) & ~marker)
        idx = idx[np.lexsort((-end[idx], ts[idx]))]  # by start; the longer op first on a tie
        if not len(idx):
            continue
        reach = np.maximum.accumulate(end[idx])
        outer = np.ones(len(idx), bool)
        outer[1:] = ts[idx][1:] >= reach[:-1]
        keep = idx[outer]
        out.append((f"thread {t}", names[keep], ts[keep], end[keep], "cpu"))
    kinds = ev["kind"].astype(str).to_numpy()
    for s in sorted(set(stream[device].tolist())):
        keep = np.flatnonzero(device & (stream == s))
        out.append((f"stream {s}", names[keep], ts[keep], end[keep], kinds[keep]))
    return out


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
    cols: dict[str, list[np.ndarray]] = {c: [] for c in ("rank", "lane", "name", "kind", "start_ms", "end_ms")}
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
        lane = rows["lane"].astype(str)
        gpu = lane.str.startswith("stream ")
        kind = rows["kind"] if "kind" in rows else rows["lane"]  # a lanes table without kinds: CPU lanes
        if gpu.any():  # launch threads and streams; gloo's host spans too where no kernel is comm
            host_comm = (lane == "comm") & ~(gpu & (kind == "comm")).any()
            drawn = rows[lane.str.startswith("thread ") | gpu | host_comm]
        else:
            drawn = rows[lane.isin(["compute", "comm"])]
        kind = kind.loc[drawn.index]
        for c, v in (("rank", np.full(len(drawn), int(rank), np.int64)), ("lane", drawn["lane"].to_numpy(object)),
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


def timeline(run: Run, job_id: str, step: int, events: pd.DataFrame | None = None,
             lanes: pd.DataFrame | None = None) -> pd.DataFrame:
    """rank, lane, name, op, kind, start_ms, end_ms of one step of one job.

    ``lane`` is 'compute' or 'comm' (``kind`` the same) on a CPU rank; on a rank whose trace has
    GPU events in the step, 'thread <tid>' (``kind`` 'cpu') and 'stream <n>' (``kind`` the GPU
    event's: compute, comm, memcpy, sync, other): see :func:`gpu_lanes`.

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
