"""``data_parallel``: ``torch.nn.DataParallel`` across this host's GPUs, in one process.

Single-process, multi-thread DP: every step scatters the batch, replicates the module to each
GPU, and gathers the outputs on GPU 0, whose loss backward reduces gradients onto GPU 0. Li et
al. 2020 (section 2) explain why DDP replaced it: GIL contention and per-step replication.
It needs 2 or more GPUs; otherwise the wrapper carries a ``skip_reason`` (reported, never
silently dropped) and refuses to train.

Mixed precision: ``DataParallel`` runs each replica in its own thread and re-enters autocast
there with only the on/off switch, and autocast's dtype is thread-local, so a replica would
compute in CUDA autocast's default (float16) under a bf16 job. Each replica is therefore
wrapped in :class:`ReplicaAutocast`, which re-enters autocast with the caller's dtype, read
in the calling thread at every forward.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from dpcore.write.dp.variants.single import LocalWrapper


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    """Whether autocast is on for ``device_type`` in this thread, and its dtype. Autocast is
    thread-local: a worker thread (``nn.DataParallel``'s replicas) needs both handed over."""
    try:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError):  # a torch without the per-device queries: CUDA's own
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


class ReplicaAutocast(nn.Module):
    """``module`` run under autocast as the calling thread had it (``amp``: on/off and dtype,
    set before each forward; ``DataParallel`` copies it into every replica)."""

    def __init__(self, module: nn.Module, device_type: str = "cuda") -> None:
        super().__init__()
        self.module = module
        self.device_type = device_type
        self.amp: tuple[bool, torch.dtype] = (False, torch.float32)

    def capture(self) -> None:
        """Take the calling thread's autocast state (call in the thread that called forward)."""
        self.amp = autocast_state(self.device_type)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        enabled, dtype = self.amp
        if not enabled:
            return self.module(*args, **kwargs)
        with torch.autocast(device_type=self.device_type, dtype=dtype, enabled=True):
            return self.module(*args, **kwargs)


class DataParallelDP(LocalWrapper):
    name = "data_parallel"

    def __init__(self, module: nn.Module, *, replicas: int = 2) -> None:
        super().__init__(module)
        n = gpu_count()
        self.dp: nn.DataParallel | None = None
        self.replica: ReplicaAutocast | None = None
        if n < 2:
            self.skip_reason = f"data_parallel needs 2 or more GPUs on this host; found {n}"
            return
        ids = list(range(min(n, max(2, replicas))))
        # not registered as children: parameters()/state_dict() stay the wrapped model's
        self.__dict__["replica"] = ReplicaAutocast(module.to(f"cuda:{ids[0]}"), "cuda")
        self.__dict__["dp"] = nn.DataParallel(self.replica, device_ids=ids)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.dp is None or self.replica is None:
            raise RuntimeError(self.skip_reason)
        self.replica.capture()
        return self.dp(*args, **kwargs)
