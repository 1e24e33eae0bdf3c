"""``torch_ddp``: PyTorch's ``DistributedDataParallel``, the production reference.

Same bucket cap as ``bucketed`` (``bucket_cap_mb=bucket_mb``). Buffers are broadcast once at
construction and not before every forward, as in every other variant here: none of our models
change buffers during training, and a per-forward broadcast would be a collective no variant
issues. torch 2.12+ says so with ``forward_sync_buffers=False`` (DDP still syncs buffers at
init); older torch has only ``broadcast_buffers=False``, which ALSO skips DDP's initial buffer
sync, so the ranks would keep their own BatchNorm statistics: there the buffers are broadcast
from rank 0 here, before DDP is built. With a recording recorder, a communication hook (Li
et al. 2020, section 3.3 / DDP comm hooks) launches each bucket's all-reduce itself, exactly as
the built-in ``allreduce_hook`` does (divide by N, async all-reduce, future), and records it,
so DDP's buckets appear in collectives.csv; with the null recorder DDP keeps its C++ default
path (``recorder.enabled`` decides, once, here). With ``comm_hook`` (``profile --comm-hook``)
DDP runs its own hook instead (fp16 or bf16 compression, PowerSGD) and a
:class:`~dpcore.write.capture.collective_tap.CollectiveTap` logs the collectives that hook
launches, with the bytes it really sends, and a
:class:`~dpcore.write.capture.collective_tap.HookClock` times the hook's own compute per step
(compressing in its call, decompressing in the callbacks it chains) apart from those
collectives; where the backend refuses the hook the job is skipped with the reason.
"""
# no `from __future__ import annotations`: DDP checks the comm hook's annotations at runtime

import inspect
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from dpcore.write.capture.collective_tap import COMPRESS, CollectiveTap, HookClock, real_future
from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.variants.base import Wrapper, broadcast_module

# newer torch renamed the switch (and still syncs buffers at init, which we want); the old
# one skips the init sync too, so with it the buffers are broadcast before DDP is built
_NO_FORWARD_BUFFER_SYNC = ({"forward_sync_buffers": False}
                           if "forward_sync_buffers" in inspect.signature(
                               DistributedDataParallel.__init__).parameters
                           else {"broadcast_buffers": False})


def _sync_buffers_first(kwargs: dict[str, bool]) -> bool:
    """Does DDP built with ``kwargs`` skip its initial buffer sync (the old switch)?"""
    return "broadcast_buffers" in kwargs and not kwargs["broadcast_buffers"]


class TorchDDP(DistributedDataParallel, Wrapper):
    """DDP itself; :class:`Wrapper` adds the no-op dpcore calls (DDP's own ``forward``,
    ``no_sync`` and ``module`` come first in the MRO)."""

    name = "torch_ddp"
    processes = "N"
    grad_sync_in_backward = True  # the reducer waits for its buckets inside loss.backward()

    def __init__(self, module: nn.Module, *, group: Any = None,
                 recorder: Recorder = NULL_RECORDER, bucket_mb: float = 25.0,
                 comm_hook: str = "none", powersgd_rank: int = 1) -> None:
        dev = next(module.parameters()).device
        if _sync_buffers_first(_NO_FORWARD_BUFFER_SYNC):
            broadcast_module(module, group, params=False)
        super().__init__(module, device_ids=[dev] if dev.type == "cuda" else None,
                         process_group=group, bucket_cap_mb=bucket_mb, **_NO_FORWARD_BUFFER_SYNC)
        self._hook_state: _HookState | None = None
        self.comm_hook = comm_hook
        self.hook_state: Any = None  # PowerSGD's state (its error feedback and warm-start memory)
        #: the compressing hook's compute per step (None: no hook of DDP's own, or not recording)
        self.hook_clock: HookClock | None = None
        if comm_hook != "none":
            nbytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
            self.skip_reason = _hook_refused(comm_hook, group) or _several_powersgd_buckets(
                comm_hook, group, nbytes, bucket_mb)
            if self.skip_reason is None:
                if comm_hook == "powersgd" and dev.type == "cpu":
                    cuda_sync_tolerates_cpu()
                self.hook_state, fn = _ddp_hook(comm_hook, group, powersgd_rank)
                if recorder.enabled:  # DDP's hook launches its collectives: log and time each one
                    recorder.time_on(dev)  # set before the clock reads it
                    self.hook_clock = HookClock(lambda: recorder.step, events=recorder.clock)
                    self._tap = CollectiveTap(group, lambda: recorder, lambda: True,
                                              clock=self.hook_clock).install()
                self._hook_state = _HookState(group, recorder, inner=(self.hook_state, fn),
                                              clock=self.hook_clock)
                self.register_comm_hook(self._hook_state, _composed_hook)
        elif recorder.enabled:
            self._hook_state = _HookState(group, recorder)
            self.register_comm_hook(self._hook_state, _recorded_allreduce_hook)

    def finish_gradient_synchronization(self) -> None:
        """No-op: DDP waits for its buckets at the end of backward."""

    def memory_tensors(self, optimizer: torch.optim.Optimizer | None = None
                       ) -> dict[str, list[torch.Tensor]]:
        """As every variant, plus the reducer's bucket buffers seen by the comm hook: DDP keeps
        them between steps (P bytes beside the gradients unless ``gradient_as_bucket_view``),
        and without them memory.csv would under-report DDP by a whole model."""
        held = super().memory_tensors(optimizer)
        if self._hook_state is not None:
            held["other"] = held["other"] + list(self._hook_state.buffers.values())
        st = self.hook_state  # PowerSGD keeps error feedback and P/Q between steps
        for attr in ("error_dict", "p_memory_dict", "q_memory_dict"):
            held["other"] = held["other"] + list(getattr(st, attr, {}).values())
        return held


#: Where DDP's own hooks refuse a backend (measured, torch 2.13 on gloo: the bf16 hook raises
#: "TypeError: BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ or XPU and
#: XCCL" at its first bucket, so the job is skipped with the reason instead of failing).
_REFUSED = {("bf16", "gloo"): "bf16_compress_hook does not run on gloo (torch: it needs CUDA 11+ and "
                              "NCCL 2.10+, or XPU and XCCL)"}
#: PowerSGD compresses from this step on (it all-reduces plainly before; the lowest value its
#: error feedback allows): profile's warm-up steps (--warmup >= 2) cover the plain ones.
POWERSGD_START = 2


def cuda_sync_tolerates_cpu() -> None:
    """Let ``torch.cuda.synchronize(<cpu device>)`` return instead of raising, in this process.

    PyTorch's PowerSGD hook synchronizes the bucket's device whenever CUDA is available
    (``if torch.cuda.is_available(): torch.cuda.synchronize(device)``), also when that device
    is the CPU, which raises "Expected a cuda device, but got: cpu": every CPU job with
    PowerSGD fails on a host with a GPU. Waiting for a CPU tensor is a no-op (its ops already
    ran), so a CPU device returns at once; every other call goes to torch's own function.
    Installed once per process, only by a CPU PowerSGD job (each rank is its own process)."""
    sync = torch.cuda.synchronize
    if getattr(sync, "_dpcore_cpu_ok", False):
        return

    def synchronize(device: Any = None) -> None:
        if isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu":
            return
        sync(device)

    synchronize._dpcore_cpu_ok = True  # type: ignore[attr-defined]
    torch.cuda.synchronize = synchronize


def _hook_refused(hook: str, group: Any) -> str | None:
    return _REFUSED.get((hook, str(dist.get_backend(group))))


def _several_powersgd_buckets(hook: str, group: Any, nbytes: int, bucket_mb: float) -> str | None:
    """PowerSGD launches each bucket's second all-reduce from a future's callback; on gloo, with
    several buckets, the ranks can launch them in different orders and hang in the hook (seen
    with torch 2.13). Such a job is skipped with the reason instead of running into --timeout."""
    if hook != "powersgd" or str(dist.get_backend(group)) != "gloo" or nbytes <= bucket_mb * 2**20:
        return None
    return (f"PowerSGD on gloo with several DDP buckets ({nbytes / 2**20:.1f} MiB of gradients in "
            f"{bucket_mb:g} MiB buckets) can hang both ranks (each bucket's all-reduce is launched from a "
            f"future's callback, in an order the ranks need not share); give --bucket-mb >= "
            f"{nbytes / 2**20:.1f}")


def _ddp_hook(hook: str, group: Any, powersgd_rank: int) -> tuple[Any, Any]:
    """(state, hook function) of DDP's own hook ``hook`` (contract.config.COMM_HOOKS)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    if hook == "fp16":
        return group, default_hooks.fp16_compress_hook
    if hook == "bf16":
        return group, default_hooks.bf16_compress_hook
    state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=powersgd_rank,
                               start_powerSGD_iter=POWERSGD_START, random_seed=0)
    return state, psgd.powerSGD_hook


class _HookState:
    __slots__ = ("group", "recorder", "world_size", "buffers", "inner", "clock")

    def __init__(self, group: Any, recorder: Recorder, inner: tuple[Any, Any] | None = None,
                 clock: HookClock | None = None) -> None:
        self.group = group
        self.recorder = recorder
        #: DDP's own hook this one composes with: (its state, its function)
        self.inner = inner
        #: times the inner hook's compute (its call; its callbacks through the tap)
        self.clock = clock
        self.world_size = dist.get_world_size(group)
        #: bucket index -> the reducer's flat bucket tensor (the reducer keeps it alive anyway;
        #: held here only so memory.csv can count it)
        self.buffers: dict[int, torch.Tensor] = {}


def _recorded_allreduce_hook(state: _HookState, bucket: dist.GradBucket
                             ) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP bucket with an async all-reduce and log it in the Recorder.

    One Python callback on the backend's thread (DDP needs one to unwrap the result): it also
    stamps the end. Each extra one costs a GIL hand-off there, which keeps the backend's thread
    (and its trace span) busy after the all-reduce is over while the main thread computes.

    On NCCL the future is completed at enqueue, so the callback runs at once, on the launching
    thread: a host clock there would read the launch time. With the recorder's event clock (a
    CUDA job) the end is an event recorded in the callback, on the stream a CUDA future runs its
    callbacks on, which waits for the all-reduce: it completes when the all-reduce did."""
    buf = bucket.buffer()
    i = bucket.index()
    state.buffers[i] = buf
    rec = state.recorder
    with record_function(f"bucket{i}"):
        buf.div_(state.world_size)
        idx = rec.launch("all_reduce", "native", buf.numel() * buf.element_size(), i)
        fut = dist.all_reduce(buf, group=state.group, async_op=True).get_future()
        rec.returned(idx)

    def finished(f: torch.futures.Future) -> torch.Tensor:
        rec.finished(idx)
        return f.value()[0]

    return fut.then(finished)


def _composed_hook(state: _HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's own hook (``state.inner``), unchanged, composed the way DDP's hook wrappers compose:
    this one only keeps the reducer's bucket tensor for memory.csv (as the default path does),
    so a compressed job's memory counts the same buckets as the uncompressed one, and times the
    hook's call as compressing (its collectives' time taken out by the tap)."""
    state.buffers[bucket.index()] = bucket.buffer()
    inner_state, fn = state.inner
    if state.clock is None:
        return fn(inner_state, bucket)
    with state.clock.timed(COMPRESS):
        return real_future(fn(inner_state, bucket))
