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
  :func:`stragglers_from_rows` matches them; the op comes from the profiler's collective
  metadata where the trace has it (``Collective name``), else from the kernel/span name; bytes
  from the metadata's element counts and dtype, empty where the trace does not say;
* ``comm_ms`` is the union of the step's comm events, as ``analyze`` measures a step's comm (a
  kernel belongs to the step that launched it and counts whole, also when it runs after the
  step's CPU range has ended).

Clock: ``ts`` is µs on each rank's host clock. Ranks of one host share that clock; across hosts
:func:`clock_offsets_ns` estimates each rank's offset to rank 0 from the ends of matched
collectives (every rank leaves a blocking collective at nearly the same moment).

Two halves, so that an import never holds more than one rank's events: :func:`rank_rows` turns
one trace's events into compact tables on the trace's own clock (its steps with their phases,
its comm events with op, bytes and arrival, and the facts of the file the checks need); it is
part of the rank reduction (:data:`IMPORT_TABLES`, read by :mod:`dpcore.read.ranks`), so it
runs in a worker, one rank at a time, and its tables are cached. Everything that needs several ranks at once (the clock
offsets, then every ``*_ns`` shifted by them, and ``comm_ms``, a union taken on the shifted
clock) runs on those compact tables: :func:`clock_offsets_ns`, :func:`collective_rows`,
:func:`step_rows`. The per-rank half is exact per rank: every rule above groups by rank (steps,
phases, the order within a step, the gloo enqueue links), so the rows are the ones a reading of
all ranks' events at once gave.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from dpcore.contract.config import IMPORTED
from dpcore.contract.intervals import comm_start, union_length
from dpcore.read.analysis.comm_overlap import by_name, gpu_window
from dpcore.read.analysis.gpu_time import device_pid
from dpcore.read.analysis.trace_arrivals import trace_comm_rows
from dpcore.read.traces.kinds import AUTOGRAD_NODE, FOREIGN_PHASES, PHASE_CATEGORY
from dpcore.read.traces.rank_table import RankTable
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


#: Columns of a rank's compact tables (dtypes in their declarations, :data:`IMPORT_TABLES`).
#: ``import_steps``: one row per step, times in µs on the trace's clock, phases in ms (NaN: none).
STEP_COLUMNS = ["rank", "step", "ts", "dur", "fwd_ms", "bwd_ms", "opt_ms"]
#: ``import_comm``: one row per comm event (also those in no step: the clock alignment matches
#: them too), ``seq`` its order in (rank, step), ``algo`` "" where the name carries none (the
#: backend then, known only once every trace is read), ``bytes`` NaN where unknown,
#: ``arrival_ns`` the linked enqueue (else the start) in ns on the trace's clock.
COMM_COLUMNS = ["rank", "step", "seq", "ts", "dur", "op", "algo", "bytes", "arrival_ns"]
#: ``import_facts``: one row per trace file: ``host`` (host_name, "" when none), first and last
#: µs of its events, ``ranks`` (JSON list of the ranks in it), ``dist_info`` (distributedInfo as
#: JSON, "" when not an object), ``props`` (len(deviceProperties), -1 when not a list),
#: ``device_names`` (JSON list of its devices' names) and ``gpu`` (an event on a stream);
#: ``comm_backend`` what its comm events are ("gloo" for gloo:* spans, "nccl" for NCCL/RCCL
#: kernels, "" for none), ``gpu_device`` the device its GPU events ran on (-1: none), ``dtype``
#: the precision its compute ran in and ``dtype_from`` how that is known (:func:`trace_dtype`, ""
#: unknown), ``bare`` whether the file
#: had no metadata at all (a JSON array of events: the legacy autograd profiler's export).
FACT_COLUMNS = ["host", "ts_min", "end_max", "ranks", "dist_info", "props", "device_names", "gpu",
                "comm_backend", "gpu_device", "dtype", "dtype_from", "bare"]
#: Kernel names that say their data type (ATen's templates name c10::BFloat16 / c10::Half).
_LOW_PRECISION = (("bf16", re.compile(r"bfloat16|bf16", re.IGNORECASE)),
                  ("fp16", re.compile(r"c10::Half|\bhalf\b|fp16|f16f16|__half", re.IGNORECASE)))
#: A low precision is the trace's when its kernels take at least this share of the compute time.
LOW_PRECISION_SHARE = 0.01


def trace_dtype(events: pd.DataFrame) -> tuple[str, str]:
    """(precision, how it is known) of one trace's compute: the data type most of the matrix
    products' FLOPs ran in where the trace recorded their inputs (``mm_dtype``, with
    ``record_shapes``); else, on a GPU, "bf16"/"fp16" when kernels naming that type (ATen's
    ``c10::BFloat16``, autocast's casts) take at least LOW_PRECISION_SHARE of the compute
    kernels' time, "fp32" when none do; ("", "") on a CPU trace without shapes. Why: a
    ``trace_handler`` or imported run has no dtype of its own to record, and a step time means
    little without the precision it ran in."""
    if "mm_dtype" in events and len(events):
        mm = events[events["mm_dtype"].astype(str).isin(("fp32", "tf32", "bf16", "fp16", "fp8"))]
        if len(mm):
            w = mm["flops"].fillna(0.0) if "flops" in mm else pd.Series(1.0, index=mm.index)
            if not w.sum() > 0:
                w = pd.Series(1.0, index=mm.index)
            return str(w.groupby(mm["mm_dtype"].astype(str)).sum().idxmax()), "matrix products' inputs"
    kern = events[(events["stream"].to_numpy() >= 0) & (events["kind"].astype(str) == "compute").to_numpy()] \
        if "stream" in events and len(events) else events.iloc[0:0]
    if kern.empty:
        return "", ""
    dur = kern["dur"].fillna(0.0).to_numpy(np.float64)
    total = float(dur.sum())
    best, share = "fp32", 0.0
    names = kern["name"].astype(str)
    for dtype, pattern in _LOW_PRECISION:
        part = float(dur[names.str.contains(pattern).to_numpy()].sum()) / total if total > 0 else 0.0
        if part >= LOW_PRECISION_SHARE and part > share:
            best, share = dtype, part
    return best, "kernel names"


def _cpu(ev: pd.DataFrame) -> pd.DataFrame:
    return ev[on_host(ev)]


def profiler_steps(events: pd.DataFrame) -> pd.DataFrame:
    """rank, step, ts, dur (µs) of every step: :func:`step_ranges`, the reader's one rule, except
    that a step with GPU events is its GPU window (:func:`~dpcore.read.analysis.comm_overlap.gpu_window`:
    its first kernel's start to its last one's end), the window ``analyze`` measures the step in.
    Why: the step's shares (compute, comm) are measured in that window; a steps.csv time of the
    CPU's ProfilerStep range beside them made summarize scale them to a step they were not
    measured in (a one-step H100 trace: 619 ms of compute in summarize where its kernels ran
    551 ms, as analyze said)."""
    steps = step_ranges(events)
    if "stream" not in events or steps.empty:
        return steps
    dev = events[(events["stream"].to_numpy() >= 0) & (events["step"].to_numpy() >= 0)]
    if dev.empty:
        return steps
    ts = dev["ts"].to_numpy(np.float64)
    end = ts + dev["dur"].to_numpy(np.float64)
    stream = dev["stream"].to_numpy()
    win: dict[tuple[int, int], tuple[float, float]] = {}
    for (rank, step), idx in dev.groupby([dev["rank"].to_numpy(), dev["step"].to_numpy()]).indices.items():
        w = gpu_window(ts[idx], end[idx], stream[idx])
        if w is not None:
            win[(int(rank), int(step))] = w
    got = [win.get((int(r), int(k))) for r, k in zip(steps["rank"], steps["step"])]
    steps = steps.copy()
    steps["ts"] = [w[0] if w else t for w, t in zip(got, steps["ts"])]
    steps["dur"] = [w[1] - w[0] if w else d for w, d in zip(got, steps["dur"])]
    return steps


def _union_ms(ts: np.ndarray, end: np.ndarray, sel: np.ndarray) -> float:
    """Union length (ms) of the selected ranges; NaN when none is selected."""
    if not sel.any():
        return float("nan")
    return union_length(ts[sel], end[sel]) / 1e3


def _phase_ms(ts: np.ndarray, end: np.ndarray, own: np.ndarray, foreign: np.ndarray,
              nodes: np.ndarray | None) -> float:
    """dpcore's own range of the phase (``own``: a ``user_annotation`` named like the phase), else
    the foreign names of FOREIGN_PHASES, else for backward (``nodes``) the first to last autograd
    node; NaN without any. The masks select among one step's host events."""
    if own.any():
        return _union_ms(ts, end, own)
    ms = _union_ms(ts, end, foreign)
    if not np.isnan(ms) or nodes is None:
        return ms
    if not nodes.any():
        return float("nan")
    return float(end[nodes].max() - ts[nodes].min()) / 1e3


def _step_table(events: pd.DataFrame) -> pd.DataFrame:
    """``import_steps`` of one trace's events: :func:`profiler_steps` and each step's phases."""
    steps = profiler_steps(events)
    cpu = _cpu(events)
    is_phase_cat = by_name(cpu["category"], lambda c: c == PHASE_CATEGORY)
    masks = {ph: (by_name(cpu["name"], ph.__eq__) & is_phase_cat,
                  by_name(cpu["name"], re.compile(FOREIGN_PHASES[ph]).match))
             for ph in ("forward", "backward", "optimizer")}
    nodes = by_name(cpu["name"], re.compile(AUTOGRAD_NODE).match)
    ts = cpu["ts"].to_numpy(np.float64)
    end = ts + cpu["dur"].to_numpy(np.float64)
    at = {k: np.asarray(v) for k, v in pd.Series(np.arange(len(cpu))).groupby(
        [cpu["rank"].to_numpy(), cpu["step"].to_numpy()]).groups.items()} if len(cpu) else {}
    phases: dict[str, list[float]] = {"fwd_ms": [], "bwd_ms": [], "opt_ms": []}
    for rank, step in zip(steps["rank"], steps["step"]):
        i = at.get((rank, step), np.zeros(0, np.int64))
        t, e = ts[i], end[i]
        for col, ph in (("fwd_ms", "forward"), ("bwd_ms", "backward"), ("opt_ms", "optimizer")):
            own, foreign = masks[ph]
            phases[col].append(_phase_ms(t, e, own[i], foreign[i], nodes[i] if ph == "backward" else None))
    return steps.assign(**{k: np.asarray(v, np.float64) for k, v in phases.items()})[STEP_COLUMNS]


def _comm_table(events: pd.DataFrame, linked: pd.DataFrame | None = None) -> pd.DataFrame:
    """``import_comm`` of one trace's events: every comm event by (rank, step, ts), its op, the
    NCCL algorithm its name carries, bytes and arrival (see :func:`collective_rows`).
    ``linked``: :func:`trace_comm_rows` of the events, where the caller has it already."""
    comm = events[events["kind"] == "comm"].sort_values(["rank", "step", "ts"], kind="stable")
    if comm.empty:
        return pd.DataFrame(columns=COMM_COLUMNS)
    linked = trace_comm_rows(events) if linked is None else linked
    linked = linked[linked["enqueued"].astype(bool)]
    arrival_of = dict(zip(zip(linked["rank"].astype(int), linked["t_start_ns"].round().astype(np.int64)),
                          linked["t_launch_ns"].round().astype(np.int64), strict=True))
    meta = comm["collective"] if "collective" in comm else pd.Series("", index=comm.index)
    nbytes = comm["bytes"] if "bytes" in comm else pd.Series(np.nan, index=comm.index)
    ops, algos, arrivals = [], [], []
    named: dict[tuple, tuple[str, str]] = {}  # (name, collective) -> (op, algo): a few per rank
    for rank, ts, name, coll in zip(comm["rank"], comm["ts"], comm["name"], meta):
        start_raw = int(round(ts * 1e3))
        arrivals.append(int(arrival_of.get((int(rank), start_raw), start_raw)))
        key = (name, coll if coll == coll else None)  # NaN != NaN: one key for a missing one
        if key not in named:
            op = op_of(str(coll)) if coll else "unknown"
            named[key] = (op if op != "unknown" else op_of(str(name)), algo_of(str(name), ""))
        ops.append(named[key][0])
        algos.append(named[key][1])
    return pd.DataFrame({"rank": comm["rank"].to_numpy(np.int64), "step": comm["step"].to_numpy(np.int64),
                         "seq": comm.groupby(["rank", "step"]).cumcount().to_numpy(np.int64),
                         "ts": comm["ts"].to_numpy(np.float64), "dur": comm["dur"].to_numpy(np.float64),
                         "op": ops, "algo": algos, "bytes": nbytes.to_numpy(np.float64),
                         "arrival_ns": np.asarray(arrivals, np.int64)})


def _facts(events: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """``import_facts`` of one trace file (see :data:`FACT_COLUMNS`)."""
    info = meta.get("distributedInfo")
    props = meta.get("deviceProperties")
    names = [str(p.get("name")) for p in props if isinstance(p, dict) and p.get("name")] \
        if isinstance(props, list) else []
    empty = not len(events)
    dtype, dtype_from = trace_dtype(events)
    return pd.DataFrame({
        "host": [str(meta.get("host_name") or "")],
        "ts_min": [float("nan") if empty else float(events["ts"].min())],
        "end_max": [float("nan") if empty else float((events["ts"] + events["dur"].fillna(0).clip(lower=0)).max())],
        "ranks": [json.dumps(sorted(int(r) for r in events["rank"].unique()))],
        "dist_info": [json.dumps(info, default=str) if isinstance(info, dict) else ""],
        "props": [len(props) if isinstance(props, list) else -1],
        "device_names": [json.dumps(names)],
        "gpu": [bool((events["stream"] >= 0).any())],
        "comm_backend": [_comm_backend(events)], "gpu_device": [_gpu_device(events)],
        "dtype": [dtype], "dtype_from": [dtype_from], "bare": [not meta]})


def _comm_backend(events: pd.DataFrame) -> str:
    """"gloo" where the comm events are gloo:* spans, "nccl" where they are NCCL/RCCL kernels, else ""."""
    comm = events.loc[(events["kind"].astype(str) == "comm").to_numpy(), "name"].astype(str) if len(events) else None
    if comm is None or comm.empty:
        return ""
    if comm.str.startswith("gloo:").any():
        return "gloo"
    return "nccl" if comm.str.contains("nccl|rccl", case=False).any() else ""


def _gpu_device(events: pd.DataFrame) -> int:
    """The device id the GPU time ledger reads (:func:`~dpcore.read.analysis.gpu_time.device_pid`:
    the device with the most GPU events), -1 without GPU events or a number."""
    top = device_pid(events) if len(events) else ""
    return int(top) if top.lstrip("-").isdigit() else -1


def rank_rows(events: pd.DataFrame, meta: dict | None = None,
              linked: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """One trace's compact import tables ``import_steps``, ``import_comm``, ``import_facts``, on
    its own clock (pure; see the module docstring). ``meta``: the trace's top-level metadata;
    ``linked``: :func:`trace_comm_rows` of the events, where the caller has it already."""
    return {"import_steps": _step_table(events), "import_comm": _comm_table(events, linked),
            "import_facts": _facts(events, meta or {})}


def import_tables(events: pd.DataFrame, meta: dict) -> dict[str, pd.DataFrame]:
    """The reduction of :data:`IMPORT_TABLES` (one pass makes the three): :func:`rank_rows`."""
    return rank_rows(events, meta)


#: What ``dpcore import`` needs of every rank: its steps and phases, its comm events, the
#: file's facts (host, time span, metadata).
IMPORT_STEPS = RankTable("import_steps", {"rank": np.int64, "step": np.int64, "ts": np.float64, "dur": np.float64,
                                          "fwd_ms": np.float64, "bwd_ms": np.float64, "opt_ms": np.float64},
                         import_tables, version=2)  # 2: a GPU step is its GPU window
IMPORT_COMM = RankTable("import_comm", {"rank": np.int64, "step": np.int64, "seq": np.int64, "ts": np.float64,
                                        "dur": np.float64, "op": object, "algo": object, "bytes": np.float64,
                                        "arrival_ns": np.int64}, import_tables)
IMPORT_FACTS = RankTable("import_facts", {"host": object, "ts_min": np.float64, "end_max": np.float64,
                                          "ranks": object, "dist_info": object, "props": np.int64,
                                          "device_names": object, "gpu": bool, "comm_backend": object,
                                          "gpu_device": np.int64, "dtype": object, "dtype_from": object,
                                          "bare": bool},
                         import_tables, version=3)  # 3: gpu_device is the GPU time ledger's device
IMPORT_TABLES = (IMPORT_STEPS, IMPORT_COMM, IMPORT_FACTS)


def collective_rows(comm: pd.DataFrame, job_id: str, backend: str,
                    offsets_ns: dict[int, int] | None = None) -> list[dict]:
    """collectives.csv rows of the comm events in traced steps, from the ranks' ``import_comm``
    tables; ``*_ns`` on the shared clock (ts·1000 − offset).

    Arrival (``t_launch_ns``) is the rank's enqueue where the trace links it (gloo: the
    ``c10d::*`` / ``record_param_comms`` op on the calling thread, paired with its gloo span by
    :func:`~dpcore.read.analysis.trace_arrivals.trace_comm_rows`, the same arrival ``stragglers``
    reads from the traces), else the event's start; ``t_start_ns`` is the event's start: the
    backend began then (gloo's worker picked it up, the kernel ran), which a trace does show.
    So ``stragglers`` on an imported run and on its traces agree, and the interval method's comm
    (which takes ``t_start_ns`` where known) is the trace's span, as ``analyze`` measures it.
    """
    comm = comm[comm["step"] >= 0].sort_values(["rank", "step", "ts"], kind="stable")
    off = offsets_ns or {}
    rows = []
    for rank, step, q, ts, dur, op, algo, nb, arrival in zip(*(comm[c].tolist() for c in COMM_COLUMNS)):
        o = off.get(int(rank), 0)
        rows.append({"job_id": job_id, "rank": int(rank), "step": int(step), "seq": int(q),
                     "op": op, "algo": algo or backend, "bytes": int(nb) if nb == nb else "",
                     "t_launch_ns": int(arrival) - o, "t_start_ns": int(round(ts * 1e3)) - o,
                     "t_end_ns": int(round((ts + dur) * 1e3)) - o, "bucket": ""})
    return rows


def step_rows(steps: pd.DataFrame, collectives: list[dict], job_id: str, world_size: int,
              offsets_ns: dict[int, int] | None = None) -> list[dict]:
    """steps.csv rows, one per (rank, ProfilerStep#N), from the ranks' ``import_steps`` tables
    and the collectives' rows; phases only from clear markers (else empty)."""
    off = offsets_ns or {}
    steps = steps.sort_values(["rank", "step"], kind="stable")
    by_key: dict[tuple[int, int], list[dict]] = {}
    for c in collectives:
        by_key.setdefault((c["rank"], c["step"]), []).append(c)
    rows = []
    for rank, step, ts, dur, fwd, bwd, opt in zip(*(steps[c].tolist() for c in STEP_COLUMNS)):
        t0 = int(round(ts * 1e3)) - off.get(int(rank), 0)
        colls = by_key.get((int(rank), int(step)), [])
        # comm_ms as `analyze` measures it: the union of the comm events that belong to the step
        # (a kernel to the step that launched it), not clipped to the CPU range: a GPU step's
        # kernels run after the CPU has moved on, and they are still that step's communication.
        # Taken here, on the shifted clock, not per rank: the union is a float sum of ns times
        comm_ms = union_length(comm_start([c["t_launch_ns"] for c in colls], [c["t_start_ns"] for c in colls]),
                               [c["t_end_ns"] for c in colls]) / 1e6
        rows.append({"job_id": job_id, "variant": VARIANT, "world_size": world_size, "bucket_mb": "",
                     "rank": int(rank), "step": int(step), "profiled": True, "t_start_ns": t0,
                     "step_ms": dur / 1e3, "fwd_ms": fwd, "bwd_ms": bwd, "sync_ms": float("nan"),
                     "opt_ms": opt, "comm_ms": comm_ms,
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


def matched_ends(comm: pd.DataFrame) -> pd.DataFrame:
    """End (µs) of every comm event (the ranks' ``import_comm`` rows) matched across all ranks by
    (step, order in step): one column per rank, one row per matched collective (steps whose
    counts differ are dropped)."""
    if comm.empty:
        return pd.DataFrame()
    comm = comm.assign(end=comm["ts"] + comm["dur"])
    wide = comm.pivot_table(index=["step", "seq"], columns="rank", values="end", aggfunc="first")
    return wide.dropna()


def clock_offsets_ns(comm: pd.DataFrame, ranks: list[int]) -> tuple[dict[int, int], int]:
    """({rank: offset to rank 0 in ns}, collectives used): the median over matched collectives of
    (rank's end − rank 0's end), from the ranks' ``import_comm`` rows; ``ranks``: every rank read.
    Subtract it from a rank's times to put it on rank 0's clock.

    Why ends: a blocking collective (all-reduce, all-gather) returns on every rank once the last
    data arrived, so the ends coincide up to the transfer of the last piece, while the starts
    differ by whatever each rank computed before. The median ignores the occasional collective
    a rank left late (descheduled). Ranks with no matched collective get 0.
    """
    ranks = sorted(ranks)
    wide = matched_ends(comm)
    if wide.empty or ranks[0] not in wide:
        return {r: 0 for r in ranks}, 0
    base = wide[ranks[0]]
    return {r: int(round(float(np.median(wide[r] - base)) * 1e3)) if r in wide else 0 for r in ranks}, len(wide)
