"""What each event of a torch.profiler trace counts as, and which ProfilerStep it belongs to.

Classification (what the overlap numbers count):

* GPU traces (NCCL): comm = kernels whose name starts with ``nccl`` (``ncclKernel_*``,
  ``ncclDevKernel_*``) AND kernels launched from inside the profiler's collective ranges
  (``record_param_comms``, ``nccl:*``, ``c10d::*``; matched by correlation id), so a future
  kernel rename cannot hide communication; memcpy = Memcpy/Memset kernels and
  gpu_memcpy/gpu_memset events; sync = ``*Sync*`` kernels and cuda*Synchronize runtime calls;
  compute = every other kernel. On today's kernel names this is Holistic Trace Analysis'
  kernel typing, so our overlap % matches HTA's.
* CPU traces (gloo), checked against real torch 2.x traces: gloo runs each collective as a
  ``gloo:<op>`` span on a ``pt_gloo_runloop`` worker thread -> comm (``gloo:barrier`` -> sync:
  it moves no data, and dpcore aligns step starts with one). The main thread (the one
  carrying ``forward``/``backward``/``optimizer``/``ProfilerStep#N`` ranges) runs the operators;
  those inside forward/backward/optimizer are compute. ``grad_sync`` is the main thread waiting
  for gradients and ``*wait*`` ops are the main thread waiting: kind sync, and they are cut out
  of compute. Collective launches (``c10d::*``, ``record_param_comms``) are kind other (what the
  analysis counts as compute on dpcore's own traces, its phases minus its ``comm_call#`` ranges,
  is :func:`dpcore.read.analysis.comm_overlap._trace_sets`'s).
"""
from __future__ import annotations

import re

import numpy as np

from dpcore.contract.intervals import merge
from dpcore.read.traces.columns import Columns

KINDS = ("compute", "comm", "memcpy", "sync", "other")
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_PHASES = ("forward", "backward", "optimizer")
_CPU_WAIT_RE = re.compile(r"wait|synchronize", re.IGNORECASE)
_CPU_LAUNCH_RE = re.compile(r"^(c10d::|record_param_comms|nccl:)")
_NCCL_KERNEL = re.compile(r"^(void\s+)?nccl", re.IGNORECASE)
#: CPU ranges that the profiler opens around a collective call, whatever its kernel is named:
#: ``record_param_comms`` (carries the collective's name, sizes and group in its args),
#: ``nccl:<op>`` and the ``c10d::<op>_`` dispatcher ops.
_COMM_RANGE_RE = re.compile(r"^(record_param_comms$|nccl:|c10d::)")


def classify(cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """(kind code into KINDS, ProfilerStep number or -1) of every event of one trace."""
    ts, dur, stream, corr = cols.ts, cols.dur, cols.stream, cols.corr
    names, cats = cols.tables["name"], cols.tables["cat"]
    name_c, cat_c = cols.codes["name"], cols.codes["cat"]
    if any(c in ("kernel", "gpu_memcpy", "gpu_memset") for c in cats):  # a GPU trace
        kind = _pair_kinds(names, cats, name_c, cat_c)
        _comm_by_launch(kind, ts, dur, names, cats, name_c, cat_c, stream, corr, cols.codes["pid"],
                        cols.codes["tid"])
        step = _steps(ts, dur, names, name_c)
        _launch_steps(step, stream, corr)
    else:
        kind = _cpu_kinds(ts, dur, names, cats, name_c, cat_c, cols.codes["tid"], cols.codes["pid"])
        step = _steps(ts, dur, names, name_c)
    return kind, step


def _gpu_kind(name: str, cat: str) -> str:
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy"
    if cat in ("kernel", "cuda_driver_kernel"):
        if _NCCL_KERNEL.match(name):  # ncclKernel_* (NCCL < 2.19), ncclDevKernel_* (later)
            return "comm"
        if name.startswith(("Memcpy", "Memset", "dma")) or "Memcpy" in name:
            return "memcpy"
        if "Sync" in name:
            return "sync"
        return "compute"
    if cat in ("cuda_runtime", "cuda_driver") and "Synchronize" in name:
        return "sync"
    return "other"


def _steps(ts: np.ndarray, dur: np.ndarray, names: list[str], name_codes: np.ndarray) -> np.ndarray:
    """ProfilerStep number of each event by time (CPU events), -1 outside every step."""
    step_of_code = np.full(len(names) + 1, -1, dtype=np.int64)
    for i, n in enumerate(names):
        m = _STEP_RE.match(n)
        if m:
            step_of_code[i] = int(m.group(1))
    marker = step_of_code[name_codes] >= 0
    out = np.full(ts.size, -1, dtype=np.int64)
    if not marker.any():
        return out
    order = np.argsort(ts[marker], kind="stable")
    s_ts, s_end = ts[marker][order], (ts[marker] + dur[marker])[order]
    s_num = step_of_code[name_codes[marker]][order]
    idx = np.searchsorted(s_ts, ts, side="right") - 1
    ok = idx >= 0
    ok[ok] &= ts[ok] < s_end[idx[ok]]
    out[ok] = s_num[idx[ok]]
    return out


def _pair_kinds(names: list[str], cats: list[str], name_c: np.ndarray, cat_c: np.ndarray) -> np.ndarray:
    """GPU kind code of each event, classified once per distinct (name, category) pair."""
    pair = name_c.astype(np.int64) * max(1, len(cats)) + cat_c
    if len(names) * max(1, len(cats)) <= 4 * len(pair) + 1024:  # dense table: no sort
        present = np.flatnonzero(np.bincount(pair, minlength=len(names) * max(1, len(cats))))
        lut = np.zeros(len(names) * max(1, len(cats)), np.int8)
        lut[present] = [KINDS.index(_gpu_kind(names[u // len(cats)], cats[u % len(cats)])) for u in present]
        return lut[pair]
    uniq, inv = np.unique(pair, return_inverse=True)
    kinds = [KINDS.index(_gpu_kind(names[u // len(cats)], cats[u % len(cats)])) for u in uniq]
    return np.asarray(kinds, dtype=np.int8)[inv]


def _comm_by_launch(kind: np.ndarray, ts: np.ndarray, dur: np.ndarray, names: list[str], cats: list[str],
                    name_c: np.ndarray, cat_c: np.ndarray, stream: np.ndarray, corr: np.ndarray,
                    pid_c: np.ndarray, tid_c: np.ndarray) -> None:
    """Kernels launched from inside a collective's CPU range are comm, whatever they are called.

    Why: classifying by kernel name alone broke Holistic Trace Analysis twice when NCCL renamed
    its kernels (``ncclKernel_*`` -> ``ncclDevKernel_*``). The profiler's own collective
    metadata does not depend on names: torch wraps every collective call in a
    ``record_param_comms`` range (and ``nccl:*`` / ``c10d::*`` ops), and the launch of each
    kernel (a ``cudaLaunchKernel`` runtime event) shares a correlation id with the kernel.
    So a kernel whose launch lies inside such a range on the same thread is communication.
    """
    range_code = np.asarray([bool(_COMM_RANGE_RE.match(n)) for n in names] + [False], dtype=bool)
    host = (stream < 0) & range_code[name_c]
    if not host.any():
        return
    runtime = np.asarray([c in ("cuda_runtime", "cuda_driver") for c in cats] + [False], dtype=bool)
    launch = (stream < 0) & (corr > 0) & runtime[cat_c]
    thread = pid_c.astype(np.int64) * (int(tid_c.max(initial=0)) + 1) + tid_c
    inside = np.zeros(ts.size, dtype=bool)
    for th in np.unique(thread[host]):
        h = host & (thread == th)
        starts, ends = merge(ts[h], ts[h] + dur[h])
        cand = np.flatnonzero(launch & (thread == th))
        idx = np.searchsorted(starts, ts[cand], side="right") - 1
        ok = idx >= 0
        ok[ok] &= ts[cand][ok] < ends[idx[ok]]
        inside[cand[ok]] = True
    comm_corr = np.unique(corr[inside])
    if not comm_corr.size:
        return
    kernel = np.asarray([c in ("kernel", "cuda_driver_kernel") for c in cats] + [False], dtype=bool)
    dev = (stream >= 0) & kernel[cat_c] & np.isin(corr, comm_corr)
    kind[dev & (kind == KINDS.index("compute"))] = KINDS.index("comm")


def _launch_steps(step: np.ndarray, stream: np.ndarray, corr: np.ndarray) -> None:
    """Kernels (stream >= 0) take the step of the CPU op that launched them (same correlation)."""
    host = np.flatnonzero((stream < 0) & (corr > 0) & (step >= 0))
    dev = np.flatnonzero((stream >= 0) & (corr > 0))
    if not host.size or not dev.size:
        return
    top = int(corr.max())
    if top <= 4 * len(corr) + 1024:  # dense lookup by correlation id; the first launch wins
        by_corr = np.full(top + 1, -1, np.int64)
        by_corr[corr[host][::-1]] = step[host][::-1]
        found = by_corr[corr[dev]]
        step[dev[found >= 0]] = found[found >= 0]
        return
    order = np.argsort(corr[host], kind="stable")
    keys, vals = corr[host][order], step[host][order]
    pos = np.clip(np.searchsorted(keys, corr[dev]), 0, keys.size - 1)
    found = keys[pos] == corr[dev]
    step[dev[found]] = vals[pos[found]]


def _cpu_kinds(ts: np.ndarray, dur: np.ndarray, names: list[str], cats: list[str], name_c: np.ndarray,
               cat_c: np.ndarray, tid_c: np.ndarray, pid_c: np.ndarray) -> np.ndarray:
    """Kinds for a CPU (gloo) trace; see the module docstring."""
    kind = np.full(ts.size, KINDS.index("other"), dtype=np.int8)
    is_gloo = np.asarray([n.startswith("gloo:") for n in names], dtype=bool)
    phase_code = np.asarray([n in _PHASES for n in names], dtype=bool)
    hole = np.asarray([bool(_CPU_WAIT_RE.search(n)) for n in names], dtype=bool)
    launch = np.asarray([bool(_CPU_LAUNCH_RE.match(n)) for n in names], dtype=bool)
    marker = np.asarray([n in _PHASES or n == "grad_sync" or bool(_STEP_RE.match(n)) for n in names], dtype=bool)
    thread = pid_c.astype(np.int64) * (int(tid_c.max(initial=0)) + 1) + tid_c
    # main thread: the one with the phase / ProfilerStep ranges, else the busiest cpu_op thread
    op_cat = np.asarray([c == "cpu_op" for c in cats], dtype=bool)
    if marker[name_c].any():
        main = np.bincount(thread[marker[name_c]]).argmax()
    elif op_cat[cat_c].any():
        main = np.bincount(thread[op_cat[cat_c]]).argmax()
    else:
        main = -1
    on_main = thread == main
    # barriers move no data: dpcore aligns step starts with one, and a user's barrier is waiting
    is_barrier = np.asarray(["barrier" in n for n in names], dtype=bool)[name_c]
    kind[is_gloo[name_c] & ~on_main & ~is_barrier] = KINDS.index("comm")
    ops = on_main & op_cat[cat_c]
    ph = on_main & phase_code[name_c]
    if ph.any():
        order = np.argsort(ts[ph])
        p_s, p_e = ts[ph][order], (ts[ph] + dur[ph])[order]
        p_e = np.maximum.accumulate(p_e)
        idx = np.searchsorted(p_s, ts, side="right") - 1
        inside = idx >= 0
        inside[inside] &= ts[inside] < p_e[idx[inside]]
        ops &= inside
    kind[ops & ~launch[name_c]] = KINDS.index("compute")
    kind[on_main & hole[name_c] & ~is_gloo[name_c]] = KINDS.index("sync")
    kind[on_main & (np.asarray([n == "grad_sync" for n in names], dtype=bool)[name_c])] = KINDS.index("sync")
    kind[is_gloo[name_c] & (on_main | is_barrier)] = KINDS.index("sync")
    return kind


#: Collective families of a comm span or collective name, in match order (a name is normalised by
#: lower-casing and dropping ``_``, ``-`` and spaces: ``gloo:allgather``, ``fsdp_all_gather``,
#: ``ncclDevKernel_AllGather_RING_LL``, ``all_gather_into_tensor`` and collectives.csv's
#: ``all_gather #3`` are all ``all_gather``).
COMM_OPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reduce_scatter", ("reducescatter",)),
    ("all_gather", ("allgather",)),
    ("all_reduce", ("allreduce",)),
    ("broadcast", ("broadcast",)),
    ("send_recv", ("send", "recv")),
)


def comm_op(name: str) -> str:
    """The collective family of a comm span's name: ``reduce_scatter``, ``all_gather``,
    ``all_reduce``, ``broadcast``, ``send_recv`` or ``other``.

    Why by name: a trace says which collective a span is only in its name (gloo's ``gloo:<op>``,
    NCCL's kernel names, dpcore's own ``record_function`` ranges), and collectives.csv rows are
    drawn with their ``op``; the Timeline colours each family on its own."""
    norm = str(name).lower().replace("_", "").replace("-", "").replace(" ", "")
    for op, keys in COMM_OPS:
        if any(k in norm for k in keys):
            return op
    return "other"
