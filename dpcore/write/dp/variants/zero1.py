"""``zero1``: ``bucketed``'s overlapped gradient all-reduce plus a ZeRO-1 sharded optimizer.

ZeRO stage 1 (Rajbhandari et al., SC 2020): each rank keeps optimizer state only for its share
of the parameters, steps that share, and the updated parameters are broadcast back (see
:mod:`dpcore.write.dp.zero_optimizer` for the layout: whole parameters, balanced by element count).
Gradients are averaged exactly as in ``bucketed`` (this class IS a ``BucketedDP``), so the
backward overlap and the numbers stay comparable; only :meth:`make_optimizer` differs.

Volume per step for P parameter bytes: the gradient all-reduce 2(N-1)/N P (as DDP) plus the
parameter broadcasts, (N-1)/N P received per rank. ZeRO's paper reduce-scatters gradients
instead of all-reducing them (total 2(N-1)/N P); ``torch_zero1`` (DDP +
``ZeroRedundancyOptimizer``) moves the same volume as this variant.
"""
from __future__ import annotations

from typing import Any

import torch

from dpcore.write.dp.variants.bucketed import BucketedDP
from dpcore.write.dp.zero_optimizer import ShardedOptimizer


class Zero1DP(BucketedDP):
    name = "zero1"

    def make_optimizer(self, optimizer_cls: type[torch.optim.Optimizer],
                       **kwargs: Any) -> torch.optim.Optimizer:
        """A :class:`~dpcore.write.dp.zero_optimizer.ShardedOptimizer` over the trainable parameters."""
        return ShardedOptimizer(self.optim_parameters(), optimizer_cls, group=self.group,
                                recorder=self.recorder, **kwargs)

    def memory_tensors(self, optimizer: torch.optim.Optimizer | None = None
                       ) -> dict[str, list[torch.Tensor]]:
        """Full parameters, the bucket buffers (every gradient lives in one, even after
        ``zero_grad``), and the optimizer state of the owned parameters only."""
        out = super().memory_tensors(optimizer)
        out["grads"] = [b.buffer for b in self.buckets]
        return out
