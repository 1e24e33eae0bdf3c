"""Naive all-reduce: every rank sends its whole tensor to every other rank.

N(N-1) messages of the full tensor, so each rank sends (N-1)x the tensor instead of the
ring's 2(N-1)/N: the baseline that shows why bandwidth-optimal algorithms exist (Patarasuk &
Yuan, JPDC 2009). It is still useful: one round of messages means the lowest latency for tiny
tensors on small N.

Every rank adds the N contributions in the same order (group rank 0, 1, ..., N-1), so all
ranks end with bitwise identical results even though float addition is not associative.

Recording: phase "exchange", ring_step 0, ``chunk`` = the group rank whose data the message
carries (its src); one row per message and side.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.comm._common import copy_back, prepare


def naive_all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None,
                     recorder: Recorder = NULL_RECORDER, call: int = 0,
                     batched: bool | None = None) -> torch.Tensor:
    """All-reduce ``tensor`` in place by all-to-all exchange of whole tensors; returns it.

    ``batched`` (default: only on NCCL) posts all messages as one ``batch_isend_irecv``:
    NCCL serialises the ops between two ranks on one stream, so receives posted before
    sends on both sides would deadlock. Rows then share the batch's two edges.

    Edges are ``recorder.mark()``: the host clock on CPU; on a CUDA job events on the current
    stream, the done edge recorded after the waits (which make the stream wait for the
    messages), so it completes when they did, not when NCCL returned.
    """
    prep = prepare(tensor, op, group)
    if prep is None:
        return tensor
    rank, n, glob, work, flat = prep
    nbytes = flat.numel() * flat.element_size()
    rec = recorder
    bufs: dict[int, torch.Tensor] = {}
    if batched if batched is not None else dist.get_backend(group) == "nccl":
        ops = []
        for i in range(1, n):
            peer = (rank + i) % n
            bufs[peer] = torch.empty_like(flat)
            ops += [dist.P2POp(dist.isend, flat, glob[peer], group),
                    dist.P2POp(dist.irecv, bufs[peer], glob[peer], group)]
        t_post = rec.mark()
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        t_done = rec.mark()
        for peer in bufs:
            rec.message("naive", call, "exchange", 0, rank, peer, rank, nbytes, t_post, t_done,
                        "send")
            rec.message("naive", call, "exchange", 0, peer, rank, peer, nbytes, t_post, t_done,
                        "recv")
        return _sum_in_rank_order(tensor, work, flat, bufs, rank, n, op)
    recvs = []
    for peer in range(n):
        if peer == rank:
            continue
        bufs[peer] = buf = torch.empty_like(flat)
        t_post = rec.mark()
        recvs.append((peer, dist.irecv(buf, glob[peer], group=group), t_post))
    sends = []
    # Start with the next rank so that the N-1 senders do not all hit rank 0 first.
    for i in range(1, n):
        peer = (rank + i) % n
        t_post = rec.mark()
        sends.append((peer, dist.isend(flat, glob[peer], group=group), t_post))
    for peer, req, t_post in recvs:
        req.wait()
        rec.message("naive", call, "exchange", 0, peer, rank, peer, nbytes, t_post, rec.mark(),
                    "recv")
    for peer, req, t_post in sends:
        req.wait()  # flat is read by these sends: finish them before writing the result
        rec.message("naive", call, "exchange", 0, rank, peer, rank, nbytes, t_post, rec.mark(),
                    "send")
    return _sum_in_rank_order(tensor, work, flat, bufs, rank, n, op)


def _sum_in_rank_order(tensor: torch.Tensor, work: torch.Tensor, flat: torch.Tensor,
                       bufs: dict[int, torch.Tensor], rank: int, n: int,
                       op: str) -> torch.Tensor:
    """Sum in group-rank order, into a buffer we own (ours if rank 0, else rank 0's copy)."""
    acc = flat if rank == 0 else bufs[0]
    for peer in range(1, n):
        acc.add_(flat if peer == rank else bufs[peer])
    if op == "mean":
        acc.div_(n)
    if acc is not flat:
        flat.copy_(acc)
    return copy_back(tensor, work)
