"""When each rank arrived at each collective of a torch.profiler trace, and which comm events are
not collectives at all (pure pandas/numpy: the events frame of ``read_trace_dir`` in, rows out).

Why this is not simply the comm event's start. On CPU, gloo runs every collective on a worker
thread of the process group (``gloo:<op>`` spans on ``pt_gloo_runloop`` threads), and the span
starts when a worker *picks the work up*, not when the rank reached the collective. In a DDP job
a rank that is early enqueues bucket k while its workers are still inside bucket k-1 waiting for
the late peer; they pick k up only after the peer has arrived, so the early rank's span of k
starts as late as the peer's, and "who arrived last" comes out a coin toss (measured:
"no consistent straggler (most often last: rank 1, 72 %)" on a job whose rank 1 slept 30 ms
in every forward). The rank arrived when its calling thread *enqueued* the work: the outermost
``c10d::<op>`` / ``record_param_comms`` range (dpcore's own runs record the same moment as
collectives.csv ``t_launch_ns``, read just before the ``dist`` call).

How an enqueue is linked to its span. Nothing in the trace joins them (no flow event, no shared
id), but a process group hands its work to its workers through one FIFO queue, so on each rank
the k-th enqueue is the k-th span to start on the worker threads, barriers included (a barrier
is queued work too, and pairing a barrier with a barrier is the check that the lists line up). gloo runs
``send``/``recv`` on the calling thread, so those are neither
enqueues nor worker spans. At the trace window's edges the two lists can differ: spans of work
enqueued before the window come first, and work enqueued at its very end may have no span yet.
The alignment taken is the first one in which every span starts after its enqueue, trying
first the one that leaves exactly the surplus spans at the start; with no such alignment (a
trace of several process groups, whose queues interleave) the rank keeps the workers' starts
and :func:`trace_comm_rows` says so (``enqueued`` False), so the caller can warn.

GPU (NCCL) traces keep the kernel's start on its stream: the kernel waits inside for its peers,
so its start is when the rank's GPU reached the collective.

Point-to-point. Send/recv (``gloo:send``, ``ncclDevKernel_SendRecv``, ...) pair one rank with
one other; matching the n-th of them across all ranks as if they were one collective invents
waits between ranks that never talked. They are flagged ``p2p`` here and
left out of the stragglers' matching. NCCL also runs ``all_to_all`` as SendRecv kernels; with
kernel names only, those are left out too.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from dpcore.read.traces.kinds import comm_op
from dpcore.read.traces.rank_table import BASE, RankTable
from dpcore.read.traces.reader import on_host

TRACE_COMM_COLUMNS = ["job_id", "rank", "step", "op", "t_launch_ns", "t_start_ns", "t_end_ns", "p2p", "enqueued"]
#: Ranges that the calling thread opens around a collective call (the enqueue).
ENQUEUE_RE = re.compile(r"^(c10d::|record_param_comms$)")
#: Enqueues that gloo runs on the calling thread: no worker span follows them.
_P2P_ENQUEUE_RE = re.compile(r"^c10d::(send|recv)")
_TOL_US = 1.0  # an enqueue and its span are stamped by one clock; 1 µs absorbs the rounding of ts


def _name_mask(names: pd.Series, test: Callable[[str], object]) -> np.ndarray:
    """``test(name)`` of every name, evaluated once per category when the column is categorical."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        lut = np.asarray([bool(test(str(c))) for c in names.cat.categories] + [False], dtype=bool)
        return lut[names.cat.codes.to_numpy()]  # code -1 (missing) -> the trailing False
    return np.asarray([bool(test(str(n))) for n in names], dtype=bool)


def is_p2p(name: str) -> bool:
    """A point-to-point comm event by its name (``send``/``recv`` in it, as :func:`comm_op` reads it)."""
    return comm_op(name) == "send_recv"


def fifo_offset(enqueue_us: np.ndarray, span_us: np.ndarray, enqueue_barrier: np.ndarray | None = None,
                span_barrier: np.ndarray | None = None) -> int | None:
    """How many leading spans have no enqueue in the trace, so that span k + i is enqueue i's.

    Both sorted. Tried first: the surplus of spans (spans of work enqueued before the window);
    then 0, 1, ... The first offset where every paired span starts no earlier than its enqueue
    (and, given the ``*_barrier`` flags, pairs a barrier with a barrier only) wins; None when no
    offset pairs anything consistently.
    """
    n_e, n_s = len(enqueue_us), len(span_us)
    if not n_e or not n_s:
        return None
    for k in dict.fromkeys([max(0, n_s - n_e), *range(n_s)]):
        n = min(n_e, n_s - k)
        if n <= 0 or not bool(np.all(span_us[k:k + n] >= enqueue_us[:n] - _TOL_US)):
            continue
        if enqueue_barrier is not None and span_barrier is not None and \
                not np.array_equal(enqueue_barrier[:n], span_barrier[k:k + n]):
            continue
        return k
    return None


def _outer_enqueues(enq: pd.DataFrame) -> pd.DataFrame:
    """The outermost enqueue range of each nest (``c10d::allreduce_`` around ``record_param_comms``),
    per thread, minus the nests that hold a send/recv; sorted by start."""
    e = enq.sort_values(["_thread", "ts", "dur"], ascending=[True, True, False], kind="stable")
    end = e["ts"] + e["dur"]
    prev_end = end.groupby(e["_thread"]).transform(lambda s: s.cummax().shift())
    outer = prev_end.isna() | (e["ts"] >= prev_end)
    nest = outer.astype(np.int64).groupby(e["_thread"]).cumsum()
    p2p = e["_p2p"].groupby([e["_thread"], nest]).transform("any")
    barrier = e["_barrier"].groupby([e["_thread"], nest]).transform("any")
    return e.assign(_barrier=barrier)[outer & ~p2p].sort_values("ts", kind="stable")


def _gloo_links(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position in ``events`` of each gloo worker span that could be linked, its enqueue's
    ``ts`` in µs, the enqueue's step)."""
    names = events["name"]
    gloo = _name_mask(names, lambda n: n.startswith("gloo:"))
    if "stream" in events and "category" in events:  # gloo's ranges copied onto the device timeline
        gloo &= on_host(events)                         # (CUDA tensors) are no work of its queue
    enq = _name_mask(names, ENQUEUE_RE.match)
    at = np.flatnonzero(gloo | enq)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.int64))
    if not at.size:
        return empty
    cand = pd.DataFrame({"rank": events["rank"].to_numpy()[at], "ts": events["ts"].to_numpy(np.float64)[at],
                         "dur": events["dur"].to_numpy(np.float64)[at], "step": events["step"].to_numpy(np.int64)[at],
                         "_pos": at, "_gloo": gloo[at], "_enq": enq[at],
                         "_p2p": _name_mask(names.iloc[at], _P2P_ENQUEUE_RE.match),
                         "_barrier": _name_mask(names.iloc[at], lambda n: "barrier" in n),
                         "_thread": (events["pid"].iloc[at].astype(str) + "/"
                                     + events["tid"].iloc[at].astype(str)).to_numpy()})
    pos, ts, step = [], [], []
    for _, g in cand.groupby("rank", sort=False):
        callers = set(g.loc[g["_enq"], "_thread"])
        spans = g[g["_gloo"] & ~g["_thread"].isin(callers)].sort_values("ts", kind="stable")
        outer = _outer_enqueues(g[g["_enq"]]) if callers else g.iloc[0:0]
        k = fifo_offset(outer["ts"].to_numpy(np.float64), spans["ts"].to_numpy(np.float64),
                        outer["_barrier"].to_numpy(bool), spans["_barrier"].to_numpy(bool))
        if k is None:
            continue
        n = min(len(outer), len(spans) - k)
        pos.append(spans["_pos"].to_numpy(np.int64)[k:k + n])
        ts.append(outer["ts"].to_numpy(np.float64)[:n])
        step.append(outer["step"].to_numpy(np.int64)[:n])
    return (np.concatenate(pos), np.concatenate(ts), np.concatenate(step)) if pos else empty


def trace_comm_rows(events: pd.DataFrame, job_id: str = "") -> pd.DataFrame:
    """One collectives.csv-like row per comm event (kind ``comm``) of a traces' events frame.

    ``t_launch_ns`` is the arrival (module docstring: the enqueue on gloo where it could be
    linked, else the event's start), ``t_start_ns`` the event's start (when the backend began),
    ``t_end_ns`` its end, all µs·1000 on the traces' clock; ``step`` is the ProfilerStep of the
    arrival; ``op`` the event's name; ``p2p`` marks send/recv; ``enqueued`` whether the arrival is
    a linked enqueue. Sorted by (rank, step, t_launch_ns). Columns: TRACE_COMM_COLUMNS.
    """
    if events is None or events.empty:
        return pd.DataFrame(columns=TRACE_COMM_COLUMNS)
    at = np.flatnonzero((events["kind"] == "comm").to_numpy())
    if not at.size:
        return pd.DataFrame(columns=TRACE_COMM_COLUMNS)
    comm = events.iloc[at]
    ts = comm["ts"].to_numpy(np.float64)
    arrival, step = ts.copy(), comm["step"].to_numpy(np.int64).copy()
    enqueued = np.zeros(len(comm), dtype=bool)
    if _name_mask(comm["name"], lambda n: n.startswith("gloo:")).any():
        span_at, enq_ts, enq_step = _gloo_links(events)
        i = np.searchsorted(at, span_at)  # every linked span is a comm event: at[i] == span_at
        ok = (i < at.size) & (at[np.minimum(i, at.size - 1)] == span_at)
        arrival[i[ok]], step[i[ok]], enqueued[i[ok]] = enq_ts[ok], enq_step[ok], True
    rows = pd.DataFrame({
        "job_id": job_id, "rank": comm["rank"].to_numpy(np.int64), "step": step,
        "op": comm["name"].astype(str).to_numpy(), "t_launch_ns": arrival * 1e3, "t_start_ns": ts * 1e3,
        "t_end_ns": (ts + comm["dur"].to_numpy(np.float64)) * 1e3, "p2p": _name_mask(comm["name"], is_p2p),
        "enqueued": enqueued})
    return rows.sort_values(["rank", "step", "t_launch_ns"], kind="stable").reset_index(drop=True)


def comm_table(events: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """:data:`COMM_TABLE`'s reduction: :func:`trace_comm_rows` of one rank, without job_id (the
    reader of many jobs sets it)."""
    return trace_comm_rows(events).drop(columns="job_id")


#: The per-rank table of comm rows (what stragglers matches across ranks): trace_comm_rows'
#: columns without job_id.
COMM_TABLE = RankTable("comm", {"rank": np.int64, "step": np.int64, "op": object, "t_launch_ns": np.float64,
                                "t_start_ns": np.float64, "t_end_ns": np.float64, "p2p": bool, "enqueued": bool},
                       comm_table, columns=BASE)
