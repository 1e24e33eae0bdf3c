"""One rank's lanes: what the Timeline draws of each rank in each traced step, on the trace's own
clock (:func:`trace_lanes`), from the per-rank table :data:`LANE_EVENTS_TABLE` (the few columns of
the events the lanes read). Placing the lanes on the shared clock and drawing them is
:mod:`dpcore.read.analysis.timeline`'s.

Why the cached table is the lanes' events and not the lanes: a rank's trace is parsed once and
kept as compact tables (:mod:`dpcore.read.ranks`), so a view draws a step of 8 of 1,024 ranks
without parsing a trace. But the Timeline shows one step at a time, and reducing every traced
step to lanes at the first read cost ~0.15 s a step on a GPU rank (75 min for a 30,000-step
trace) for steps nobody looks at. So the cache keeps what the lanes are made from (the events of
the traced steps, the clock-sync markers and the rank's first and last event, ten columns) and
the lanes are reduced for the steps asked (:func:`trace_lanes` with ``steps``): a first read
costs one parse plus the steps drawn, and another step reads the table again, never the JSON.
Only placing the lanes on the shared clock needs the run (run.json's clock-sync samples), so
that step stays here, after the table.

Why GPU ranks get other lanes: on a GPU the question is what each CUDA stream runs and whether
the CPU thread that launches the kernels keeps up; a "compute" lane that merges every stream
hides both. A rank with GPU events in a step is drawn as its launch thread(s) (the outermost CPU
op at each moment: ``kind`` "cpu") and one lane per stream whose rows carry their own ``kind``
(compute kernel, ``comm`` for NCCL kernels, ``memcpy`` for copies and sets, ``sync``), so the
gaps between kernels and what the CPU was doing over them sit one above the other. A CPU trace
keeps its two lanes, compute and comm.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from dpcore.contract.clocksync import SYNC_MARKER
from dpcore.contract.intervals import merge
from dpcore.read.analysis.comm_overlap import by_name, trace_sets
from dpcore.read.analysis.gpu_time import GPU_CATS
from dpcore.read.traces.kinds import STEP_RE
from dpcore.read.traces.rank_table import RankTable
from dpcore.read.traces.reader import on_host

#: Host categories a launch thread's lane is drawn from (the step markers left out: they span it all).
LAUNCH_THREAD_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
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
        # the steps asked picked first: iterating 30,000 steps' groups to skip them costs seconds
        traced = all_ev[all_ev["step"] >= 0] if want is None else all_ev[all_ev["step"].isin(list(want))]
        for step, ev in traced.groupby("step", sort=True):
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
    return pd.DataFrame({c: np.concatenate(v) if v else np.empty(0, LANE_DTYPES[c]) for c, v in cols.items()})


#: The lanes table's columns and dtypes (:data:`LANE_COLUMNS`).
LANE_DTYPES = {"rank": np.int64, "step": np.int64, "lane": object, "name": object, "kind": object,
               "start_us": np.float64, "end_us": np.float64}
#: The events frame's columns :func:`trace_lanes` reads, and their dtypes in :data:`LANE_EVENTS_TABLE`.
LANE_EVENT_DTYPES = {"rank": np.int64, "step": np.int64, "ts": np.float64, "dur": np.float64, "name": object,
                     "category": object, "pid": object, "tid": object, "stream": np.int64, "kind": object}


def lane_events(events: pd.DataFrame, meta: dict | None = None) -> pd.DataFrame:
    """:data:`LANE_EVENTS_TABLE`'s reduction: the events of one rank that :func:`trace_lanes`
    reads, in their order: every event of a traced step (``step`` >= 0), the clock-sync markers,
    and the rank's first-starting and last-ending event (its "rank" row), so that
    ``trace_lanes(lane_events(ev), steps)`` is ``trace_lanes(ev, steps)`` row for row."""
    cols = list(LANE_EVENT_DTYPES)
    if events.empty:
        return events.reindex(columns=cols)
    keep = (events["step"] >= 0).to_numpy() | by_name(events["name"], lambda n: n.startswith(SYNC_MARKER))
    ts = events["ts"].to_numpy(np.float64)
    end = (events["ts"] + events["dur"]).to_numpy(np.float64)
    keep[int(np.argmin(ts))] = keep[int(np.argmax(end))] = True
    return events.loc[keep, cols]


#: The per-rank table the Timeline's lanes are reduced from (:func:`lane_events`): what the cache
#: keeps of a rank for the Timeline, the lanes of the steps shown reduced from it on demand.
LANE_EVENTS_TABLE = RankTable("lane_events", LANE_EVENT_DTYPES, lane_events,
                              columns=frozenset(LANE_EVENT_DTYPES))


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
