"""The one interface every DP variant implements (:class:`Wrapper`), plus helpers they share.

A wrapper is a drop-in replacement for ``DistributedDataParallel`` (Li et al., "PyTorch
Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020): an
``nn.Module`` whose only child is ``.module`` (so ``parameters()`` is the wrapped model's, in
its order), which makes all replicas start equal (broadcast from rank 0 at construction) and
leaves every rank holding the AVERAGE gradient after ``finish_gradient_synchronization()``.
``no_sync()`` follows DDP: the decision is taken at forward time, and gradients of
un-synchronised backwards accumulate locally until the next synchronised one.

Why one declared base: the trainer drives every variant (one-process ones, our multi-process
ones, PyTorch's DDP) with the same calls and never asks a wrapper what it can do; a variant
that forgets a call fails at construction (``abc``), not in the middle of a sweep.
"""
from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder

BROADCAST_CHUNK_BYTES = 64 * 1024 * 1024  # coalesce small tensors, bound the extra memory
LossFn = Callable[[Any, torch.Tensor], torch.Tensor]


class Wrapper(nn.Module, abc.ABC):
    """Everything a training loop may call on a DP variant, with the common defaults.

    Subclasses set ``module`` and implement :meth:`forward` and
    :meth:`finish_gradient_synchronization`; the rest defaults to "one model, one loss, no
    per-batch state". No ``__init__`` here, so PyTorch's ``DistributedDataParallel`` can be
    a subclass too (its constructor chains to ``nn.Module.__init__`` through this class).
    """

    name: ClassVar[str]                  # docs/DESIGN.md's variant name
    processes: ClassVar[int | str]       # 1 (one process, N replicas inside) or "N" (one per rank)
    #: True when the wrapper waits for its collectives inside ``loss.backward()`` (DDP's
    #: reducer), so the trainer must find the end of backward computation itself.
    grad_sync_in_backward: ClassVar[bool] = False
    module: nn.Module                    # the wrapped model (replica 0 for ``manual``)
    #: Why this wrapper cannot train on this machine (reported as a skipped job), else None.
    skip_reason: str | None = None
    #: The loss of :meth:`forward_loss` is a sum of this many mean losses (``manual``: N).
    loss_terms: int = 1
    #: DDP's flag, False inside :meth:`no_sync` (gradients then accumulate locally).
    require_backward_grad_sync: bool = True

    @abc.abstractmethod
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model on this process's inputs."""

    @abc.abstractmethod
    def finish_gradient_synchronization(self) -> None:
        """Leave the averaged gradient in every ``param.grad`` (call after backward)."""

    def on_train_batch_start(self) -> None:
        """Reset per-batch state before the next batch (hook variants clear their handles)."""

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards of forwards run inside accumulate gradients locally (no collectives)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward_loss(self, x: Any, y: torch.Tensor, loss_fn: LossFn) -> torch.Tensor:
        """The loss to call ``backward()`` on (a sum of :attr:`loss_terms` mean losses)."""
        return loss_fn(self(x), y)

    def optim_parameters(self) -> list[nn.Parameter]:
        """What the optimizer steps (every replica's parameters for ``manual``)."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def make_optimizer(self, optimizer_cls: type[torch.optim.Optimizer],
                       **kwargs: Any) -> torch.optim.Optimizer:
        """The optimizer the trainer steps: ``optimizer_cls(optim_parameters(), **kwargs)``.

        Why a method: a sharded variant (ZeRO-1, FSDP) owns how its optimizer is built (a
        shard of the state per rank), and the trainer must not need to know which one it has.
        """
        return optimizer_cls(self.optim_parameters(), **kwargs)

    def memory_tensors(self, optimizer: torch.optim.Optimizer | None = None
                       ) -> dict[str, list[torch.Tensor]]:
        """The tensors this rank holds, by kind: ``params``, ``grads``, ``optim`` (optimizer
        state), ``other`` (communication buffers, gathered copies). Sharded variants override
        it to report their shards; memory.csv counts each storage once."""
        params = [p for p in self.module.parameters()]
        grads = [p.grad for p in params if p.grad is not None]
        optim: list[torch.Tensor] = []
        if optimizer is not None:
            for state in optimizer.state.values():
                optim.extend(v for v in state.values() if isinstance(v, torch.Tensor))
        return {"params": params, "grads": grads, "optim": optim, "other": []}


class DPWrapper(Wrapper):
    """Base of the from-scratch multi-process variants: constructor, forward and sync gating.

    Subclasses implement :meth:`_sync` (called by ``finish_gradient_synchronization`` when the
    last forward ran with sync enabled) and may override :meth:`_prepare` (start of a
    synchronised forward) and :meth:`on_train_batch_start`.
    """

    processes = "N"  # docs/DESIGN.md: N processes, one per rank

    def __init__(self, module: nn.Module, *, group: Any = None,
                 recorder: Recorder = NULL_RECORDER, bucket_mb: float = 25.0) -> None:
        super().__init__()
        self.module = module
        self.group = group
        self.recorder = recorder
        self.bucket_mb = float(bucket_mb)
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        # parameters() de-duplicates, so a tied weight appears (and is reduced) once
        self.trainable: list[nn.Parameter] = [p for p in module.parameters() if p.requires_grad]
        self._sync_pending = False  # did the last forward run with sync enabled?
        if self.world_size > 1:
            broadcast_module(module, group, recorder)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_pending = self.require_backward_grad_sync
        if self._sync_pending:
            self._prepare()
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Leave the averaged gradient in every ``param.grad`` (call after backward)."""
        if self._sync_pending:
            with record_function("grad_sync_" + self.name):
                self._sync()
            self._sync_pending = False

    # -- for subclasses --------------------------------------------------------------------
    def _prepare(self) -> None:
        """Called at the start of every synchronised forward."""

    @abc.abstractmethod
    def _sync(self) -> None:
        """Average the gradients of the last synchronised backward across the group."""

    def _grads(self) -> list[torch.Tensor]:
        """Every trainable gradient; an unused parameter gets zeros so ranks stay in step."""
        for p in self.trainable:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return [p.grad for p in self.trainable]


def src_rank(group: Any) -> int:
    """Global rank of the group's rank 0 (``dist.broadcast`` takes global ranks)."""
    return 0 if group is None else dist.get_global_rank(group, 0)


def broadcast_module(module: nn.Module, group: Any = None,
                     recorder: Recorder = NULL_RECORDER, *, params: bool = True) -> None:
    """Make every rank's parameters (frozen too) and buffers equal to rank 0's (``params``
    False: the buffers only, for a wrapper whose own init sync skips them).

    Tensors are coalesced into flat chunks of at most 64 MiB per dtype/device, as DDP's
    ``_sync_module_states`` does, so a model of many small tensors costs a few collectives
    instead of hundreds, while a huge model never needs a second full copy.
    """
    tensors = ([p.data for p in module.parameters()] if params else []) + list(module.buffers())
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    src = src_rank(group)
    for ts in groups.values():
        chunk: list[torch.Tensor] = []
        size = 0
        for t in ts + [None]:
            if t is not None and (not chunk or size + t.numel() * t.element_size()
                                  <= BROADCAST_CHUNK_BYTES):
                chunk.append(t)
                size += t.numel() * t.element_size()
                continue
            if chunk:
                _broadcast_flat(chunk, src, group, recorder)
            chunk, size = ([t], t.numel() * t.element_size()) if t is not None else ([], 0)


def _broadcast_flat(chunk: list[torch.Tensor], src: int, group: Any, recorder: Recorder) -> None:
    flat = torch.cat([t.reshape(-1) for t in chunk])
    idx = recorder.launch("broadcast", "native", flat.numel() * flat.element_size())
    with record_function("broadcast_params"):
        dist.broadcast(flat, src=src, group=group)
    recorder.done(idx)
    off = 0
    with torch.no_grad():
        for t in chunk:
            n = t.numel()
            t.copy_(flat[off:off + n].view_as(t))
            off += n
