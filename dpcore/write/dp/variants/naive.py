"""``naive``: one blocking all-reduce per parameter gradient, after backward.

The textbook baseline: correct, but it pays the per-collective latency once per parameter
and overlaps nothing with backward (Li et al. 2020, section 3.2's motivation for bucketing).
"""
from __future__ import annotations

import torch.distributed as dist
from torch.profiler import record_function

from dpcore.write.dp.variants.base import DPWrapper


class NaiveDP(DPWrapper):
    name = "naive"

    def _sync(self) -> None:
        rec, ws = self.recorder, self.world_size
        for i, g in enumerate(self._grads()):
            with record_function(f"allreduce_param{i}"):
                idx = rec.launch("all_reduce", "native", g.numel() * g.element_size())
                dist.all_reduce(g, group=self.group)
                rec.done(idx)
            g.div_(ws)
