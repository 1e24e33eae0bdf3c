"""Pipelined ring all-reduce over ``dist.isend``/``dist.irecv``.

Algorithm: reduce-scatter then all-gather on a ring (Patarasuk & Yuan, JPDC 2009; Baidu's
``baidu-allreduce``, 2017); the chunk plan comes from the pure
:func:`dpcore.contract.ringplan.rank_schedule`. Each rank sends 2(N-1) chunks of size numel/N,
i.e. 2(N-1)/N of the tensor, whatever N is.

Why pipelined: an unpipelined ring alternates "transfer a whole chunk" and "add a whole
chunk", so the link idles while the CPU adds and vice versa; measured at 0.84x of gloo's own
all-reduce here. Every chunk is therefore split into S sub-chunks (about ``sub_bytes`` each)
that flow through the steps independently: as soon as sub-chunk j of step t has arrived (and,
in reduce-scatter, been added) it is forwarded as sub-chunk j of step t+1 while the next
sub-chunks are still on the wire (a segmented ring, as in gloo, NCCL and Open MPI).
Messages are numbered by position q = step * S + j and handled in that order.

Why *few, large* sub-messages and a small window: on this gloo/TCP setup each message costs
about 0.1 ms of CPU (rendezvous, thread wake-ups) and every freshly allocated page a fault,
so 2 MB sub-messages with ``inflight`` = 3 receives posted ahead beat finer pipelining.

Small messages (measured, not fixed): at 1-4 MB on 2 ranks the ring reaches 0.2-1.0x of gloo's
own all-reduce, at 16 MB ~1x and at 64 MB ~1.2x (``benchmarks/bench_ring``, ranks pinned).
Timing each call shows why: 20-30 % of ``isend``/``irecv`` calls themselves block for ~3.5 ms
(one scheduler tick) inside gloo, whether ranks are pinned or not and with or without a barrier
before the call. A 1 MB all-reduce has only a handful of messages, so one stall dominates it;
gloo's native all-reduce runs on the process group's worker thread and mostly escapes it.
Finer pipelining (more, smaller messages) only adds more chances to stall.

Buffers: reduce-scatter receives land in ``inflight`` preallocated scratch slots of one
sub-chunk each (slot q % inflight, free again by the time position q + inflight is posted);
all-gather receives land directly in the output tensor (so they can be posted up to a step
ahead); sends read from it. No other copies.

Hazards: an all-gather receive overwrites the region that the reduce-scatter send at
position q - (N-1)S read, so that send is waited for first. Other sends are waited for with
a lag of ``inflight`` positions so the main thread rarely blocks on them. Every wait depends
only on neighbours reaching an *earlier* position, so the ring cannot deadlock.

Recording: one ``messages`` row per *sub-message* (the dashboard draws each row as a bar), with
``chunk`` = the ring chunk index the sub-message belongs to. The loop always calls the
recorder: with the default null recorder that costs ~0.2 us of no-op calls per message against
~0.1 ms per gloo message (measured), not worth a second code path.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from dpcore.contract.ringplan import chunk_bounds, rank_schedule
from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.comm._common import copy_back, prepare

#: Target size of one sub-message. Every message costs ~0.1 ms of CPU in gloo (handshake,
#: thread wake-ups), so sub-messages must stay large. Tuned with ``bench_ring`` (2 ranks,
#: gloo, 2 shared cores): 0.5-4 MB x 2-6 in flight were within noise; a whole-step window
#: of 1 MB (32 MB scratch at 64 MB) fell to ~0.5x native.
DEFAULT_SUB_BYTES = 2 << 20
#: Receives posted ahead of the one being consumed (also the number of scratch slots).
DEFAULT_INFLIGHT = 3


def profiling() -> bool:
    """True while torch.profiler records (the range costs nothing when it does not)."""
    return bool(torch._C._autograd._profiler_enabled())


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None,
                    recorder: Recorder = NULL_RECORDER, call: int = 0,
                    sub_bytes: int | None = None,
                    inflight: int | None = None, batched: bool | None = None) -> torch.Tensor:
    """All-reduce ``tensor`` in place with the pipelined ring; returns ``tensor``.

    ``op`` is "sum" or "mean" (mean divides each rank's owned chunk once, before all-gather,
    so every rank ends with bitwise identical values). Works for any world size and numel;
    empty sub-messages (numel < N) are skipped on both sides. ``sub_bytes``/``inflight``
    override the pipelining defaults above. ``batched`` (default: only on NCCL) runs the
    step-by-step variant, see :func:`_ring_batched`.
    """
    prep = prepare(tensor, op, group)
    if prep is None:
        return tensor
    rank, n, glob, work, flat = prep
    numel = flat.numel()
    esize = flat.element_size()
    chunks = chunk_bounds(numel, n)
    max_len = chunks[0][1] - chunks[0][0]
    plan = rank_schedule(n, rank)
    if batched if batched is not None else dist.get_backend(group) == "nccl":
        _ring_batched(flat, chunks, plan, glob, group, op, recorder, call)
        return copy_back(tensor, work)
    sub_bytes = DEFAULT_SUB_BYTES if sub_bytes is None else max(1, sub_bytes)
    n_sub = max(1, math.ceil(max_len * esize / sub_bytes))
    # subs[c][j] = absolute (start, stop) of sub-chunk j of chunk c (maybe empty). A message
    # is identified by its position q = step * n_sub + j, processed in increasing order.
    subs = [[(a + s, a + e) for s, e in chunk_bounds(b - a, n_sub)] for a, b in chunks]
    total = len(plan) * n_sub
    window = max(1, min(DEFAULT_INFLIGHT if inflight is None else inflight, n_sub))
    # Scratch slot q % window receives position q; it is free again when q + window is
    # posted, because that happens only after q has been consumed.
    scratch = flat.new_empty(window * -(-max_len // n_sub)).view(window, -1)
    dst_g, src_g = glob[plan[0].dst], glob[plan[0].src]
    dst, src = plan[0].dst, plan[0].src  # group ranks, for the message log
    mean_step = n - 2 if op == "mean" else -1
    rs_len = (n - 1) * n_sub             # positions of the reduce-scatter phase
    recvs: dict[int, Any] = {}           # position -> (work, buffer, t_post); empty ones absent
    # All-gather receives need no scratch, so they may be posted further ahead: up to a
    # step, but not past the reduce-scatter sends already waited for (see wait_sends).
    ag_ahead = max(window, min(n_sub, rs_len - window))
    next_q = 0                           # next position whose receive is not yet posted
    sends: deque = deque()               # (position, work, nbytes, t_post), in position order
    rec = recorder

    def post_recv(q: int) -> None:
        t, j = divmod(q, n_sub)
        s, e = subs[plan[t].recv_chunk][j]
        if e == s:
            return
        if q < rs_len:  # reduce-scatter: into scratch, added afterwards
            buf = scratch[q % window][:e - s]
        else:           # all-gather: straight into the output, once the send that read
            wait_sends(q - rs_len)  # this region in reduce-scatter has finished
            buf = flat[s:e]
        t_post = rec.mark()
        recvs[q] = (dist.irecv(buf, src_g, group=group, tag=q), buf, t_post)

    def post_send(q: int) -> None:
        t, j = divmod(q, n_sub)
        s, e = subs[plan[t].send_chunk][j]
        if e > s:
            t_post = rec.mark()
            sends.append((q, dist.isend(flat[s:e], dst_g, group=group, tag=q),
                          (e - s) * esize, t_post))

    def wait_sends(upto: int) -> None:
        """Wait for the sends up to position ``upto`` (lagging, so they rarely block)."""
        while sends and sends[0][0] <= upto:
            q, req, nbytes, t_post = sends.popleft()
            req.wait()
            st = plan[q // n_sub]
            rec.message("ring", call, st.phase, st.ring_step, rank, dst, st.send_chunk,
                        nbytes, t_post, rec.mark(), "send")

    def post_recvs(p: int) -> None:
        """Post receives allowed once position ``p`` has been consumed."""
        nonlocal next_q
        while next_q < total and next_q <= p + (window if next_q < rs_len else ag_ahead):
            post_recv(next_q)
            next_q += 1

    post_recvs(-1)
    for q in range(n_sub):
        post_send(q)
    for p in range(total):
        r = recvs.pop(p, None)
        if r is not None:
            if profiling():  # one range per ring step (and sub-message) in the trace
                st = plan[p // n_sub]
                with record_function(f"ring_{st.phase}_step{st.ring_step}"):
                    r[0].wait()
            else:
                r[0].wait()
            t, j = divmod(p, n_sub)
            st = plan[t]
            rec.message("ring", call, st.phase, st.ring_step, src, rank, st.recv_chunk,
                        r[1].numel() * esize, r[2], rec.mark(), "recv")
            if p < rs_len:
                s, e = subs[st.recv_chunk][j]
                region = flat[s:e]
                region.add_(r[1])
                if t == mean_step:
                    region.div_(n)
        wait_sends(p - window)
        # Receives first, then the forward: a message whose receive is already posted goes
        # straight through gloo, one that arrives first waits for an extra rendezvous round
        # trip (measured: 0.73 -> ~0.4 ms for a 1 KB all-reduce at 2 ranks).
        post_recvs(p)
        if p + n_sub < total:
            post_send(p + n_sub)  # forward what just arrived while the rest is in flight
    wait_sends(total)
    return copy_back(tensor, work)


def _ring_batched(flat: torch.Tensor, chunks: list[tuple[int, int]], plan: list, glob: list[int],
                  group: Any, op: str, rec: Recorder, call: int) -> None:
    """One ``batch_isend_irecv`` per ring step, whole chunks (one message row per chunk).

    Why a second variant: NCCL runs all point-to-point ops between two ranks on one stream, so
    an ``irecv`` posted before the matching ``isend`` (as the pipelined loop does on both
    ranks) would block that stream forever; a batch (ncclGroupStart/End) makes the pair
    concurrent. On GPU the pipelining is the stream's business anyway. Edges are
    ``rec.mark()`` around the batch: on a CUDA job events on the current stream, the done edge
    after the waits (the stream then waits for the batch), so it completes with the messages.
    """
    n = len(plan) // 2 + 1
    rank = plan[0].rank
    esize = flat.element_size()
    scratch = flat.new_empty(chunks[0][1] - chunks[0][0])
    for t, st in enumerate(plan):
        (ss, se), (rs, re_) = chunks[st.send_chunk], chunks[st.recv_chunk]
        in_rs = t < n - 1
        rbuf = scratch[:re_ - rs] if in_rs else flat[rs:re_]
        ops = []
        if se > ss:
            ops.append(dist.P2POp(dist.isend, flat[ss:se], glob[st.dst], group))
        if re_ > rs:
            ops.append(dist.P2POp(dist.irecv, rbuf, glob[st.src], group))
        t_post = rec.mark()
        for req in (dist.batch_isend_irecv(ops) if ops else []):
            req.wait()
        t_done = rec.mark()
        if se > ss:
            rec.message("ring", call, st.phase, st.ring_step, rank, st.dst, st.send_chunk,
                        (se - ss) * esize, t_post, t_done, "send")
        if re_ > rs:
            rec.message("ring", call, st.phase, st.ring_step, st.src, rank, st.recv_chunk,
                        (re_ - rs) * esize, t_post, t_done, "recv")
        if in_rs and re_ > rs:
            region = flat[rs:re_]
            region.add_(rbuf)
            if op == "mean" and t == n - 2:
                region.div_(n)
