"""Foreign torch.profiler traces -> the rows of a run's steps.csv and collectives.csv (pure).

Why only what the trace says: an imported run is read by the same views as a profiled one, and
a number the views show must be one the trace measured. So

* steps are the reader's steps (:func:`dpcore.read.traces.reader.step_ranges`, the one rule
  ``analyze`` uses too): the ``ProfilerStep#N`` ranges, or for a trace without any, the whole
  trace as one step (every imported step is traced: ``profiled`` True);
* phases come only from ranges that clearly name them: dpcore's own ``forward``/``backward``/
  ``optimizer`` annotations (``user_annotation`` events, as dpcore writes them), else the
  explicit mapping of foreign names :data:`dpcore.read.traces.kinds.FOREIGN_PHASES`
  (``## forward ##``, ``DistributedDataParallel.forward``, ``## backward ##``,
  ``Optimizer.step#<cls>.step``, ...) and for backward the span of the autograd engine's
  ``autograd::engine::evaluate_function:`` nodes. A TorchScript op called ``forward`` is not a
  phase. A phase with no such range stays empty (NaN): the views show it as missing.
  ``sync_ms`` and ``samples`` are never in a trace;
* collectives are the comm events of the traced steps (kind ``comm``: gloo spans on a gloo
  thread, NCCL kernels counted in the step that launched them; a kernel launched before the
  trace began is in no step and not a row), numbered by order within (rank, step) as
  :func:`stragglers_from_traces` matches them; the op comes from the profiler's collective
  metadata where the trace has it (``Collective name``), else from the kernel/span name; bytes
  from the metadata's element counts and dtype, empty where the trace does not say;
* ``comm_ms`` is the union of the step's comm events, as ``analyze`` measures a step's comm (a
  kernel belongs to the step that launched it and counts whole, also when it runs after the
  step's CPU range has ended).

Clock: ``ts`` is µs on each rank's host clock. Ranks of one host share that clock; across hosts
:func:`clock_offsets_ns` estimates each rank's offset to rank 0 from the ends of matched
collectives (every rank leaves a blocking collective at nearly the same moment).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dpcore.contract.config import IMPORTED
from dpcore.contract.intervals import comm_start, union_length
from dpcore.read.analysis.trace_arrivals import trace_comm_rows
from dpcore.read.traces.kinds import AUTOGRAD_NODE, FOREIGN_PHASES, PHASE_CATEGORY
from dpcore.read.traces.reader import on_host, step_ranges

VARIANT = IMPORTED
#: Collective names as gloo spans (``gloo:all_reduce``), NCCL kernels (``ncclDevKernel_AllReduce_
#: Sum_f32_RING_LL``, ``ncclKernel_AllGather_RING_LL_Sum_int8_t``) and profiler ranges spell them.
_OPS = [(re.compile(p, re.IGNORECASE), op) for p, op in (
    (r"all_?reduce", "all_reduce"), (r"reduce_?scatter", "reduce_scatter"), (r"all_?gather", "all_gather"),
    (r"all_?to_?all", "all_to_all"), (r"broadcast", "broadcast"), (r"barrier", "barrier"),
    (r"send_?recv", "send_recv"), (r"(?<![a-z])send", "send"), (r"recv", "recv"), (r"reduce", "reduce"),
    (r"gather", "gather"), (r"scatter", "scatter"))]
_ALGO = re.compile(r"_(RING|TREE|COLLNET\w*|NVLS\w*|PAT)_", re.IGNORECASE)


def op_of(name: str) -> str:
    """``gloo:all_reduce`` -> ``all_reduce``; ``ncclDevKernel_AllGather_RING_LL`` -> ``all_gather``."""
    for rx, op in _OPS:
        if rx.search(name):
            return op
    return "unknown"


def algo_of(name: str, backend: str) -> str:
    """The NCCL algorithm a kernel name carries (``ring``, ``tree``), else the backend's name."""
    m = _ALGO.search(name + "_")
    return m.group(1).lower() if m else backend


def _cpu(ev: pd.DataFrame) -> pd.DataFrame:
    return ev[on_host(ev)]


def profiler_steps(events: pd.DataFrame) -> pd.DataFrame:
    """rank, step, ts, dur (µs) of every step: :func:`step_ranges`, the reader's one rule."""
    return step_ranges(events)


def _union_ms(ev: pd.DataFrame, sel: np.ndarray) -> float:
    """Union length (ms) of the selected ranges; NaN when none is selected."""
    if not sel.any():
        return float("nan")
    ts = ev["ts"].to_numpy(np.float64)[sel]
    return union_length(ts, ts + ev["dur"].to_numpy(np.float64)[sel]) / 1e3


def _phase_ms(ev: pd.DataFrame, names: pd.Series, phase: str) -> float:
    """dpcore's own range of the phase (a ``user_annotation`` named ``phase``), else the foreign
    names of FOREIGN_PHASES, else for backward the first to last autograd node; NaN without any."""
    own = (names == phase).to_numpy() & (ev["category"].astype(str) == PHASE_CATEGORY).to_numpy()
    if own.any():
        return _union_ms(ev, own)
    ms = _union_ms(ev, names.str.match(FOREIGN_PHASES[phase]).to_numpy())
    if not np.isnan(ms) or phase != "backward":
        return ms
    sel = names.str.match(AUTOGRAD_NODE).to_numpy()
    if not sel.any():
        return float("nan")
    ts = ev["ts"].to_numpy(np.float64)[sel]
    return float((ts + ev["dur"].to_numpy(np.float64)[sel]).max() - ts.min()) / 1e3


def collective_rows(events: pd.DataFrame, job_id: str, backend: str,
                    offsets_ns: dict[int, int] | None = None) -> list[dict]:
    """collectives.csv rows of the comm events, ``*_ns`` on the shared clock (ts·1000 − offset).

    Arrival (``t_launch_ns``) is the rank's enqueue where the trace links it (gloo: the
    ``c10d::*`` / ``record_param_comms`` op on the calling thread, paired with its gloo span by
    :func:`~dpcore.read.analysis.trace_arrivals.trace_comm_rows`, the same arrival ``stragglers``
    reads from the traces), else the event's start; ``t_start_ns`` is the event's start: the
    backend began then (gloo's worker picked it up, the kernel ran), which a trace does show.
    So ``stragglers`` on an imported run and on its traces agree, and the interval method's comm
    (which takes ``t_start_ns`` where known) is the trace's span, as ``analyze`` measures it.
    """
    comm = events[(events["kind"] == "comm") & (events["step"] >= 0)]
    comm = comm.sort_values(["rank", "step", "ts"], kind="stable")
    if comm.empty:
        return []
    seq = comm.groupby(["rank", "step"]).cumcount().to_numpy()
    off = offsets_ns or {}
    linked = trace_comm_rows(events)
    linked = linked[linked["enqueued"].astype(bool)]
    arrival_of = dict(zip(zip(linked["rank"].astype(int), linked["t_start_ns"].round().astype(np.int64)),
                          linked["t_launch_ns"].round().astype(np.int64), strict=True))
    rows = []
    meta = comm["collective"] if "collective" in comm else pd.Series("", index=comm.index)
    nbytes = comm["bytes"] if "bytes" in comm else pd.Series(np.nan, index=comm.index)
    for (rank, step, ts, dur, name, coll, nb), q in zip(zip(
            comm["rank"], comm["step"], comm["ts"], comm["dur"], comm["name"], meta, nbytes), seq):
        o = off.get(int(rank), 0)
        start_raw = int(round(ts * 1e3))
        start = start_raw - o
        arrival = int(arrival_of.get((int(rank), start_raw), start_raw)) - o
        op = op_of(str(coll)) if coll else "unknown"
        rows.append({"job_id": job_id, "rank": int(rank), "step": int(step), "seq": int(q),
                     "op": op if op != "unknown" else op_of(str(name)), "algo": algo_of(str(name), backend),
                     "bytes": int(nb) if nb == nb else "",
                     "t_launch_ns": arrival, "t_start_ns": start,
                     "t_end_ns": int(round((ts + dur) * 1e3)) - o, "bucket": ""})
    return rows


def step_rows(events: pd.DataFrame, collectives: list[dict], job_id: str, world_size: int,
              offsets_ns: dict[int, int] | None = None) -> list[dict]:
    """steps.csv rows, one per (rank, ProfilerStep#N); phases only from clear markers (else NaN)."""
    off = offsets_ns or {}
    steps = profiler_steps(events)
    by_key: dict[tuple[int, int], list[dict]] = {}
    for c in collectives:
        by_key.setdefault((c["rank"], c["step"]), []).append(c)
    cpu = _cpu(events)
    cpu_names = cpu["name"].astype(str)
    groups = {k: idx for k, idx in cpu.groupby(["rank", "step"]).groups.items()}
    rows = []
    for rank, step, ts, dur in steps.itertuples(index=False, name=None):
        idx = groups.get((rank, step))
        ev = cpu.loc[idx] if idx is not None else cpu.iloc[0:0]
        names = cpu_names.loc[ev.index]
        t0 = int(round(ts * 1e3)) - off.get(int(rank), 0)
        colls = by_key.get((int(rank), int(step)), [])
        # comm_ms as `analyze` measures it: the union of the comm events that belong to the step
        # (a kernel to the step that launched it), not clipped to the CPU range: a GPU step's
        # kernels run after the CPU has moved on, and they are still that step's communication
        comm_ms = union_length(comm_start([c["t_launch_ns"] for c in colls], [c["t_start_ns"] for c in colls]),
                               [c["t_end_ns"] for c in colls]) / 1e6
        rows.append({"job_id": job_id, "variant": VARIANT, "world_size": world_size, "bucket_mb": "",
                     "rank": int(rank), "step": int(step), "profiled": True, "t_start_ns": t0,
                     "step_ms": dur / 1e3, "fwd_ms": _phase_ms(ev, names, "forward"),
                     "bwd_ms": _phase_ms(ev, names, "backward"), "sync_ms": float("nan"),
                     "opt_ms": _phase_ms(ev, names, "optimizer"), "comm_ms": comm_ms,
                     "comm_ops": len(colls), "comm_bytes": _bytes_sum(colls), "samples": ""})
    for r in rows:  # CSV: an unknown number is an empty cell
        for k in ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms"):
            if np.isnan(r[k]):
                r[k] = ""
    return rows


def _bytes_sum(colls: list[dict]) -> int | str:
    """Σ bytes of a step's collectives; empty (unknown) when any of them has no bytes."""
    if any(c["bytes"] == "" for c in colls):
        return ""
    return sum(int(c["bytes"]) for c in colls)


def matched_ends(events: pd.DataFrame) -> pd.DataFrame:
    """End (µs) of every comm event matched across all ranks by (step, order in step): one
    column per rank, one row per matched collective (steps whose counts differ are dropped)."""
    comm = events[events["kind"] == "comm"].sort_values(["rank", "step", "ts"], kind="stable")
    if comm.empty:
        return pd.DataFrame()
    comm = comm.assign(seq=comm.groupby(["rank", "step"]).cumcount(), end=comm["ts"] + comm["dur"])
    wide = comm.pivot_table(index=["step", "seq"], columns="rank", values="end", aggfunc="first")
    return wide.dropna()


def clock_offsets_ns(events: pd.DataFrame) -> tuple[dict[int, int], int]:
    """({rank: offset to rank 0 in ns}, collectives used): the median over matched collectives of
    (rank's end − rank 0's end). Subtract it from a rank's times to put it on rank 0's clock.

    Why ends: a blocking collective (all-reduce, all-gather) returns on every rank once the last
    data arrived, so the ends coincide up to the transfer of the last piece, while the starts
    differ by whatever each rank computed before. The median ignores the occasional collective
    a rank left late (descheduled). Ranks with no matched collective get 0.
    """
    ranks = sorted(int(r) for r in events["rank"].unique())
    wide = matched_ends(events)
    if wide.empty or ranks[0] not in wide:
        return {r: 0 for r in ranks}, 0
    base = wide[ranks[0]]
    return {r: int(round(float(np.median(wide[r] - base)) * 1e3)) if r in wide else 0 for r in ranks}, len(wide)
