"""Clock alignment across ranks (Cristian's algorithm over the process group).

Each rank measures the offset of its ``perf_counter_ns`` to rank 0's by ping-pong: it sends
nothing but asks rank 0 for its clock; with the send time t0, rank 0's reply T and the receive
time t1, rank 0's clock at the midpoint was T, so offset = T - (t0 + t1) / 2. The round with
the smallest round trip bounds the error best (error <= rtt / 2), so we keep that one. On one
host all ranks share CLOCK_MONOTONIC and the offset comes out ~0; across nodes it is what
makes timelines line up.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from dpcore.write.runtime.context import DistContext


def measure_offset(ctx: DistContext, rounds: int = 20) -> tuple[int, int]:
    """Return (offset_ns, best_rtt_ns) of this rank's clock to rank 0's. Collective: every
    rank of the job must call it. Rank 0 returns (0, 0)."""
    if ctx.world_size == 1:
        return 0, 0
    # the ranks' own device on nccl; the CPU on gloo, whose send/recv take CPU tensors only
    # (ranks sharing a GPU over gloo compute on CUDA but exchange this on the host)
    dev = ctx.device if ctx.backend == "nccl" else torch.device("cpu")
    buf = torch.zeros(1, dtype=torch.int64, device=dev)
    best_rtt, best_off = None, 0
    for peer in range(1, ctx.world_size):
        for _ in range(rounds):
            if ctx.rank == 0:
                dist.recv(buf, src=peer)
                buf.fill_(time.perf_counter_ns())
                dist.send(buf, dst=peer)
            elif ctx.rank == peer:
                t0 = time.perf_counter_ns()
                dist.send(buf, dst=0)
                dist.recv(buf, src=0)
                t1 = time.perf_counter_ns()
                rtt = t1 - t0
                if best_rtt is None or rtt < best_rtt:
                    best_rtt, best_off = rtt, int(buf.item()) - (t0 + t1) // 2
    dist.barrier()
    return (0, 0) if ctx.rank == 0 else (best_off, best_rtt or 0)
