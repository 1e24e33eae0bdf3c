"""``flat``: every gradient copied into one flat buffer, ONE blocking all-reduce, copied back.

Why: one big collective pays the latency term once and runs at full bandwidth, where the
naive variant pays it per parameter (Li et al. 2020, fig. 2: all-reduce time vs size). The
cost is the two copies and no overlap with backward. The buffer is allocated once (one per
dtype/device when the model mixes them) and reused every step.

:class:`FlatAlgoDP` is the base of ``central`` and ``ring``: same flat buffer, averaged by a
from-scratch algorithm of :mod:`dpcore.write.dp.comm` instead of the backend's all-reduce.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from dpcore.write.dp.comm import all_reduce
from dpcore.write.dp.variants.base import DPWrapper


class FlatDP(DPWrapper):
    name = "flat"
    algo = "native"

    def __init__(self, module: nn.Module, **kw: Any) -> None:
        super().__init__(module, **kw)
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(self.trainable):
            groups.setdefault((p.dtype, p.device), []).append(i)
        self._groups = list(groups.values())
        self._flats = [torch.empty(sum(self.trainable[i].numel() for i in idxs),
                                   dtype=self.trainable[idxs[0]].dtype,
                                   device=self.trainable[idxs[0]].device)
                       for idxs in self._groups]

    def _sync(self) -> None:
        grads = self._grads()
        for k, (idxs, flat) in enumerate(zip(self._groups, self._flats)):
            gs = [grads[i] for i in idxs]
            with record_function(f"bucket{k}"):
                torch.cat([g.reshape(-1) for g in gs], out=flat)
                self._reduce(flat, k)
                off = 0
                for g in gs:
                    n = g.numel()
                    g.copy_(flat[off:off + n].view_as(g))
                    off += n

    def _reduce(self, flat: torch.Tensor, bucket: int) -> None:
        """Average ``flat`` in place across the group (blocking)."""
        rec = self.recorder
        idx = rec.launch("all_reduce", self.algo, flat.numel() * flat.element_size(), bucket)
        dist.all_reduce(flat, group=self.group)
        rec.done(idx)
        flat.div_(self.world_size)


class FlatAlgoDP(FlatDP):
    """Flat buffer averaged by ``dpcore.write.dp.comm.all_reduce(..., algo=self.algo, op="mean")``."""

    def _reduce(self, flat: torch.Tensor, bucket: int) -> None:
        rec = self.recorder
        idx = rec.launch("all_reduce", self.algo, flat.numel() * flat.element_size(), bucket)
        all_reduce(flat, algo=self.algo, op="mean", group=self.group, recorder=rec,
                   call=bucket)  # call = index of this all-reduce within the step
        rec.done(idx)
