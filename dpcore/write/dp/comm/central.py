"""Central (parameter-server style) all-reduce: gather to rank 0, reduce, send back.

Rank 0 receives N-1 whole tensors and sends N-1 whole tensors, so its link carries
2(N-1)x the tensor while the others idle: the bottleneck that motivates the ring
(Patarasuk & Yuan, JPDC 2009; Baidu ring all-reduce, 2017). Written with point-to-point
messages only, so each message can be logged and drawn.

Group rank 0 of ``group`` is the root. It sums in group-rank order.

Recording: phases "gather" and "broadcast", ring_step 0, ``chunk`` = the group rank whose data
the message carries (the sender in gather, 0 in broadcast).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.comm._common import copy_back, prepare


def central_all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None,
                       recorder: Recorder = NULL_RECORDER, call: int = 0) -> torch.Tensor:
    """All-reduce ``tensor`` in place through group rank 0; returns it."""
    prep = prepare(tensor, op, group)
    if prep is None:
        return tensor
    rank, n, glob, work, flat = prep
    nbytes = flat.numel() * flat.element_size()
    rec = recorder
    if rank == 0:
        pending = []
        for peer in range(1, n):
            buf = torch.empty_like(flat)
            t_post = rec.mark()
            pending.append((peer, buf, dist.irecv(buf, glob[peer], group=group), t_post))
        # Add in rank order as the contributions arrive (overlaps adds with later receives).
        for peer, buf, req, t_post in pending:
            req.wait()
            rec.message("central", call, "gather", 0, peer, 0, peer, nbytes, t_post, rec.mark(),
                        "recv")
            flat.add_(buf)
        if op == "mean":
            flat.div_(n)
        sends = []
        for peer in range(1, n):
            t_post = rec.mark()
            sends.append((peer, dist.isend(flat, glob[peer], group=group), t_post))
        for peer, req, t_post in sends:
            req.wait()
            rec.message("central", call, "broadcast", 0, 0, peer, 0, nbytes, t_post, rec.mark(),
                        "send")
    else:
        t_post = rec.mark()
        req = dist.isend(flat, glob[0], group=group)
        req.wait()  # the result lands in the same buffer: the send must be done first
        rec.message("central", call, "gather", 0, rank, 0, rank, nbytes, t_post, rec.mark(),
                    "send")
        t_post = rec.mark()
        req = dist.irecv(flat, glob[0], group=group)
        req.wait()
        rec.message("central", call, "broadcast", 0, 0, rank, 0, nbytes, t_post, rec.mark(),
                    "recv")
    return copy_back(tensor, work)
