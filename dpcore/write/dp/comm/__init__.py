"""From-scratch collectives: ring, naive and central all-reduce over point-to-point messages.

``all_reduce(tensor, algo=...)`` is the one entry point the variants and the ``allreduce``
benchmark use; ``native`` is the backend's own ``dist.all_reduce`` (the reference every
from-scratch algorithm is tested against). The pure chunk plan lives in
:mod:`dpcore.contract.ringplan`, torch-free, so the analysis draws the same plan the ring runs.

Recording: the from-scratch algorithms log each point-to-point message through
``recorder.message``; the whole call is logged by the caller (variants/benchmark) through
``recorder.launch/done``, so ``all_reduce`` itself does not add a collective row. Without a
recorder the default :data:`~dpcore.write.capture.comm_log.NULL_RECORDER` logs nothing.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dpcore.contract.config import ALGOS  # docs/DESIGN.md names, kept torch-free in dpcore.contract.config
from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.comm._common import OPS, check_op, copy_back, flat_buffer
from dpcore.write.dp.comm.central import central_all_reduce
from dpcore.write.dp.comm.naive import naive_all_reduce
from dpcore.write.dp.comm.ring import ring_all_reduce

__all__ = ["ALGOS", "OPS", "all_reduce", "native_all_reduce", "ring_all_reduce",
           "naive_all_reduce", "central_all_reduce"]


def native_all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None,
                      recorder: Recorder = NULL_RECORDER, call: int = 0) -> torch.Tensor:
    """The backend's ``dist.all_reduce``, in place; mean = AVG on NCCL, sum / N elsewhere.

    ``recorder``/``call`` are accepted for a uniform signature; the backend's internal
    messages are invisible to us, so nothing is logged per message.
    """
    check_op(op, tensor)
    work, _ = flat_buffer(tensor)  # backends want contiguous tensors
    if op == "mean" and dist.get_backend(group) == "nccl":
        dist.all_reduce(work, op=dist.ReduceOp.AVG, group=group)
    else:
        dist.all_reduce(work, op=dist.ReduceOp.SUM, group=group)
        if op == "mean":
            work.div_(dist.get_world_size(group))
    return copy_back(tensor, work)


_IMPLS = {"native": native_all_reduce, "ring": ring_all_reduce,
          "naive": naive_all_reduce, "central": central_all_reduce}


def all_reduce(tensor: torch.Tensor, algo: str = "native", op: str = "sum", group: Any = None,
               recorder: Recorder = NULL_RECORDER, call: int = 0) -> torch.Tensor:
    """All-reduce ``tensor`` in place with ``algo`` (one of :data:`ALGOS`); returns it.

    ``op`` is "sum" or "mean". ``call`` numbers the all-reduce calls of a step so that the
    messages of different calls can be told apart in messages.csv.
    """
    try:
        impl = _IMPLS[algo]
    except KeyError:
        raise ValueError(f"unknown all-reduce algo {algo!r}; valid choices: "
                         f"{', '.join(ALGOS)}") from None
    return impl(tensor, op=op, group=group, recorder=recorder, call=call)
