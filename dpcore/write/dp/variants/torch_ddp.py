"""``torch_ddp``: PyTorch's ``DistributedDataParallel``, the production reference.

Same bucket cap as ``bucketed`` (``bucket_cap_mb=bucket_mb``). Buffers are broadcast once at
construction and not before every forward (``broadcast_buffers=False``), as in every other
variant here: none of our models change buffers during training, and a per-forward broadcast
would be a collective no variant issues. With a recording recorder, a communication hook (Li
et al. 2020, section 3.3 / DDP comm hooks) launches each bucket's all-reduce itself, exactly as
the built-in ``allreduce_hook`` does (divide by N, async all-reduce, future), and records it,
so DDP's buckets appear in collectives.csv; with the null recorder DDP keeps its C++ default
path (``recorder.enabled`` decides, once, here).
"""
# no `from __future__ import annotations`: DDP checks the comm hook's annotations at runtime

import inspect
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.variants.base import Wrapper

# newer torch renamed the switch (and still syncs buffers at init, which we want)
_NO_FORWARD_BUFFER_SYNC = ({"forward_sync_buffers": False}
                           if "forward_sync_buffers" in inspect.signature(
                               DistributedDataParallel.__init__).parameters
                           else {"broadcast_buffers": False})


class TorchDDP(DistributedDataParallel, Wrapper):
    """DDP itself; :class:`Wrapper` adds the no-op dpcore calls (DDP's own ``forward``,
    ``no_sync`` and ``module`` come first in the MRO)."""

    name = "torch_ddp"
    processes = "N"
    grad_sync_in_backward = True  # the reducer waits for its buckets inside loss.backward()

    def __init__(self, module: nn.Module, *, group: Any = None,
                 recorder: Recorder = NULL_RECORDER, bucket_mb: float = 25.0) -> None:
        dev = next(module.parameters()).device
        super().__init__(module, device_ids=[dev] if dev.type == "cuda" else None,
                         process_group=group, bucket_cap_mb=bucket_mb, **_NO_FORWARD_BUFFER_SYNC)
        self._hook_state: _HookState | None = None
        if recorder.enabled:
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
        return held


class _HookState:
    __slots__ = ("group", "recorder", "world_size", "buffers")

    def __init__(self, group: Any, recorder: Recorder) -> None:
        self.group = group
        self.recorder = recorder
        self.world_size = dist.get_world_size(group)
        #: bucket index -> the reducer's flat bucket tensor (the reducer keeps it alive anyway;
        #: held here only so memory.csv can count it)
        self.buffers: dict[int, torch.Tensor] = {}


def _recorded_allreduce_hook(state: _HookState, bucket: dist.GradBucket
                             ) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP bucket with an async all-reduce and log it in the Recorder.

    One Python callback on the backend's thread (DDP needs one to unwrap the result): it also
    stamps the end. Each extra one costs a GIL hand-off there, which keeps the backend's thread
    (and its trace span) busy after the all-reduce is over while the main thread computes."""
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
