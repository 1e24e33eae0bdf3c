"""Shared plumbing of the from-scratch all-reduce algorithms (group ranks, buffers, ops).

Kept separate so that ring/naive/central contain only their communication pattern.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

OPS: tuple[str, str] = ("sum", "mean")


def check_op(op: str, tensor: torch.Tensor) -> None:
    """Reject unknown ops early, on every rank, before any message is posted.

    ``mean`` divides by N, which has no exact meaning for integer tensors, so it is refused
    there instead of silently truncating.
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; valid choices: {', '.join(OPS)}")
    if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(f"op 'mean' needs a floating-point tensor, got {tensor.dtype}")


def group_ranks(group: Any) -> tuple[int, int, list[int]]:
    """``(rank, size, global_ranks)`` of this process in ``group``.

    The algorithms think in group ranks (ring neighbours are (r +- 1) % N *within the
    group*), but ``dist.isend``/``dist.irecv`` address peers by global rank, hence the
    ``global_ranks[group_rank]`` table.
    """
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given process group")
    size = dist.get_world_size(group)
    if group is None or group is dist.GroupMember.WORLD:
        return rank, size, list(range(size))
    return rank, size, [dist.get_global_rank(group, r) for r in range(size)]


def flat_buffer(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(work, flat)``: a contiguous tensor to reduce in and its 1-D view.

    For a contiguous input ``work`` *is* the input (zero copies); otherwise it is a
    contiguous copy that :func:`copy_back` writes back once the reduction is done.
    """
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    return work, work.view(-1)


def prepare(tensor: torch.Tensor, op: str, group: Any
            ) -> tuple[int, int, list[int], torch.Tensor, torch.Tensor] | None:
    """The prologue every p2p algorithm shares: validate ``op``, find this rank in ``group``,
    and get a contiguous 1-D buffer. ``None`` when there is nothing to exchange (one rank or
    an empty tensor), in which case the input already is the result.
    Returns ``(rank, size, global_ranks, work, flat)``."""
    check_op(op, tensor)
    rank, n, glob = group_ranks(group)
    if n == 1 or tensor.numel() == 0:
        return None
    work, flat = flat_buffer(tensor)
    return rank, n, glob, work, flat


def copy_back(tensor: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """Write ``work`` into ``tensor`` if it was a copy; return ``tensor``."""
    if work is not tensor:
        tensor.copy_(work)
    return tensor
