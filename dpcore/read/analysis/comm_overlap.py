"""Communication/computation overlap, per rank and step (the Holistic Trace Analysis definition).

overlap % = |comm ∩ compute| / |comm|, with comm and compute taken as *unions* of intervals
(HTA ``get_comm_comp_overlap``); exposed comm E = |comm \\ compute| is what communication adds to
the step, and comm fraction = E / T (docs/DESIGN.md).

Why every quantity is measured inside one step window: a fraction of the step cannot exceed the
step. Both methods clip comm and compute to the step's window, so per step
compute + exposed comm + other = T with other >= 0, exactly.

One definition each, whichever method measures it:

* compute = forward, backward and optimizer work of the rank's main thread, *minus the time it
  spent inside communication calls* (launching a collective, a blocking collective, waiting for
  one): a thread blocked on a collective is not computing. On GPU: compute kernels.
* comm = the union of the rank's collective intervals (gloo spans / NCCL kernels in a trace,
  launch .. completion in collectives.csv). At world size 1 a collective has no peer and moves
  nothing: it is not communication (C = E = 0, overlap undefined); its calls still are not compute.

The two methods: :func:`step_breakdown` (the recorded intervals: steps.csv phases minus
comm_calls.csv, collectives.csv) and :func:`overlap_from_trace` (torch.profiler: dpcore's phase
ranges minus the recorder's ``comm_call#`` ranges, or the main-thread operators minus waits in
a trace without them; gloo spans / kernels). The recorder writes both records of a call, so the
methods differ only in their instruments: perf_counter stamps around the calls against the
profiler's spans, which is what the gap between them measures.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, SupportsInt, cast

import numpy as np
import pandas as pd

from dpcore.contract.config import IMPORTED
from dpcore.contract.intervals import clip, comm_start, overlap_stats, step_comm, subtract
from dpcore.contract.runformat import parse_bools
from dpcore.read.traces.kinds import STEP_RE
from dpcore.read.traces.rank_table import BASE, RankTable

MS_NS = 1e6
BREAKDOWN_COLUMNS = ["job_id", "variant", "world_size", "bucket_mb", "rank", "step", "step_ms", "fwd_ms", "bwd_ms",
                     "sync_ms", "opt_ms", "compute_ms",
                     "comm_ms", "overlapped_ms", "exposed_ms", "other_ms", "overlap_pct", "comm_fraction",
                     "comm_ops", "comm_bytes", "samples"]
TRACE_COLUMNS = ["rank", "step", "step_ms", "compute_ms", "comm_ms", "overlapped_ms", "exposed_ms", "overlap_pct"]
#: Communication calls in a trace of dpcore's: the recorder's ``comm_call#<op>`` (launching a
#: collective, or a blocking one) and ``comm_call#wait`` ranges, comm_calls.csv's rows as the
#: profiler saw them. Never compute, even inside an operator (a gradient hook's launch inside a
#: backward node, a blocking all-gather inside FSDP2's backward hook).
_COMM_CALL_RE = re.compile(r"^comm_call#")
#: DDP's reducer operators: where they are, DDP finishes its gradient synchronisation inside
#: backward() after the last gradient was accumulated (waits for its buckets, copies them back).
_REDUCER_RE = re.compile(r"reducer::")
_ACCUMULATE = "torch::autograd::AccumulateGrad"
#: dpcore's own phase ranges (``record_function`` user annotations): where they are, they mark the
#: step window exactly as steps.csv does (from the start of forward to the end of optimizer).
_PHASE_RANGES = ("forward", "backward", "grad_sync", "optimizer")


def peers_of(row: pd.Series | dict) -> object:
    """The world size that says whether a row's collectives communicate (``step_comm``): the
    job's own, except for an imported job, whose world size counts only the ranks imported."""
    return None if row.get("variant") == IMPORTED else row.get("world_size")


def comm_start_ns(collectives: pd.DataFrame) -> np.ndarray:
    """When each collective began: t_start_ns when the backend reported it, else t_launch_ns."""
    launch = pd.to_numeric(collectives["t_launch_ns"], errors="coerce").to_numpy(np.float64)
    if "t_start_ns" not in collectives:
        return launch
    return comm_start(launch, pd.to_numeric(collectives["t_start_ns"], errors="coerce").to_numpy(np.float64))


def compute_intervals_ns(row: pd.Series | dict) -> tuple[np.ndarray, np.ndarray]:
    """Main-thread phases of one steps.csv row on the shared clock: fwd, bwd, then opt after sync."""
    t0 = float(row["t_start_ns"])
    fwd, bwd, sync, opt = (float(row[k]) * MS_NS for k in ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms"))
    starts = np.array([t0, t0 + fwd, t0 + fwd + bwd + sync])
    return starts, starts + np.array([fwd, bwd, opt])


def _groups(df: pd.DataFrame | None) -> dict[tuple, np.ndarray]:
    """{(job_id, rank, step): row positions, ascending} of a collectives / comm_calls frame (one
    groupby: a 1,024-rank run's collectives.csv has millions of rows)."""
    if df is None or df.empty:
        return {}
    keys = pd.DataFrame({"j": df["job_id"].to_numpy(object), "r": pd.to_numeric(df["rank"]).astype(int).to_numpy(),
                         "s": pd.to_numeric(df["step"]).astype(int).to_numpy()})
    return {(j, int(r), int(s)): idx
            for (j, r, s), idx in keys.groupby(["j", "r", "s"], sort=False, dropna=False).indices.items()}


_NONE = np.empty(0, np.int64)


def step_breakdown(steps: pd.DataFrame, collectives: pd.DataFrame,
                   profiled: bool | None = False, calls: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per timed (profiled == False) step and rank; see ANALYSIS_API.md for the columns.

    ``profiled=True`` selects the profiled steps instead: the ones with a trace, so the same
    steps can be measured both ways (this interval method vs :func:`overlap_from_trace`);
    ``profiled=None`` every step, in steps.csv's order (one pass over collectives.csv, which
    at 1,024 ranks has millions of rows).

    The window is [t_start, t_start + step_ms]. Comm intervals are the rank's collectives of that
    step clipped to it (none at world size 1: no peer). Compute is fwd + bwd + opt (the main
    thread's phases) minus ``calls`` (comm_calls.csv: the thread inside a launch, a blocking
    collective or a wait); None or empty for a run recorded before comm_calls existed: then
    compute is the whole phases. The intersection is exact on the shared clock, and
    other = T - compute - exposed >= 0.
    """
    if steps is None or steps.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    if profiled is None:
        st = steps
    elif "profiled" in steps:
        is_prof = np.asarray(parse_bools(steps["profiled"].tolist()), dtype=bool)
        st = steps[is_prof if profiled else ~is_prof]
    else:
        st = steps if not profiled else steps.iloc[0:0]
    have_coll = collectives is not None and not collectives.empty
    groups = _groups(collectives)
    if have_coll:
        c_start, c_end = comm_start_ns(collectives), collectives["t_end_ns"].to_numpy(np.float64)
        c_bytes = pd.to_numeric(collectives["bytes"], errors="coerce").to_numpy(np.float64)  # NaN: unknown
    call_groups = _groups(calls)
    if call_groups and calls is not None:
        k_start = pd.to_numeric(calls["t_begin_ns"], errors="coerce").to_numpy(np.float64)
        k_end = pd.to_numeric(calls["t_end_ns"], errors="coerce").to_numpy(np.float64)
    rows = []
    for rec in st.to_dict("records"):
        t0, step_ms = float(rec["t_start_ns"]), float(rec["step_ms"])
        key = (rec["job_id"], int(rec["rank"]), int(rec["step"]))
        idx = groups.get(key, _NONE)
        comm = (step_comm(c_start[idx], c_end[idx], t0, step_ms, peers_of(rec)) if len(idx)
                else (np.empty(0), np.empty(0)))
        compute = compute_intervals_ns(rec)
        known = not (np.isnan(compute[0]).any() or np.isnan(compute[1]).any())
        held = call_groups.get(key, _NONE)
        if len(held) and known:
            compute = subtract(compute[0], compute[1], k_start[held], k_end[held])
        if known:
            compute = clip(compute[0], compute[1], t0, t0 + step_ms * MS_NS)
        s = overlap_stats(comm, compute)
        if not known:
            # a phase is unknown (an imported trace names no such range): where compute lay in
            # the step is unknown too, so compute, overlap and exposed comm are missing, not guessed
            s = {**s, "compute": np.nan, "overlapped": np.nan, "exposed": np.nan, "overlap_pct": np.nan}
        compute_ms = s["compute"] / MS_NS
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


class _Events:
    """The arrays of one rank's events that the trace method reads, each name test done once.

    Why: a rank's steps are measured one by one; testing every event's name (a regex over the
    distinct names) and building sub-frames per step cost more than the interval arithmetic
    itself (~40 % of a 20k-event rank's read). So a rank's frame is turned into arrays
    once (:meth:`of`) and a step is a :meth:`take` of them.
    """

    __slots__ = ("ts", "end", "comm", "comp", "sync", "stream", "threads", "launch", "phase", "grad_sync",
                 "backward", "reducer", "accumulate", "marker")
    ts: np.ndarray
    end: np.ndarray
    comm: np.ndarray
    comp: np.ndarray
    sync: np.ndarray
    stream: np.ndarray
    threads: np.ndarray
    launch: np.ndarray
    phase: np.ndarray
    grad_sync: np.ndarray
    backward: np.ndarray
    reducer: np.ndarray
    accumulate: np.ndarray
    marker: np.ndarray

    @classmethod
    def of(cls, ev: pd.DataFrame) -> _Events:
        self = cls()
        kind = ev["kind"]  # compared as a Series: on a categorical, by its codes (no 250k strings)
        names = ev["name"]
        self.ts = ev["ts"].to_numpy(np.float64)
        self.end = (ev["ts"] + ev["dur"]).to_numpy(np.float64)
        self.comm, self.comp, self.sync = ((kind == k).to_numpy(bool) for k in ("comm", "compute", "sync"))
        self.stream = ev["stream"].to_numpy() if "stream" in ev else np.full(self.ts.size, -1)
        self.threads = _threads(ev)
        self.launch = ~self.comm & by_name(names, lambda n: bool(_COMM_CALL_RE.match(n)))
        self.phase = _phase_mask(ev)
        self.grad_sync = by_name(names, lambda n: n == "grad_sync")
        self.backward = by_name(names, lambda n: n == "backward")
        self.reducer = by_name(names, lambda n: bool(_REDUCER_RE.search(n)))
        self.accumulate = by_name(names, lambda n: n == _ACCUMULATE)
        self.marker = by_name(names, lambda n: bool(STEP_RE.match(n)))
        return self

    def take(self, idx: np.ndarray) -> _Events:
        """The events at positions ``idx`` (one step's)."""
        out = _Events()
        for k in self.__slots__:
            setattr(out, k, getattr(self, k)[idx])
        return out


def trace_sets(ev: pd.DataFrame | _Events) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(comm, compute) interval unions in µs of one rank's events.

    Compute on a CPU trace of dpcore's (one with its ``forward``/``backward``/``optimizer``
    ranges on the thread that computes) is those ranges, as steps.csv's phases are: the main
    thread's wall time in them, Python included (a hook's bookkeeping is work the step does; an
    operator-only union would call it idle), minus the recorder's communication calls
    (:data:`_COMM_CALL_RE`). Elsewhere (GPU kernels, foreign CPU traces, and dpcore traces
    recorded before the calls were marked, whose waits show only as gaps between operators) it
    is the union of the compute events. Either way waits on the threads that compute (kind
    ``sync``) are cut out.

    DDP (its reducer's operators inside dpcore's ``backward`` range): backward's compute ends
    with the last gradient accumulation, the rest is DDP's gradient synchronisation (its comm
    hook, its wait, copying buckets back), as steps.csv counts it (``sync_ms``); and every
    all-reduce launched in backward is over when backward ends (the reducer waited for it), so
    its span is cut there: gloo's thread may close it later, still running the completion
    callbacks or descheduled, while the main thread already computes.
    """
    e = ev if isinstance(ev, _Events) else _Events.of(ev)
    ts, end = e.ts, e.end
    comm, comp = e.comm, e.comp
    compute = (ts[comp], end[comp])
    if comp.any():
        launch, threads = e.launch, e.threads
        on_comp = np.isin(threads, np.unique(threads[comp]))
        phase = e.phase
        # dpcore's CPU trace, whose communication calls are marked (or that has none to mark;
        # an older trace without the marks keeps the operators: its waits are their gaps)
        calls_known = bool(launch.any()) or not comm.any()
        work = phase & on_comp & ~e.grad_sync
        if work.any() and calls_known and not (comp & (e.stream >= 0)).any():
            compute = (ts[work], end[work])
        hole = (e.sync | launch) & on_comp
        cut_s, cut_e = [ts[hole]], [end[hole]]
        for a, b, last_grad in _ddp_backward(e, phase & on_comp, on_comp):
            cut_s.append(np.array([last_grad]))
            cut_e.append(np.array([b]))
            # DDP waited for every bucket before backward() returned: an all-reduce launched
            # in backward is over by then, whatever its span says (the backend's thread may
            # close it later, busy with the completion callbacks or descheduled)
            late = comm & (ts >= a) & (ts < b) & (end > b)
            end = np.where(late, b, end)
        holes_s, holes_e = np.concatenate(cut_s), np.concatenate(cut_e)
        if holes_s.size:
            compute = subtract(compute[0], compute[1], holes_s, holes_e)
    return (ts[comm], end[comm]), compute


def by_name(col: pd.Series, test: Callable[[str], object]) -> np.ndarray:
    """``bool(test(name))`` of every event, evaluated once per distinct name (the reader's names are
    categorical: a 250k-event trace has a few thousand of them)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats, codes = col.cat.categories, col.cat.codes.to_numpy()
    else:
        codes, cats = pd.factorize(col.astype(str))
    hit = np.fromiter((bool(test(str(c))) for c in cats), dtype=bool, count=len(cats))
    return np.append(hit, False)[codes]  # code -1 (no name): False


def _threads(ev: pd.DataFrame) -> np.ndarray:
    """One integer per (pid, tid) of every event."""
    p, t = pd.factorize(ev["pid"])[0].astype(np.int64), pd.factorize(ev["tid"])[0].astype(np.int64)
    return p * (int(t.max(initial=0)) + 2) + t


def _phase_mask(ev: pd.DataFrame) -> np.ndarray:
    """dpcore's phase ranges: user annotations named forward/backward/grad_sync/optimizer (a
    foreign ``forward`` operator, such as a TorchScript module's, is no phase of ours)."""
    if "category" not in ev:
        return np.zeros(len(ev), dtype=bool)
    return (by_name(ev["name"], lambda n: n in _PHASE_RANGES)
            & by_name(ev["category"], lambda c: c.lower() == "user_annotation"))


def _ddp_backward(e: _Events, phase: np.ndarray, on_comp: np.ndarray) -> list[tuple[float, float, float]]:
    """(start, end, end of the last gradient accumulation) of every dpcore ``backward`` range
    (``phase``: dpcore's phase ranges on the computing thread) in which DDP's reducer ran (see
    :func:`trace_sets`)."""
    bwd = np.flatnonzero(phase & e.backward)
    if not bwd.size or not e.reducer.any():
        return []
    ts, end = e.ts, e.end
    acc = np.flatnonzero(e.accumulate & on_comp)
    out = []
    for i in bwd:
        a, b = ts[i], end[i]
        inside = acc[(ts[acc] >= a) & (end[acc] <= b)]
        if inside.size:
            out.append((float(a), float(b), float(end[inside].max())))
    return out


def gpu_window(ts: np.ndarray, end: np.ndarray, stream: np.ndarray) -> tuple[float, float] | None:
    """A GPU step's window [a, b] in µs: its first GPU event's start to its last one's end (the
    events of one step: a kernel belongs to the step that launched it), None without GPU events.
    The one rule for :func:`overlap_from_trace` and the import's steps.csv rows."""
    device = stream >= 0
    if not device.any():
        return None
    return float(ts[device].min()), float(end[device].max())


def _window(e: _Events, step: int) -> tuple[float, float]:
    """The step's window [a, b] in µs on the trace's clock (see :func:`overlap_from_trace`)."""
    ts, end = e.ts, e.end
    gpu = gpu_window(ts, end, e.stream)
    if gpu is not None:  # a GPU step: its kernels, whenever the CPU launched them
        return gpu
    if step < 0:  # no ProfilerStep: the whole trace
        return float(ts.min()), float(end.max())
    marker = e.phase
    if not marker.any():
        marker = e.marker
    if not marker.any():
        return float(ts.min()), float(end.max())
    a, b = float(ts[marker].min()), float(end[marker].max())
    late = e.comm & (ts >= a)
    if late.any():  # a collective the step started still is the step's, to its end
        b = max(b, float(end[late].max()))
    return a, b


def _row(rank: int, step: int, e: _Events) -> dict:
    a, b = _window(e, step)
    comm, compute = trace_sets(e)
    s = overlap_stats(clip(*comm, a, b), clip(*compute, a, b))
    return {"rank": rank, "step": step, "step_ms": (b - a) / 1e3, "compute_ms": s["compute"] / 1e3,
            "comm_ms": s["comm"] / 1e3, "overlapped_ms": s["overlapped"] / 1e3, "exposed_ms": s["exposed"] / 1e3,
            "overlap_pct": s["overlap_pct"]}


def _ranks(events: pd.DataFrame) -> Iterator[tuple[int, pd.DataFrame]]:
    """(rank, its events) in rank order; a one-rank frame (the per-rank reduction's) as it is."""
    r = events["rank"].to_numpy()
    if r.size and (r == r[0]).all():
        yield int(r[0]), events
        return
    for rank, ev in events.groupby("rank", sort=True):
        yield int(cast(SupportsInt, rank)), ev


def overlap_from_trace(events: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, ProfilerStep) overlap from trace events; step = -1 (whole trace) without steps.

    Each step is measured in its window, ``step_ms`` long, so compute + exposed comm <= step_ms
    in every row. On GPU: from the step's first kernel to its last (a kernel belongs to the step
    that launched it), the step as the GPU ran it. On CPU: from the start of dpcore's first
    phase range (``forward``) to the end of its last (``optimizer``), as steps.csv times the
    step, or the ``ProfilerStep#N`` range where the trace has no dpcore phases; extended to the
    end of a collective the step started that runs past it.
    """
    rows = []
    for rank, ev in _ranks(events):
        e = _Events.of(ev)
        step = ev["step"].to_numpy(np.int64)
        order = np.argsort(step, kind="stable")
        keys, first = np.unique(step[order], return_index=True)
        bounds = [*first.tolist(), order.size]
        if not (keys >= 0).any():
            rows.append(_row(rank, -1, e))
        for k, key in enumerate(keys.tolist()):
            if key >= 0:
                rows.append(_row(rank, int(key), e.take(order[bounds[k]:bounds[k + 1]])))
    return pd.DataFrame(rows, columns=TRACE_COLUMNS)


def overlap_table(events: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """:data:`OVERLAP_TABLE`'s reduction: :func:`overlap_from_trace` of one rank (``meta`` unused)."""
    return overlap_from_trace(events)


#: The per-rank table of the overlap numbers: one row per traced step of the rank (what
#: analyze, summarize and the overview read of a trace).
OVERLAP_TABLE = RankTable("overlap", {c: (np.int64 if c in ("rank", "step") else np.float64) for c in TRACE_COLUMNS},
                          overlap_table, columns=BASE)
