"""The control plane: dpcore's own small collectives, on a gloo side group, apart from the job's.

What goes here: sharing the run folder's name from rank 0, gathering every rank's rows to
rank 0, run-level barriers, and the clock sync (:mod:`dpcore.write.runtime.clock`). What does
not: the job's collectives, and anything that must order after them on the job's own backend
(``launch.settle_collectives``: gloo's barrier waits for gloo's earlier collectives).

Why a separate gloo group, whatever the job's backend:

- NCCL's object collectives and barriers run on a GPU: ``broadcast_object_list``,
  ``gather_object`` and ``barrier`` of an NCCL group move the pickled object through
  ``torch.cuda.current_device()``, which is GPU 0 on every rank that did not call
  ``set_device``: "Duplicate GPU detected", or a hang. On gloo they move CPU tensors.
- NCCL's ``send``/``recv`` return once the op is queued on a stream, not when it is done, so a
  ping-pong over NCCL times the host's queueing, not the peer's clock. gloo's ``send``/``recv``
  return when the bytes have gone / arrived (their work is waited on before the call returns).
- Kept apart, dpcore's few messages never queue behind (or between) the job's collectives on
  their stream, and never appear in the job's own flight-recorder entries as if the job sent them.

One group per default process group, made on first use by every rank (``new_group`` is
collective: every rank of the job must come to the same first control-plane call, which holds
because every call here is itself collective). A default group that was destroyed and made
again gets a new control group.
"""
from __future__ import annotations

import datetime as _dt
from typing import Any

import torch.distributed as dist

#: the default group the control group was made for, and the control group
_CONTROL: dict[str, Any] = {}


def control_group(timeout_s: float | None = None) -> Any:
    """The gloo control group of the current default process group (made on first use, with
    ``timeout_s`` as its collectives' timeout, torch's gloo default when None); None without a
    group or in a world of one, where there is nobody to talk to."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    world = dist.group.WORLD
    if _CONTROL.get("world") is not world:
        timeout = None if timeout_s is None else _dt.timedelta(seconds=timeout_s)
        group = dist.new_group(backend="gloo", timeout=timeout)
        _CONTROL.clear()
        _CONTROL.update(world=world, group=group)
    return _CONTROL["group"]


def broadcast(box: list[Any], src: int = 0) -> None:
    """Rank ``src``'s ``box`` contents reach every rank (in place); nothing in a world of one."""
    group = control_group()
    if group is not None:
        dist.broadcast_object_list(box, src=src, group=group)


def gather(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's ``obj``, by rank, on rank ``dst`` (None on the others); ``[obj]`` alone."""
    group = control_group()
    if group is None:
        return [obj]
    rank = dist.get_rank()
    out: list[Any] | None = [None] * dist.get_world_size() if rank == dst else None
    dist.gather_object(obj, out, dst=dst, group=group)
    return out


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, by rank, on every rank; ``[obj]`` alone."""
    group = control_group()
    if group is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


def barrier() -> None:
    """Every rank of the job is here (run-level: it orders nothing of the job's backend)."""
    group = control_group()
    if group is not None:
        dist.barrier(group=group)
