"""How a ``dpcore.record`` recording attaches to the user's model.

Kept apart from :mod:`dpcore.write.commands.record` (the recording's steps and phases) because
these are the pieces that depend on what the user brought: the kind of model (PyTorch DDP, a
``dpcore.wrap`` wrapper, anything else) and DDP's comm-hook protocol. The user's process group
(or none) is :class:`dpcore.write.runtime.world.UserWorld`.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from dpcore.write.capture.collective_tap import CollectiveTap
from dpcore.write.dp.variants.base import Wrapper

__all__ = ["CollectiveTap", "HookState", "describe", "recording_allreduce_hook", "user_comm_hook"]

USER_VARIANT = "user"  # a loop whose data parallelism dpcore does not know


def describe(model: nn.Module | None) -> tuple[str, float | None, str]:
    """(variant, bucket MB or None, model class name) of what the user recorded."""
    if isinstance(model, DistributedDataParallel):  # dpcore's torch_ddp is one too
        # DDP stores int(bucket_cap_mb * 2**20) bytes: round back to the MB the user wrote
        return "torch_ddp", round(model.bucket_bytes_cap / 2**20, 4), type(model.module).__name__
    if isinstance(model, Wrapper):
        return model.name, getattr(model, "bucket_mb", None), type(model.module).__name__
    return USER_VARIANT, None, type(model).__name__ if model is not None else ""


class HookState:
    """What the DDP comm hook needs; ``recorder`` becomes the null one when recording ends."""

    __slots__ = ("group", "recorder", "world_size", "recording")

    def __init__(self, group: Any, recording: Any) -> None:
        self.group, self.recording, self.recorder = group, recording, recording.rec
        self.world_size = dist.get_world_size(group)


def recording_allreduce_hook(state, bucket):  # annotated below, as real objects
    """Average a DDP bucket as DDP's default hook does (divide by N, async all-reduce) and log
    it. Leaner than the ``torch_ddp`` variant's hook because a user's loop pays for it on
    every step: the end time is stamped in the one completion callback DDP needs anyway
    (each extra Python callback on the backend's thread costs a GIL hand-off per bucket), and
    the ``bucket<i>`` trace range is opened only while the profiler runs."""
    buf = bucket.buffer()
    rec = state.recorder
    tracing = state.recording._tracing
    rf_ctx = torch.profiler.record_function(f"bucket{bucket.index()}") if tracing else None
    if rf_ctx is not None:
        rf_ctx.__enter__()
    buf.div_(state.world_size)
    idx = rec.launch("all_reduce", "native", buf.numel() * buf.element_size(), bucket.index())
    fut = dist.all_reduce(buf, group=state.group, async_op=True).get_future()
    rec.returned(idx)
    if rf_ctx is not None:
        rf_ctx.__exit__(None, None, None)

    def finished(f: torch.futures.Future) -> torch.Tensor:
        rec.finished(idx)  # runs on the backend's thread as the all-reduce completes
        return f.value()[0]

    return fut.then(finished)


# DDP checks a comm hook's annotations at run time, and this module's are strings
# (``from __future__ import annotations``): give the hook the objects it compares against.
recording_allreduce_hook.__annotations__ = {
    "state": HookState, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def user_comm_hook(model: nn.Module | None) -> str | None:
    """The name of the comm hook the user registered on a DDP model (``None``: none yet)."""
    hooks = getattr(model, "_comm_hooks", None) if isinstance(model, DistributedDataParallel) else None
    if not hooks:
        return None
    fn = hooks[0][0]
    return getattr(fn, "__qualname__", None) or type(fn).__name__
