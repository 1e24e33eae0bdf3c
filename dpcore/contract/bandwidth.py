"""Metric definitions that both wings compute (docs/DESIGN.md "Metric definitions").

Why here: the ``allreduce`` command writes busbw into allreduce.csv and the analysis recomputes
it from bytes and time to check the file; both must use the same factor, and the write wing may
not import the read wing.
"""
from __future__ import annotations


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor for a collective over n ranks (doc/PERFORMANCE.md):
    all-reduce 2(N-1)/N; reduce-scatter, all-gather, all-to-all (N-1)/N; broadcast 1.

    busbw = algbw · factor is comparable to the link speed whatever N is. One rank has no peer and
    moves nothing over a bus, so every factor is 0 there, broadcast's too (a world-size-1 ZeRO-1
    job's broadcasts "moved" its whole model to nobody)."""
    if n <= 1:
        return 0.0
    if op == "broadcast":
        return 1.0
    if op in ("all_reduce", "allreduce"):
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "allgather", "all_to_all", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    return 1.0
