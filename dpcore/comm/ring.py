"""Pipelined ring all-reduce over ``dist.isend``/``dist.irecv``.

Algorithm: reduce-scatter then all-gather on a ring (Patarasuk & Yuan, JPDC 2009; Baidu's
``baidu-allreduce``, 2017); the chunk plan comes from the pure
:func:`dpcore.comm.schedule.rank_schedule`. Each rank sends 2(N-1) chunks of size numel/N,
i.e. 2(N-1)/N of the tensor, whatever N is.

Why pipelined: an unpipelined ring alternates "transfer a whole chunk" and "add a whole
chunk", so the link idles while the CPU adds and vice versa; measured at 0.84x of gloo's own
all-reduce here. Every chunk is therefore split into ``S`` sub-chunks (about ``sub_bytes``
each) that flow through the steps independently: as soon as sub-chunk j of step t has
arrived (and, in reduce-scatter, been added) it is forwarded as sub-chunk j of step t+1,
while the other sub-chunks of step t are still on the wire. Each rank keeps up to S receives
and S sends in flight, which is the same trick gloo and NCCL use (segmented rings).

Buffers: reduce-scatter receives land in two preallocated scratch buffers of one chunk each
(alternating by step, so step t+1 can be posted while step t is still being added);
all-gather receives land directly in the output tensor; sends read from it. No other copies.

Hazards, and why the order inside the loop is safe: the region an all-gather step receives
into was last *sent* at a reduce-scatter step that used the same chunk and sub-chunk index;
we wait for send (t, j) before posting receive (t+1, j), so that send is finished before the
region is overwritten. Every wait depends only on neighbours having reached an earlier
(step, sub-chunk) position, so the ring cannot deadlock.

Recording: one ``messages`` row per *sub-message* (the dashboard draws each row as a bar), with
``chunk`` = the ring chunk index the sub-message belongs to.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from ._common import check_op, copy_back, flat_buffer, group_ranks
from .schedule import chunk_bounds, rank_schedule

#: Target size of one sub-message. Tuned with ``python -m dpcore.comm.bench_ring`` on gloo.
DEFAULT_SUB_BYTES = 2 << 20
#: Cap on sub-chunks per chunk (more messages cost per-message overhead).
DEFAULT_MAX_SUBS = 1 << 30
#: Receives kept posted ahead (<= sub-chunks per chunk); 0 = one whole step.
DEFAULT_INFLIGHT = 3


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None,
                    recorder: Any = None, call: int = 0,
                    sub_bytes: int | None = None, inflight: int | None = None) -> torch.Tensor:
    """All-reduce ``tensor`` in place with the pipelined ring; returns ``tensor``.

    ``op`` is "sum" or "mean" (mean divides each rank's owned chunk once, before all-gather,
    so every rank ends with bitwise identical values). Works for any world size and numel;
    empty sub-messages (numel < N) are skipped on both sides.
    """
    check_op(op, tensor)
    rank, n, glob = group_ranks(group)
    numel = tensor.numel()
    if n == 1 or numel == 0:
        return tensor
    work, flat = flat_buffer(tensor)
    chunks = chunk_bounds(numel, n)
    max_len = chunks[0][1] - chunks[0][0]
    sub_bytes = DEFAULT_SUB_BYTES if sub_bytes is None else sub_bytes
    inflight = DEFAULT_INFLIGHT if inflight is None else inflight
    n_sub = max(1, min(DEFAULT_MAX_SUBS,
                       math.ceil(max_len * flat.element_size() / max(1, sub_bytes))))
    # subs[c][j] = absolute (start, stop) of sub-chunk j of chunk c (maybe empty)
    subs = [[(a + s, a + e) for s, e in chunk_bounds(b - a, n_sub)] for a, b in chunks]
    plan = rank_schedule(n, rank)
    n_steps = len(plan)
    total = n_steps * n_sub
    window = n_sub if inflight <= 0 else min(inflight, n_sub)
    # One scratch slot per receive in flight: position q uses slot q % window, which is free
    # again because position q + window is only posted after q has been consumed.
    sub_len = -(-max_len // n_sub)
    scratch = flat.new_empty(window * sub_len).view(window, sub_len)
    dst_g, src_g = glob[plan[0].dst], glob[plan[0].src]
    dst, src = plan[0].dst, plan[0].src  # group ranks, for the message log
    esize = flat.element_size()
    mean_step = n - 2 if op == "mean" else -1
    recvs: list[Any] = [None] * n_sub   # (work, buffer, t_post) of step t for sub j
    sends: list[Any] = [None] * n_sub   # (work, nbytes, t_post) of step t for sub j
    rec = recorder

    def post_recv(q: int) -> None:
        t, j = divmod(q, n_sub)
        s, e = subs[plan[t].recv_chunk][j]
        if e == s:
            recvs[j] = None
            return
        if t < n - 1:  # reduce-scatter: into scratch, added afterwards
            buf = scratch[q % window][:e - s]
        else:          # all-gather: straight into the output
            buf = flat[s:e]
        t_post = rec.now() if rec is not None else 0
        recvs[j] = (dist.irecv(buf, src_g, group=group, tag=t * n_sub + j), buf, t_post)

    def post_send(t: int, j: int) -> None:
        s, e = subs[plan[t].send_chunk][j]
        if e == s:
            sends[j] = None
            return
        t_post = rec.now() if rec is not None else 0
        sends[j] = (dist.isend(flat[s:e], dst_g, group=group, tag=t * n_sub + j),
                    (e - s) * esize, t_post)

    for q in range(window):
        post_recv(q)
    for j in range(n_sub):
        post_send(0, j)
    for p in range(total):
        t, j = divmod(p, n_sub)
        st = plan[t]
        r = recvs[j]
        if r is not None:
            r[0].wait()
            if rec is not None:
                rec.message("ring", call, st.phase, st.ring_step, src, rank, st.recv_chunk,
                            r[1].numel() * esize, r[2], rec.now(), "recv")
            if t < n - 1:
                s, e = subs[st.recv_chunk][j]
                region = flat[s:e]
                region.add_(r[1])
                if t == mean_step:
                    region.div_(n)
        snd = sends[j]
        if t + 1 < n_steps:
            post_send(t + 1, j)  # forward what just arrived while the rest is in flight
        if snd is not None:
            snd[0].wait()
            if rec is not None:
                rec.message("ring", call, st.phase, st.ring_step, rank, dst, st.send_chunk,
                            snd[1], snd[2], rec.now(), "send")
        if p + window < total:
            post_recv(p + window)
    return copy_back(tensor, work)
