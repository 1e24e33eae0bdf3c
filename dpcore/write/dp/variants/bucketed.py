"""``bucketed``: overlap, with gradients grouped into buckets of ``bucket_mb`` (DDP's design).

Li et al. 2020 (section 3.2.2, "Gradient Bucketing") show that all-reduce of small tensors
is latency bound, so DDP packs gradients into ~25 MB buckets in REVERSE registration order
(roughly the order backward produces them) and launches a bucket's async all-reduce as soon
as its last gradient is ready, overlapping communication with the rest of backward.

Speed: bucket buffers are preallocated once, and after a synchronised backward every
``param.grad`` is a view into its bucket (like DDP's ``gradient_as_bucket_view=True``), so
there is no copy back. With ``zero_grad(set_to_none=True)`` autograd hands each new gradient
over without a copy and the hook writes it into the bucket already divided by N (one fused
pass); DDP's default path copies in, divides, and copies out. If gradients were kept (zeroed
in place, or accumulated), autograd adds straight into the bucket view and the hook only
divides. Measured with ``python -m benchmarks.bench_bucketed``.
Buckets launch strictly in index order (as DDP's reducer does) so every rank issues the same
collective sequence even if gradients become ready in a different order.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from dpcore.contract.buckets import MB, assign_buckets  # noqa: F401  (re-exported)
from dpcore.write.dp.variants.base import DPWrapper


class _Bucket:
    __slots__ = ("index", "params", "views", "buffer", "pending", "ready", "work", "staged")

    def __init__(self, index: int, params: list[nn.Parameter]) -> None:
        self.index = index
        self.params = params
        p0 = params[0]
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=p0.dtype,
                                  device=p0.device)
        self.views: list[torch.Tensor] = []
        off = 0
        for p in params:
            view = self.buffer[off:off + p.numel()].view_as(p)
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view
            self.views.append(view)
            off += p.numel()
        self.pending = len(params)
        self.staged = [False] * len(params)
        self.ready = False
        self.work: Any = None


class BucketedDP(DPWrapper):
    name = "bucketed"

    def __init__(self, module: nn.Module, **kw: Any) -> None:
        super().__init__(module, **kw)
        order = list(reversed(self.trainable))
        plan = assign_buckets([p.numel() * p.element_size() for p in order],
                              self.bucket_mb * MB, [(p.dtype, p.device) for p in order])
        self.buckets = [_Bucket(k, [order[i] for i in idxs]) for k, idxs in enumerate(plan)]
        self._next = 0
        for b in self.buckets:
            for k, (p, view) in enumerate(zip(b.params, b.views)):
                p.register_post_accumulate_grad_hook(self._make_hook(b, k, view))

    def _make_hook(self, bucket: _Bucket, k: int, view: torch.Tensor
                   ) -> Callable[[nn.Parameter], None]:
        def hook(p: nn.Parameter) -> None:
            if not self._sync_pending:
                return  # no_sync: the gradient accumulates locally, no collective
            self._stage(p, view)
            bucket.staged[k] = True
            bucket.pending -= 1
            if bucket.pending == 0:
                bucket.ready = True
                self._launch_ready()
        return hook

    def _stage(self, p: nn.Parameter, view: torch.Tensor) -> None:
        """Put p's gradient, pre-divided by N, into its bucket slot and make p.grad that slot.

        Fusing the copy with the division (as DDP's default hook divides before its
        all-reduce) costs one pass over the gradient; a gradient unused in this backward
        contributes zeros so that every rank reduces the same buckets.
        """
        g = p.grad
        if g is None:
            view.zero_()
        elif g.data_ptr() != view.data_ptr():
            torch.div(g, self.world_size, out=view)
        else:  # accumulated in place (grads were not set to None since the last sync)
            view.div_(self.world_size)
        if g is None or g.data_ptr() != view.data_ptr():
            p.grad = view

    def _launch_ready(self) -> None:
        buckets = self.buckets
        while self._next < len(buckets) and buckets[self._next].ready:
            self._launch(buckets[self._next])
            self._next += 1

    def _launch(self, b: _Bucket) -> None:
        rec = self.recorder
        with record_function(f"bucket{b.index}"):
            idx = rec.launch("all_reduce", "native", b.buffer.numel() * b.buffer.element_size(),
                             b.index)
            b.work = rec.track(idx, dist.all_reduce(b.buffer, group=self.group, async_op=True))

    def _prepare(self) -> None:
        for b in self.buckets:
            b.pending = len(b.params)
            b.staged = [False] * len(b.params)
            b.ready = False
            b.work = None
        self._next = 0

    def on_train_batch_start(self) -> None:
        self._prepare()

    def memory_tensors(self, optimizer: torch.optim.Optimizer | None = None
                       ) -> dict[str, list[torch.Tensor]]:
        """As every variant, plus the bucket buffers: they outlive ``zero_grad(set_to_none)``,
        so without them memory.csv would miss P bytes that DDP-style bucketing really holds."""
        held = super().memory_tensors(optimizer)
        held["other"] = held["other"] + [b.buffer for b in self.buckets]
        return held

    def _sync(self) -> None:
        for b in self.buckets:  # buckets holding parameters that got no gradient
            if not b.ready:
                for p, view, done in zip(b.params, b.views, b.staged):
                    if not done:
                        self._stage(p, view)
                b.ready = True
        self._launch_ready()
        for b in self.buckets:
            with record_function(f"wait_bucket{b.index}"):
                b.work.wait()
        self._prepare()
