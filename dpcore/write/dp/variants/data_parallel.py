"""``data_parallel``: ``torch.nn.DataParallel`` across this host's GPUs, in one process.

Single-process, multi-thread DP: every step scatters the batch, replicates the module to each
GPU, and gathers the outputs on GPU 0, whose loss backward reduces gradients onto GPU 0. Li et
al. 2020 (section 2) explain why DDP replaced it: GIL contention and per-step replication.
It needs 2 or more GPUs; otherwise the wrapper carries a ``skip_reason`` (reported, never
silently dropped) and refuses to train.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from dpcore.write.dp.variants.single import LocalWrapper


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class DataParallelDP(LocalWrapper):
    name = "data_parallel"

    def __init__(self, module: nn.Module, *, replicas: int = 2) -> None:
        super().__init__(module)
        n = gpu_count()
        self.dp: nn.DataParallel | None = None
        if n < 2:
            self.skip_reason = f"data_parallel needs 2 or more GPUs on this host; found {n}"
            return
        ids = list(range(min(n, max(2, replicas))))
        # not registered as a child: parameters()/state_dict() stay the wrapped model's
        self.__dict__["dp"] = nn.DataParallel(module.to(f"cuda:{ids[0]}"), device_ids=ids)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.dp is None:
            raise RuntimeError(self.skip_reason)
        return self.dp(*args, **kwargs)
