"""``torch_ddp``: PyTorch's ``DistributedDataParallel``, the production reference.

Same bucket cap as ``bucketed`` (``bucket_cap_mb=bucket_mb``). Buffers are broadcast once at
construction and not before every forward (``broadcast_buffers=False``), as in every other
variant here: none of our models change buffers during training, and a per-forward broadcast
would be a collective no variant issues. With a recorder, a communication hook (Li et al.
2020, section 3.3 / DDP comm hooks) launches each bucket's all-reduce itself, exactly as the
built-in ``allreduce_hook`` does (divide by N, async all-reduce, future), and records it, so
DDP's buckets appear in collectives.csv; without a recorder DDP keeps its C++ default path.
"""
# no `from __future__ import annotations`: DDP checks the comm hook's annotations at runtime

from typing import Any

import inspect

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function


# newer torch renamed the switch (and still syncs buffers at init, which we want)
_NO_FORWARD_BUFFER_SYNC = ({"forward_sync_buffers": False}
                           if "forward_sync_buffers" in inspect.signature(
                               DistributedDataParallel.__init__).parameters
                           else {"broadcast_buffers": False})


class TorchDDP(DistributedDataParallel):
    """DDP plus the (no-op) dpcore wrapper methods."""

    name = "torch_ddp"
    processes = "N"

    def __init__(self, module: nn.Module, *, group: Any = None, recorder: Any = None,
                 bucket_mb: float = 25.0) -> None:
        dev = next(module.parameters()).device
        super().__init__(module, device_ids=[dev] if dev.type == "cuda" else None,
                         process_group=group, bucket_cap_mb=bucket_mb, **_NO_FORWARD_BUFFER_SYNC)
        self.recorder = recorder
        self.bucket_mb = float(bucket_mb)
        if recorder is not None:
            self.register_comm_hook(_HookState(group, recorder), _recorded_allreduce_hook)

    def finish_gradient_synchronization(self) -> None:
        """No-op: DDP waits for its buckets at the end of backward."""

    def on_train_batch_start(self) -> None:
        """No-op: DDP resets its reducer itself in forward."""


class _HookState:
    __slots__ = ("group", "recorder", "world_size")

    def __init__(self, group: Any, recorder: Any) -> None:
        self.group = group
        self.recorder = recorder
        self.world_size = dist.get_world_size(group)


def _recorded_allreduce_hook(state: _HookState, bucket: dist.GradBucket
                             ) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP bucket with an async all-reduce and log it in the Recorder."""
    buf = bucket.buffer()
    i = bucket.index()
    with record_function(f"bucket{i}"):
        buf.div_(state.world_size)
        idx = state.recorder.launch("all_reduce", "native", buf.numel() * buf.element_size(), i)
        work = dist.all_reduce(buf, group=state.group, async_op=True)
        state.recorder.track(idx, work)
    return work.get_future().then(lambda fut: fut.value()[0])
