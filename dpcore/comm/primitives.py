"""Thin, recorded wrappers over the backend's own collectives.

They are the public toolbox for a user's own training loop and for tests: each one does one
blocking call between ``recorder.launch`` and ``recorder.done`` (so it lands in
collectives.csv); with ``recorder=None`` it is the plain ``torch.distributed`` call. The
variants record their collectives themselves, because they need async work, buckets and
profiler ranges that these blocking wrappers do not offer.

Ranks given as ``src``/``dst`` are **group ranks** (converted to global ranks here), the same
convention as the from-scratch algorithms, so callers never mix the two numbering schemes.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _global(group: Any, group_rank: int) -> int:
    if group is None or group is dist.GroupMember.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def barrier(group: Any = None, recorder: Any = None) -> None:
    """Block until every rank of ``group`` arrives."""
    idx = recorder.launch("barrier", "native", 0) if recorder is not None else -1
    dist.barrier(group=group)
    if recorder is not None:
        recorder.done(idx)


def broadcast(tensor: torch.Tensor, src: int = 0, group: Any = None,
              recorder: Any = None) -> torch.Tensor:
    """Copy ``tensor`` of group rank ``src`` to every rank, in place; returns it."""
    idx = recorder.launch("broadcast", "native", _nbytes(tensor)) if recorder is not None else -1
    dist.broadcast(tensor, _global(group, src), group=group)
    if recorder is not None:
        recorder.done(idx)
    return tensor


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None,
            src: int = 0, group: Any = None, recorder: Any = None) -> torch.Tensor:
    """Rank ``src`` sends ``scatter_list[i]`` to group rank i, which receives into ``tensor``."""
    idx = recorder.launch("scatter", "native", _nbytes(tensor)) if recorder is not None else -1
    is_src = dist.get_rank(group) == src
    dist.scatter(tensor, scatter_list if is_src else None, src=_global(group, src), group=group)
    if recorder is not None:
        recorder.done(idx)
    return tensor


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None,
           dst: int = 0, group: Any = None, recorder: Any = None) -> list[torch.Tensor] | None:
    """Collect every rank's ``tensor`` into ``gather_list`` on group rank ``dst``.

    On ``dst`` a missing ``gather_list`` is allocated; returns it there, ``None`` elsewhere.
    """
    is_dst = dist.get_rank(group) == dst
    if is_dst and gather_list is None:
        gather_list = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    idx = recorder.launch("gather", "native", _nbytes(tensor)) if recorder is not None else -1
    dist.gather(tensor, gather_list if is_dst else None, dst=_global(group, dst), group=group)
    if recorder is not None:
        recorder.done(idx)
    return gather_list if is_dst else None


def all_gather(tensor_list: list[torch.Tensor] | None, tensor: torch.Tensor,
               group: Any = None, recorder: Any = None) -> list[torch.Tensor]:
    """Every rank receives every rank's ``tensor``; allocates ``tensor_list`` if None."""
    if tensor_list is None:
        tensor_list = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    idx = recorder.launch("all_gather", "native", _nbytes(tensor)) if recorder is not None else -1
    dist.all_gather(tensor_list, tensor, group=group)
    if recorder is not None:
        recorder.done(idx)
    return tensor_list


def all_reduce_mean(tensor: torch.Tensor, group: Any = None,
                    recorder: Any = None) -> torch.Tensor:
    """Average ``tensor`` over ``group`` in place with the backend's all-reduce; returns it.

    NCCL has ``ReduceOp.AVG`` (one kernel, no extra pass); gloo has not, so there it is a
    sum followed by a division.
    """
    idx = recorder.launch("all_reduce", "native", _nbytes(tensor)) if recorder is not None else -1
    _native_mean(tensor, group)
    if recorder is not None:
        recorder.done(idx)
    return tensor


def _native_mean(tensor: torch.Tensor, group: Any) -> None:
    if dist.get_backend(group) == "nccl":
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG, group=group)
    else:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        tensor.div_(dist.get_world_size(group))
