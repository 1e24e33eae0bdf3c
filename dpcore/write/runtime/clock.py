"""Clock alignment across ranks: 0 on rank 0's host by construction, measured across hosts.

Every ``*_ns`` column is on rank 0's ``perf_counter_ns`` clock. ``time.perf_counter_ns`` reads
the host's monotonic clock (CLOCK_MONOTONIC on Linux), one clock for every process of a booted
kernel and time namespace: ranks there share it, so their offset to each other is 0 exactly,
with no measurement and no error. A rank learns which ranks share its clock from
:func:`host_key` (the kernel's boot id and the time namespace; the host name where those
cannot be read), gathered over the control plane.

Across hosts the offset is measured, by Cristian's algorithm over the control plane
(:mod:`dpcore.write.runtime.control`, gloo: its ``send``/``recv`` return when the bytes have
gone / arrived; NCCL's return once queued, so a ping-pong over NCCL measures the queue, not the
clock). One rank per host (its lowest) asks rank 0 for its clock: with the send time t0, rank
0's reply T and the receive time t1, rank 0's clock at the midpoint was T, so offset =
T - (t0 + t1) / 2. The round with the smallest round trip bounds the error best
(error <= rtt / 2), so that one is kept (:func:`best_offset`). The other ranks of that host take
its offset and round trip: they read the same clock.
"""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from dpcore.write.runtime import control
from dpcore.write.runtime.context import DistContext


def host_key() -> str:
    """Which monotonic clock this process reads: the kernel's boot id (a new one per boot, the
    same for every process and container of that boot) and the time namespace's inode (a
    container in its own time namespace may have its own CLOCK_MONOTONIC offset), else the host
    name where /proc cannot be read (macOS, Windows: one clock per host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        return f"host:{socket.gethostname()}"
    try:
        ns = str(os.stat("/proc/self/ns/time").st_ino)
    except OSError:
        ns = "-"
    return f"boot:{boot}/timens:{ns}"


def measurers(keys: Sequence[str]) -> list[int | None]:
    """For each rank (``keys[r]``: its :func:`host_key`), whose measurement gives its offset:
    None for a rank that reads rank 0's clock (offset 0 by construction), else the lowest rank
    that reads the same clock as it does (that rank pings rank 0)."""
    first: dict[str, int] = {}
    for r, k in enumerate(keys):
        first.setdefault(k, r)
    return [None if k == keys[0] else first[k] for k in keys]


def best_offset(samples: Iterable[tuple[int, int, int]]) -> tuple[int, int]:
    """(offset_ns, rtt_ns) from ping-pong samples (t0, T, t1): the sample with the smallest
    round trip t1 - t0, offset = T - (t0 + t1) // 2. (0, 0) without samples."""
    best: tuple[int, int] | None = None
    for t0, remote, t1 in samples:
        rtt = t1 - t0
        if best is None or rtt < best[1]:
            best = (remote - (t0 + t1) // 2, rtt)
    return best or (0, 0)


def measure_offset(ctx: DistContext, rounds: int = 20) -> tuple[int, int]:
    """Return (offset_ns, rtt_ns) of this rank's clock to rank 0's: (0, 0) on rank 0's host,
    measured across hosts (module docstring). Collective: every rank of the job must call it.
    Everything goes over the control plane, on the CPU, whatever the job's backend."""
    if ctx.world_size == 1:
        return 0, 0
    group = control.control_group()
    who = measurers(control.all_gather(host_key()))
    if all(lead is None for lead in who):  # one host: every rank reads rank 0's clock
        return 0, 0
    buf = torch.zeros(1, dtype=torch.int64)  # the control plane is gloo: CPU tensors
    mine = (0, 0)
    for peer in sorted({r for r in who if r is not None}):
        if ctx.rank == 0:
            for _ in range(rounds):
                dist.recv(buf, src=peer, group=group)
                buf.fill_(time.perf_counter_ns())
                dist.send(buf, dst=peer, group=group)
        elif ctx.rank == peer:
            samples = []
            for _ in range(rounds):
                t0 = time.perf_counter_ns()
                dist.send(buf, dst=0, group=group)
                dist.recv(buf, src=0, group=group)
                t1 = time.perf_counter_ns()
                samples.append((t0, int(buf.item()), t1))
            mine = best_offset(samples)
    # every measurer's result reaches the ranks that share its clock (and ends the sync together)
    results = control.all_gather(mine)
    lead = who[ctx.rank]
    if lead is None:
        return 0, 0
    offset, rtt = results[lead]
    return int(offset), int(rtt)
