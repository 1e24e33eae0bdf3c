"""``overlap``: async all-reduce per parameter, launched from post-accumulate-grad hooks.

Why: backward produces gradients last layer first, so communication of the late layers can
run while autograd still computes the early ones (Li et al. 2020, section 3.2.3 "Overlap
Computation with Communication"). ``register_post_accumulate_grad_hook`` fires once per
parameter per backward, after the gradient (summed over every use, so a tied weight fires
once) is in ``param.grad``. Per-parameter collectives still pay the launch latency each,
which ``bucketed`` amortises.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from dpcore.write.dp.variants.base import DPWrapper


class OverlapDP(DPWrapper):
    name = "overlap"

    def __init__(self, module: nn.Module, **kw: Any) -> None:
        super().__init__(module, **kw)
        self._index = {id(p): i for i, p in enumerate(self.trainable)}
        self._handles: list[tuple[Any, torch.Tensor]] = []
        self._launched: set[int] = set()
        for p in self.trainable:
            p.register_post_accumulate_grad_hook(self._hook)

    def _prepare(self) -> None:
        self._handles = []
        self._launched = set()

    def on_train_batch_start(self) -> None:
        self._prepare()

    def _hook(self, p: nn.Parameter) -> None:
        if not self._sync_pending:
            return  # inside no_sync: the gradient just accumulates locally
        self._launch(self._index[id(p)], p.grad)

    def _launch(self, i: int, grad: torch.Tensor) -> None:
        rec = self.recorder
        with record_function(f"allreduce_param{i}"):
            idx = rec.launch("all_reduce", "native", grad.numel() * grad.element_size())
            work = rec.track(idx, dist.all_reduce(grad, group=self.group, async_op=True))
        self._handles.append((work, grad))
        self._launched.add(i)

    def _sync(self) -> None:
        grads = self._grads()
        for i, g in enumerate(grads):  # parameters unused in this forward: reduce zeros
            if i not in self._launched:
                self._launch(i, g)
        for work, grad in self._handles:
            work.wait()
            grad.div_(self.world_size)
        self._prepare()
