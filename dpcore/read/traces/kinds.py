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
  is :func:`dpcore.read.analysis.comm_overlap.trace_sets`'s).
* GPU traces without NCCL (gloo over CUDA tensors): when no kernel is comm by the GPU rules, the
  ``gloo:<op>`` spans on the host's worker threads are, by the CPU rule (barriers and spans on the
  main thread: sync); kernels keep their GPU kinds, so compute is the compute kernels. The
  ``gpu_user_annotation`` copies of the spans on the device timeline stay other.

Phases: only dpcore's own ranges are read as phases here: the ``record_function`` annotations
``forward``/``backward``/``optimizer`` that ``write/training/trainer.py`` opens, which the
profiler writes as ``user_annotation`` events. A foreign op that happens to be called ``forward``
(a TorchScript module's ``forward`` is a ``cpu_op``) is an op like any other. Other frameworks'
phase names (``## backward ##``, ``Optimizer.step#Adagrad.step``, ...) are a separate, explicit
mapping, :data:`FOREIGN_PHASES`: the importer reads fwd/bwd/opt times from it; compute on the main
thread of a foreign trace is every op of the step (it has no dpcore phases to restrict it to).

Steps (one rule, :func:`classify`, for every command): an event on the host belongs to the
``ProfilerStep#N`` range it starts in (``gpu_user_annotation`` copies of the markers on the
device timeline are not steps); a kernel, memcpy or memset belongs to the step in which it was
LAUNCHED (its runtime launch event, linked by correlation id), and one whose launch is not in
the trace (queued before the profiler started) belongs to no traced step (-1). A trace without
any ``ProfilerStep#N`` marker is one step, number 0, covering the whole trace (and says so in
a note). Only a GPU trace with no launch linked to any kernel (no correlation ids at all) places
its kernels by their GPU time instead, with a note.

Older traces: kineto before torch 1.10 named the categories ``Kernel``, ``Runtime``,
``Operator``, ``Memcpy`` and ``Memset``; :func:`canonical_categories` renames them to today's
(:data:`LEGACY_CATEGORIES`) before anything is classified.
"""
from __future__ import annotations

import re

import numpy as np

from dpcore.contract.intervals import merge
from dpcore.contract.tracefile import DEVICE_CATS
from dpcore.read.traces.columns import Columns

KINDS = ("compute", "comm", "memcpy", "sync", "other")
#: A step marker's name (matched from its start): torch.profiler's ``ProfilerStep#N`` ranges.
STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
#: dpcore's own phase ranges (``record_function`` in write/training/trainer.py) and the category
#: the profiler writes them with; no other event is read as a dpcore phase.
DPCORE_PHASES = ("forward", "backward", "optimizer")
PHASE_CATEGORY = "user_annotation"
#: Other frameworks' names for the phases (torchrec/HTA ``## <phase> ##`` annotations, DDP's and
#: FSDP's forward ranges, torch.optim's ``Optimizer.step#<cls>.step``); backward also from the
#: span of the autograd engine's nodes (:data:`AUTOGRAD_NODE`). Read only by name, any category.
FOREIGN_PHASES: dict[str, re.Pattern[str]] = {
    "forward": re.compile(r"^(## forward ##|(DistributedDataParallel|FullyShardedDataParallel)\.forward)$"),
    "backward": re.compile(r"^## backward ##$"),
    "optimizer": re.compile(r"^(## optimizer ##|Optimizer\.step#.*\.step)$"),
}
AUTOGRAD_NODE = re.compile(r"^autograd::engine::evaluate_function: ")
#: kineto's category names before torch 1.10 -> today's.
LEGACY_CATEGORIES = {"Kernel": "kernel", "Runtime": "cuda_runtime", "Operator": "cpu_op",
                     "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
#: Step of every event of a trace without ProfilerStep markers: the whole trace is one step.
WHOLE_TRACE_STEP = 0
_CPU_WAIT_RE = re.compile(r"wait|synchronize", re.IGNORECASE)
_CPU_LAUNCH_RE = re.compile(r"^(c10d::|record_param_comms|nccl:)")
_NCCL_KERNEL = re.compile(r"^(void\s+)?nccl", re.IGNORECASE)
#: CPU ranges that the profiler opens around a collective call, whatever its kernel is named:
#: ``record_param_comms`` (carries the collective's name, sizes and group in its args),
#: ``nccl:<op>`` and the ``c10d::<op>_`` dispatcher ops.
_COMM_RANGE_RE = re.compile(r"^(record_param_comms$|nccl:|c10d::)")


def canonical_categories(cols: Columns) -> list[str]:
    """Rename legacy categories (LEGACY_CATEGORIES) in ``cols`` to today's names, in place;
    returns the legacy names found (empty for a current trace)."""
    cats = cols.tables["cat"]
    old = [c for c in cats if c in LEGACY_CATEGORIES]
    if not old:
        return []
    table: dict[str, int] = {}
    remap = np.asarray([table.setdefault(LEGACY_CATEGORIES.get(c, c), len(table)) for c in cats] + [0], np.int32)
    cols.codes["cat"] = remap.take(cols.codes["cat"])
    cols.tables["cat"] = list(table)
    return old


def classify(cols: Columns) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(kind code into KINDS, step number or -1, notes) of every event of one trace; the notes
    say where the trace needed a rule of the module docstring (no steps, unlaunched kernels, ...)."""
    notes = []
    legacy = canonical_categories(cols)
    if legacy:
        notes.append(f"legacy categories ({', '.join(legacy)}) read as "
                     f"{', '.join(LEGACY_CATEGORIES[c] for c in legacy)}")
    ts, dur, stream, corr = cols.ts, cols.dur, cols.stream, cols.corr
    names, cats = cols.tables["name"], cols.tables["cat"]
    name_c, cat_c = cols.codes["name"], cols.codes["cat"]
    host = (stream < 0) & ~np.asarray([c in DEVICE_CATS for c in cats] + [False], bool)[cat_c]
    step, marked = _steps(ts, dur, names, name_c, host)
    if not marked:
        notes.append(f"no ProfilerStep#N markers: the whole trace is one step (step {WHOLE_TRACE_STEP})")
    if any(c in ("kernel", "gpu_memcpy", "gpu_memset") for c in cats):  # a GPU trace
        kind = _pair_kinds(names, cats, name_c, cat_c)
        _comm_by_launch(kind, ts, dur, names, cats, name_c, cat_c, stream, corr, cols.codes["pid"],
                        cols.codes["tid"])
        unlaunched = _launch_steps(step, stream, corr)
        if unlaunched is None:
            notes.append("no kernel's launch is in the trace (no correlation ids): kernels are counted "
                         "in the step in which they ran on the GPU")
        else:
            unlaunched &= np.asarray([c in ("kernel", "gpu_memcpy", "gpu_memset") for c in cats] + [False],
                                     bool)[cat_c]
            if unlaunched.any():
                queued = int((unlaunched & (kind == KINDS.index("comm"))).sum())
                notes.append(f"{int(unlaunched.sum())} GPU event(s) ({queued} of them collectives) were "
                             "launched before the trace began (their launch is not in it): they count in no "
                             "traced step")
        if not (kind == KINDS.index("comm")).any():  # gloo over CUDA tensors: its spans are the comm
            thread = _thread_ids(cols.codes["pid"], cols.codes["tid"])
            _gloo_kinds(kind, names, name_c, host, thread == _main_thread(names, cats, name_c, cat_c, thread))
    else:
        kind = _cpu_kinds(ts, dur, names, cats, name_c, cat_c, cols.codes["tid"], cols.codes["pid"])
    return kind, step, notes


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


def _steps(ts: np.ndarray, dur: np.ndarray, names: list[str], name_codes: np.ndarray,
           host: np.ndarray) -> tuple[np.ndarray, bool]:
    """(ProfilerStep number of each event by its start time, -1 outside every step; whether the
    trace has markers). Markers are ``host`` events: a ``gpu_user_annotation`` copy on the
    device timeline (which has no stream id on ROCm) lies elsewhere in time. Without any marker,
    every event is in WHOLE_TRACE_STEP."""
    step_of_code = np.full(len(names) + 1, -1, dtype=np.int64)
    for i, n in enumerate(names):
        m = STEP_RE.match(n)
        if m:
            step_of_code[i] = int(m.group(1))
    marker = (step_of_code[name_codes] >= 0) & host
    if not marker.any():
        return np.full(ts.size, WHOLE_TRACE_STEP, dtype=np.int64), False
    out = np.full(ts.size, -1, dtype=np.int64)
    order = np.argsort(ts[marker], kind="stable")
    s_ts, s_end = ts[marker][order], (ts[marker] + dur[marker])[order]
    s_num = step_of_code[name_codes[marker]][order]
    idx = np.searchsorted(s_ts, ts, side="right") - 1
    ok = idx >= 0
    ok[ok] &= ts[ok] < s_end[idx[ok]]
    out[ok] = s_num[idx[ok]]
    return out, True


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


def _launch_steps(step: np.ndarray, stream: np.ndarray, corr: np.ndarray) -> np.ndarray | None:
    """Device events (stream >= 0) take the step of the host event that launched them (same
    correlation id; the first launch wins); those whose launch is not in the trace get -1.

    Returns which events are device events without a launch in the trace, or None when not one
    device event has a launch (no correlation ids at all): then ``step`` is left by GPU time,
    the only clue there is.
    """
    host = np.flatnonzero((stream < 0) & (corr > 0))
    dev = np.flatnonzero(stream >= 0)
    out = np.zeros(step.size, bool)
    if not dev.size:
        return out
    launched = np.full(dev.size, -2, np.int64)  # -2: no launch in the trace
    c = corr[dev]
    if host.size:
        top = int(corr.max())
        if top <= 4 * len(corr) + 1024:  # dense lookup by correlation id
            by_corr = np.full(top + 1, -2, np.int64)
            by_corr[corr[host][::-1]] = step[host][::-1]
            launched[c > 0] = by_corr[c[c > 0]]
        else:
            order = np.argsort(corr[host], kind="stable")
            keys, vals = corr[host][order], step[host][order]
            pos = np.clip(np.searchsorted(keys, c), 0, keys.size - 1)
            found = (keys[pos] == c) & (c > 0)
            launched[found] = vals[pos[found]]
    missing = launched == -2
    if missing.all():
        return None
    step[dev] = np.where(missing, -1, launched)
    out[dev[missing]] = True
    return out


def _thread_ids(pid_c: np.ndarray, tid_c: np.ndarray) -> np.ndarray:
    """One integer per (pid, tid) of every event."""
    return pid_c.astype(np.int64) * (int(tid_c.max(initial=0)) + 1) + tid_c


def _markers(names: list[str], cats: list[str], name_c: np.ndarray, cat_c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dpcore's phase ranges, every marker of the main thread: those phases, ``grad_sync`` and the
    ``ProfilerStep#N`` ranges) of every event."""
    phase_cat = np.asarray([c == PHASE_CATEGORY for c in cats] + [False], dtype=bool)[cat_c]
    phase_ev = np.asarray([n in DPCORE_PHASES for n in names], dtype=bool)[name_c] & phase_cat  # dpcore's only
    marker = np.asarray([n == "grad_sync" or bool(STEP_RE.match(n)) for n in names], dtype=bool)[name_c]
    return phase_ev, marker | phase_ev


def _main_thread(names: list[str], cats: list[str], name_c: np.ndarray, cat_c: np.ndarray,
                 thread: np.ndarray) -> int:
    """The thread that runs the training loop: the one with the phase / ProfilerStep ranges,
    else the busiest cpu_op thread (-1: none)."""
    marker = _markers(names, cats, name_c, cat_c)[1]
    op_cat = np.asarray([c == "cpu_op" for c in cats] + [False], dtype=bool)[cat_c]
    if marker.any():
        return int(np.bincount(thread[marker]).argmax())
    if op_cat.any():
        return int(np.bincount(thread[op_cat]).argmax())
    return -1


def _gloo_kinds(kind: np.ndarray, names: list[str], name_c: np.ndarray, host: np.ndarray,
                on_main: np.ndarray) -> None:
    """gloo's host spans, in place: a ``gloo:<op>`` span on a worker thread is comm (gloo at
    work); on the main thread, or a barrier anywhere, it is sync (waiting, moving no data).

    Why one rule for CPU and GPU traces: gloo runs every collective on its ``pt_gloo_runloop``
    threads whatever the tensors' device; with CUDA tensors the span also covers its copies to
    and from the host. Its ``gpu_user_annotation`` copies on the device timeline (``host`` is
    False there) are not counted: they mark the copies' streams, not gloo's work.
    """
    is_gloo = np.asarray([n.startswith("gloo:") for n in names] + [False], dtype=bool)[name_c] & host
    is_barrier = np.asarray(["barrier" in n for n in names] + [False], dtype=bool)[name_c]
    kind[is_gloo & ~on_main & ~is_barrier] = KINDS.index("comm")
    kind[is_gloo & (on_main | is_barrier)] = KINDS.index("sync")


def _cpu_kinds(ts: np.ndarray, dur: np.ndarray, names: list[str], cats: list[str], name_c: np.ndarray,
               cat_c: np.ndarray, tid_c: np.ndarray, pid_c: np.ndarray) -> np.ndarray:
    """Kinds for a CPU (gloo) trace; see the module docstring."""
    kind = np.full(ts.size, KINDS.index("other"), dtype=np.int8)
    is_gloo = np.asarray([n.startswith("gloo:") for n in names], dtype=bool)
    phase_ev = _markers(names, cats, name_c, cat_c)[0]
    hole = np.asarray([bool(_CPU_WAIT_RE.search(n)) for n in names], dtype=bool)
    launch = np.asarray([bool(_CPU_LAUNCH_RE.match(n)) for n in names], dtype=bool)
    thread = _thread_ids(pid_c, tid_c)
    on_main = thread == _main_thread(names, cats, name_c, cat_c, thread)
    op_cat = np.asarray([c == "cpu_op" for c in cats], dtype=bool)
    ops = on_main & op_cat[cat_c]
    ph = on_main & phase_ev
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
    _gloo_kinds(kind, names, name_c, np.ones(ts.size, dtype=bool), on_main)
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
