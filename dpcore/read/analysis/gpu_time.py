"""The GPU time ledger of one rank: where the device's time went, and why it sat idle.

Why: a GPU user's first question is "why is my GPU idle?". Holistic Trace Analysis answers
with its temporal breakdown (idle / compute / non-compute over the span of the GPU events);
this module computes that definition on the trace's exact timestamps (HTA rounds to whole
microseconds and leaves out the last profiler step, so it can read several points apart) and
adds what HTA's breakdown does not say: whose fault each idle gap is.

Definitions (docs/DESIGN.md, "GPU time"):

* GPU events: kernels, memory copies and memory sets on any stream of the device (the trace's
  device with the most GPU events). A kernel is communication when the trace classifies it as
  a collective's (:mod:`dpcore.read.traces.kinds`: NCCL/RCCL kernels of any naming generation,
  and kernels launched from a collective's CPU range), memory when it is a copy or a set,
  compute otherwise.
* Windows: ``trace`` = first GPU event start to last GPU event end; ``step`` k = the GPU events
  whose launch call (same correlation id) lies inside ``ProfilerStep#k`` (the events frame's
  ``step``), from the first one's start to the last one's end.
* In a window W: idle = |W| - |U all|; compute = |U compute|; non_compute = |W| - idle -
  compute; comm = |U comm|; memory = |U memory|; exposed_comm = |U comm minus U compute|.
* Idle by cause, per gap of the union: ``host`` when the launch call of the GPU event that ends
  the gap started after the gap began (the CPU was late: nothing was queued), else ``device``
  (it was queued in time: a stream wait, a dependency, launch latency; also where its launch is
  not in the trace). A host gap is charged to the outermost CPU op (``cpu_op`` or
  ``user_annotation``, step markers aside) on the launching thread that covers the gap's start:
  what the CPU was busy with while the GPU waited; ``python`` where no op covers it.
* A window is host-bound when host idle is over half its span.
* A GPU event with a negative (or no) duration cannot be true: it is set aside before any of the
  above (``set_aside_events`` counts them), so no share can pass 100 %.
* FLOPs per window (FLOPS_COLUMNS, :mod:`dpcore.read.analysis.gpu_flops`): what step MFU, GEMM
  efficiency and FLOPs coverage are made from (:func:`~dpcore.read.analysis.gpu_flops.with_efficiency`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.contract.intervals import subtract, union_length
from dpcore.read.analysis.gpu_flops import (
    FLOPS_COLUMNS,
    codes,
    event_flops,
    rank_efficiency,
    table_version,
    window_flops,
)
from dpcore.read.traces.kinds import STEP_RE
from dpcore.read.traces.rank_table import RankTable

#: Categories of the GPU events the ledger counts.
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: Host categories whose ranges can name what the CPU was doing during a host gap.
CAUSE_CATS = ("cpu_op", "user_annotation")
#: Categories of the launch calls (the host side of a correlation id).
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
#: The cause of a host gap that no CPU op covers: the CPU was in Python between operators.
PYTHON = "python"
#: Step of the rows of the ``trace`` window.
TRACE_STEP = -1
#: A window is host-bound above this share of host idle.
HOST_BOUND_SHARE = 0.5
LEDGER_COLUMNS = ["rank", "window", "step", "span_ms", "compute_ms", "non_compute_ms", "comm_ms",
                  "exposed_comm_ms", "memory_ms", "idle_ms", "idle_host_ms", "idle_device_ms", "idle_pct",
                  "compute_pct", "non_compute_pct", "host_bound", "top_idle_cause", "top_idle_cause_ms",
                  *FLOPS_COLUMNS]
#: Host idle per cause, per window (every cause with idle; the ledger's top_idle_cause is the first).
CAUSE_COLUMNS = ["rank", "window", "step", "cause", "idle_ms"]
_CLASS = {"comm": "comm", "memcpy": "memory"}  # events-frame kind -> ledger class; else compute


def gpu_ledger(events: pd.DataFrame, per_step: bool = True, device: str = "") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ledger, causes) of every rank of an events frame (:func:`dpcore.read.traces.read_trace`'s).

    ledger: one row per rank for the ``trace`` window (step -1) and, with ``per_step``, one per
    traced step whose launches put GPU events in it (LEDGER_COLUMNS; times in ms, shares in
    percent of span_ms; then the window's FLOPs on the GPU named ``device``). causes: the host idle
    of each of those windows by cause, largest first (CAUSE_COLUMNS). A rank without GPU events has
    no rows."""
    rows: list[dict] = []
    causes: list[dict] = []
    for rank, ev in events.groupby("rank", sort=True, observed=True):
        _rank_ledger(ev, int(rank), per_step, rows, causes, device)
    ledger = pd.DataFrame(rows, columns=LEDGER_COLUMNS)
    return ledger, pd.DataFrame(causes, columns=CAUSE_COLUMNS)


def device_events(events: pd.DataFrame) -> np.ndarray:
    """Which events are the GPU events (kernels, copies and sets on a stream) of the trace's
    device that ran the most of them: the one device the ledger reads, whose name rates the
    FLOPs (:func:`device_name`) and whose id the import records (``import_facts.gpu_device``).
    All False without GPU events."""
    dev = (events["stream"].to_numpy() >= 0) & events["category"].isin(GPU_CATS).to_numpy()
    if not dev.any():
        return dev
    pid, _ = codes(events["pid"])
    return dev & (pid == np.bincount(pid[dev] + 1).argmax() - 1)  # code -1 (no pid) counts at 0


def device_pid(events: pd.DataFrame) -> str:
    """The pid (the device id, as text) of :func:`device_events`' device, "" without GPU events."""
    on = device_events(events)
    return str(events["pid"].to_numpy()[on][0]) if on.any() else ""


def device_name(meta: dict | None, events: pd.DataFrame) -> str:
    """The name (deviceProperties) of the device that ran the most GPU events of a trace
    (:func:`device_pid`); the first device's name where the ids do not match, "" where the trace
    names none."""
    props = (meta or {}).get("deviceProperties")
    named = {str(p.get("id")): str(p["name"]) for p in props if isinstance(p, dict) and p.get("name")} \
        if isinstance(props, list) else {}
    if not named:
        return ""
    return named.get(device_pid(events), next(iter(named.values())))


def ledger_tables(events: pd.DataFrame, meta: dict) -> dict[str, pd.DataFrame]:
    """The reduction of :data:`GPU_TABLE` and :data:`GPU_CAUSES_TABLE` (one pass makes both):
    :func:`gpu_ledger` of one rank, on the device its metadata names."""
    ledger, causes = gpu_ledger(events, device=device_name(meta, events))
    return {"gpu": ledger, "gpu_causes": causes}


#: The per-rank GPU time ledger (per window; empty for a CPU trace) and its host idle by cause.
GPU_TABLE = RankTable("gpu", {c: (object if c in ("window", "top_idle_cause") else bool if c == "host_bound"
                                  else np.int64 if c in ("rank", "step", "set_aside_events", "flops_set_aside")
                  else np.float64) for c in LEDGER_COLUMNS},
                      ledger_tables, version=table_version(4))
GPU_CAUSES_TABLE = RankTable("gpu_causes", {c: (object if c in ("window", "cause")
                                                else np.int64 if c in ("rank", "step") else np.float64)
                                            for c in CAUSE_COLUMNS}, ledger_tables, version=table_version(4))


def _threads(ev: pd.DataFrame) -> np.ndarray:
    """One integer per (pid, tid) of each event: the key of its thread."""
    pid, _ = codes(ev["pid"])
    tid, tids = codes(ev["tid"])
    return pid * (len(tids) + 1) + tid


def _rank_ledger(ev: pd.DataFrame, rank: int, per_step: bool, rows: list[dict], causes: list[dict],
                 device: str = "") -> None:
    """Append the ledger rows and cause rows of one rank's events (see :func:`gpu_ledger`)."""
    dev = device_events(ev)  # one device: the one with most GPU events
    if not dev.any():  # a CPU trace: nothing more to look at
        return
    bad = dev & ~(ev["dur"].to_numpy(np.float64) >= 0)  # negative or missing: set aside
    bad_steps = ev["step"].to_numpy(np.int64)[bad]
    dev &= ~bad
    if not dev.any():
        return
    g = ev[dev]
    start = g["ts"].to_numpy(np.float64)
    end = start + g["dur"].to_numpy(np.float64)
    kind, kinds = codes(g["kind"])
    cls = np.asarray([_CLASS.get(str(k), "compute") for k in kinds] + ["compute"], dtype=object)[kind]
    threads = _threads(ev)
    launch_ts, launch_thread = _launches(ev, threads, g["corr"].to_numpy(np.int64))
    ops = _top_ops(ev, threads)
    flops = event_flops(g, device)
    dur = g["dur"].to_numpy(np.float64)
    windows = [("trace", TRACE_STEP, np.ones(len(g), bool))]
    if per_step:
        step = g["step"].to_numpy(np.int64)
        windows += [("step", int(k), step == k) for k in np.unique(step[step >= 0])]
    for window, k, sel in windows:
        row, by_cause = window_ledger(start[sel], end[sel], cls[sel], launch_ts[sel], launch_thread[sel], ops)
        set_aside = int(bad_steps.size if window == "trace" else (bad_steps == k).sum())
        rows.append({"rank": rank, "window": window, "step": k, **row, "set_aside_events": set_aside,
                     **window_flops(flops, sel, dur, cls)})
        causes += [{"rank": rank, "window": window, "step": k, "cause": c, "idle_ms": ms} for c, ms in by_cause]


def _launches(ev: pd.DataFrame, threads: np.ndarray, corr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start µs, thread key) of the launch call of each GPU event, by correlation id (the first
    launch of an id); NaN and -1 where the trace has none (queued before it began)."""
    host = (ev["stream"].to_numpy() < 0) & (ev["corr"].to_numpy() > 0) & ev["category"].isin(LAUNCH_CATS).to_numpy()
    keys = ev["corr"].to_numpy(np.int64)[host]
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    ts = ev["ts"].to_numpy(np.float64)[host][order]
    thread = threads[host][order]
    out_ts = np.full(corr.size, np.nan)
    out_th = np.full(corr.size, -1, dtype=np.int64)
    if keys.size:
        pos = np.clip(np.searchsorted(keys, corr), 0, keys.size - 1)
        found = (keys[pos] == corr) & (corr > 0)
        out_ts[found] = ts[pos[found]]
        out_th[found] = thread[pos[found]]
    return out_ts, out_th


def _top_ops(ev: pd.DataFrame, threads: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{thread key: (starts, ends, names)} of the outermost CPU ops of each host thread (those
    no earlier op of the thread contains; step markers left out: they cover everything)."""
    name, names = codes(ev["name"])
    is_step = np.asarray([bool(STEP_RE.match(str(n))) for n in names] + [False], dtype=bool)  # code -1: last
    ok = (ev["stream"].to_numpy() < 0) & ev["category"].isin(CAUSE_CATS).to_numpy() & ~is_step[name]
    if not ok.any():
        return {}
    ts, dur, th_all, name = ev["ts"].to_numpy(np.float64)[ok], ev["dur"].to_numpy(np.float64)[ok], threads[ok], name[ok]
    labels = np.asarray([str(n) for n in names] + [""], dtype=object)
    out = {}
    for th in np.unique(th_all):
        on = th_all == th
        s, e = ts[on], ts[on] + dur[on]
        order = np.lexsort((-e, s))  # by start, the longest first among equal starts
        s, e, n = s[order], e[order], name[on][order]
        reach = np.concatenate([[-np.inf], np.maximum.accumulate(e)[:-1]])
        top = s >= reach
        out[int(th)] = (s[top], e[top], labels[n[top]])
    return out


def _cause(ops: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]], thread: int, t: float) -> str:
    """The outermost CPU op on ``thread`` that covers time ``t`` (PYTHON where none does)."""
    if thread not in ops:
        return PYTHON
    s, e, n = ops[thread]
    i = int(np.searchsorted(s, t, side="right")) - 1
    return str(n[i]) if i >= 0 and t < e[i] else PYTHON


def window_ledger(start: np.ndarray, end: np.ndarray, cls: np.ndarray, launch_ts: np.ndarray,
                  launch_thread: np.ndarray, ops: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]
                  ) -> tuple[dict, list[tuple[str, float]]]:
    """(ledger values of LEDGER_COLUMNS after ``step``, [(cause, host idle ms)] largest first) of
    one window's GPU events: µs starts and ends, class ("compute", "comm", "memory"), launch start
    (NaN unknown) and launching thread of each, and the threads' outermost ops
    (:func:`_top_ops`)."""
    lo, hi = float(start.min()), float(end.max())
    span = hi - lo
    busy = union_length(start, end)
    comp = cls == "compute"
    compute = union_length(start[comp], end[comp])
    comm = cls == "comm"
    comm_len = union_length(start[comm], end[comm])
    mem = cls == "memory"
    exp_s, exp_e = subtract(start[comm], end[comm], start[comp], end[comp])
    # gaps of the union, each ended by the event that starts it again (earliest launch among ties)
    order = np.lexsort((launch_ts, start))
    s, e, lt, th = start[order], end[order], launch_ts[order], launch_thread[order]
    reach = np.maximum.accumulate(e)
    gap = np.flatnonzero(s[1:] > reach[:-1]) + 1
    g0, g1 = reach[gap - 1], s[gap]
    host = lt[gap] > g0  # NaN (launch not in the trace) compares False: device
    by_cause: dict[str, float] = {}
    for i in np.flatnonzero(host):
        c = _cause(ops, int(th[gap[i]]), g0[i])
        by_cause[c] = by_cause.get(c, 0.0) + (g1[i] - g0[i]) / 1e3
    idle = span - busy
    idle_host = float((g1[host] - g0[host]).sum())
    ranked = sorted(by_cause.items(), key=lambda kv: (-kv[1], kv[0]))
    pct = (lambda x: 100.0 * x / span) if span > 0 else (lambda x: float("nan"))
    row = {"span_ms": span / 1e3, "compute_ms": compute / 1e3, "non_compute_ms": (span - idle - compute) / 1e3,
           "comm_ms": comm_len / 1e3, "exposed_comm_ms": float((exp_e - exp_s).sum()) / 1e3,
           "memory_ms": union_length(start[mem], end[mem]) / 1e3, "idle_ms": idle / 1e3,
           "idle_host_ms": idle_host / 1e3, "idle_device_ms": (idle - idle_host) / 1e3,
           "idle_pct": pct(idle), "compute_pct": pct(compute), "non_compute_pct": pct(span - idle - compute),
           "host_bound": bool(span > 0 and idle_host > HOST_BOUND_SHARE * span),
           "top_idle_cause": ranked[0][0] if ranked else "", "top_idle_cause_ms": ranked[0][1] if ranked else 0.0}
    return row, ranked


#: summarize's GPU columns of a job.
JOB_GPU_COLUMNS = ["job_id", "gpu_idle_pct", "host_bound", "gpu_step_mfu_pct", "gemm_eff_pct", "flops_coverage_pct"]


def job_gpu(ledger: pd.DataFrame, tf32: bool = False) -> pd.DataFrame:
    """Per job of a ledger with job_id (:func:`gpu_ledger`'s rows of several jobs): the mean over
    its ranks of the ``trace`` window's idle % and host idle share; host_bound where that share is
    over half (for one rank: the ``gpu`` command's own flag); step MFU, GEMM efficiency and FLOPs
    coverage over its ranks' steps pooled (:func:`~dpcore.read.analysis.gpu_flops.rank_efficiency`;
    ``tf32``: the run allows TF32). Jobs without GPU events have no row."""
    t = ledger[ledger["step"] == TRACE_STEP]
    if t.empty:
        return pd.DataFrame(columns=JOB_GPU_COLUMNS)
    share = t["idle_host_ms"] / t["span_ms"].where(t["span_ms"] > 0)
    g = t.assign(host_share=share).groupby("job_id", sort=False)
    out = g.agg(gpu_idle_pct=("idle_pct", "mean"), host_share=("host_share", "mean")).reset_index()
    out["host_bound"] = (out["host_share"] > HOST_BOUND_SHARE).astype(bool)
    eff = rank_efficiency(ledger, tf32, by=("job_id",)).rename(columns={"step_mfu_pct": "gpu_step_mfu_pct"})
    out = out.merge(eff[["job_id", "gpu_step_mfu_pct", "gemm_eff_pct", "flops_coverage_pct"]], on="job_id",
                    how="left")
    return out[JOB_GPU_COLUMNS]
