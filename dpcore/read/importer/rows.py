"""Foreign torch.profiler traces -> the rows of a run's steps.csv and collectives.csv (pure).

Why only what the trace says: an imported run is read by the same views as a profiled one, and
a number the views show must be one the trace measured. So

* steps are the ``ProfilerStep#N`` ranges (every imported step is traced: ``profiled`` True);
* phases come only from ranges that clearly name them: dpcore's own ``forward``/``backward``/
  ``optimizer``, else ``DistributedDataParallel.forward`` / ``FullyShardedDataParallel.forward``
  (forward), the span of the autograd engine's ``autograd::engine::evaluate_function:`` nodes
  (backward) and ``Optimizer.step#<cls>.step`` (optimizer). A phase with no such range stays
  empty (NaN): the views show it as missing. ``sync_ms`` and ``samples`` are never in a trace;
* collectives are the comm events (kind ``comm``: gloo spans on a gloo thread, NCCL kernels),
  numbered by order within (rank, step) as :func:`stragglers_from_traces` matches them; the op
  comes from the name, bytes stay empty (a kernel or gloo span does not carry its size);
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
from dpcore.contract.intervals import union_length

VARIANT = IMPORTED
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_FWD = re.compile(r"^(forward|(DistributedDataParallel|FullyShardedDataParallel)\.forward)$")
_BWD_MARK = re.compile(r"^backward$")
_BWD_NODE = re.compile(r"^autograd::engine::evaluate_function: ")
_OPT = re.compile(r"^(optimizer|Optimizer\.step#.*\.step)$")
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
    return ev[ev["stream"] < 0]


def profiler_steps(events: pd.DataFrame) -> pd.DataFrame:
    """rank, step, ts, dur (µs) of every ``ProfilerStep#N`` range (CPU side, longest per step)."""
    ev = _cpu(events)
    names = ev["name"].astype(str)
    num = names.str.extract(_STEP_RE, expand=False)
    s = ev.loc[num.notna(), ["rank", "ts", "dur"]].assign(step=num.dropna().astype(np.int64))
    s = s.sort_values("dur", ascending=False).drop_duplicates(["rank", "step"])
    return s.sort_values(["rank", "step"]).reset_index(drop=True)[["rank", "step", "ts", "dur"]]


def _phase_ms(ev: pd.DataFrame, names: pd.Series, rx: re.Pattern) -> float:
    """Union length (ms) of the ranges whose name matches; NaN when none does."""
    sel = names.str.match(rx).to_numpy()
    if not sel.any():
        return float("nan")
    ts = ev["ts"].to_numpy(np.float64)[sel]
    return union_length(ts, ts + ev["dur"].to_numpy(np.float64)[sel]) / 1e3


def _backward_ms(ev: pd.DataFrame, names: pd.Series) -> float:
    """dpcore's ``backward`` range, else first to last autograd node of the step; NaN without either."""
    ms = _phase_ms(ev, names, _BWD_MARK)
    if not np.isnan(ms):
        return ms
    sel = names.str.match(_BWD_NODE).to_numpy()
    if not sel.any():
        return float("nan")
    ts = ev["ts"].to_numpy(np.float64)[sel]
    return float((ts + ev["dur"].to_numpy(np.float64)[sel]).max() - ts.min()) / 1e3


def collective_rows(events: pd.DataFrame, job_id: str, backend: str,
                    offsets_ns: dict[int, int] | None = None) -> list[dict]:
    """collectives.csv rows of the comm events, ``*_ns`` on the shared clock (ts·1000 − offset).

    Arrival (``t_launch_ns``) is the event's start, as in :func:`stragglers_from_traces`: when the
    gloo thread picked the collective up, or when the NCCL kernel began; ``t_start_ns`` is only
    known for kernels (the backend began then), empty for gloo.
    """
    comm = events[events["kind"] == "comm"].sort_values(["rank", "step", "ts"], kind="stable")
    if comm.empty:
        return []
    seq = comm.groupby(["rank", "step"]).cumcount().to_numpy()
    off = offsets_ns or {}
    rows = []
    for (rank, step, ts, dur, name, stream), q in zip(
            comm[["rank", "step", "ts", "dur", "name", "stream"]].itertuples(index=False, name=None), seq):
        o = off.get(int(rank), 0)
        start = int(round(ts * 1e3)) - o
        rows.append({"job_id": job_id, "rank": int(rank), "step": int(step), "seq": int(q),
                     "op": op_of(str(name)), "algo": algo_of(str(name), backend), "bytes": "",
                     "t_launch_ns": start, "t_start_ns": start if stream >= 0 else "",
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
        comm_ms = union_length([c["t_launch_ns"] for c in colls], [c["t_end_ns"] for c in colls]) / 1e6
        rows.append({"job_id": job_id, "variant": VARIANT, "world_size": world_size, "bucket_mb": "",
                     "rank": int(rank), "step": int(step), "profiled": True, "t_start_ns": t0,
                     "step_ms": dur / 1e3, "fwd_ms": _phase_ms(ev, names, _FWD),
                     "bwd_ms": _backward_ms(ev, names), "sync_ms": float("nan"),
                     "opt_ms": _phase_ms(ev, names, _OPT), "comm_ms": comm_ms,
                     "comm_ops": len(colls), "comm_bytes": "", "samples": ""})
    for r in rows:  # CSV: an unknown number is an empty cell
        for k in ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms"):
            if np.isnan(r[k]):
                r[k] = ""
    return rows


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
