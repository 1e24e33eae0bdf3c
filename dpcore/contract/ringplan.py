"""Pure ring all-reduce schedule: which chunk travels where at which step.

The ring all-reduce (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters
of workstations", JPDC 2009; popularised for deep learning by Baidu's ``baidu-allreduce``,
2017) splits the tensor into N chunks and runs two phases of N-1 steps each on a logical ring
in which rank r sends to (r+1) % N and receives from (r-1) % N:

* reduce-scatter: at step k rank r sends chunk (r - k) % N and receives chunk (r - k - 1) % N,
  which it adds to its own copy. Each chunk's partial sum walks once round the ring, so
  **after reduce-scatter rank r holds the fully reduced chunk (r + 1) % N**.
* all-gather: at step k rank r sends chunk (r + 1 - k) % N (the one it completed, then the
  ones it just received) and receives chunk (r - k) % N, overwriting its copy. After N-1
  steps every rank holds every reduced chunk.

Every rank sends 2(N-1) chunks, i.e. 2(N-1)/N of the tensor, independent of N: that is why
the ring is bandwidth-optimal and why nccl-tests' busbw multiplies algbw by 2(N-1)/N.

Nothing here touches processes or tensors, so the schedule is testable by simulation
(see tests/contract/test_ringplan.py); :mod:`dpcore.write.dp.comm.ring` only does the communication around it.
It lives outside :mod:`dpcore.write.dp.comm` (which imports torch) so the analysis and the dashboard can
use the same plan without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass

PHASES: tuple[str, str] = ("reduce_scatter", "all_gather")


@dataclass(frozen=True)
class RingStep:
    """What one rank does at one step of one phase of the ring all-reduce.

    ``send_chunk`` goes to ``dst`` and ``recv_chunk`` comes from ``src`` (group ranks). In the
    reduce-scatter phase the received chunk is added to the local one; in the all-gather phase
    it replaces it.
    """

    phase: str
    ring_step: int
    rank: int
    send_chunk: int
    recv_chunk: int
    dst: int
    src: int


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """Split ``range(numel)`` into ``n`` contiguous ``(start, stop)`` chunks.

    Sizes differ by at most one element (the first ``numel % n`` chunks get the extra one),
    so the slowest link in the ring carries as little as possible. When ``numel < n`` the
    trailing chunks are empty (``start == stop``); callers skip empty messages.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    base, extra = divmod(numel, n)
    bounds: list[tuple[int, int]] = []
    start = 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def rank_schedule(n: int, rank: int) -> list[RingStep]:
    """The 2(N-1) steps of ``rank`` in execution order (reduce-scatter first).

    Empty for N == 1: a single rank already holds the reduced tensor.
    """
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} outside world of size {n}")
    dst, src = (rank + 1) % n, (rank - 1) % n
    steps: list[RingStep] = []
    for k in range(n - 1):
        steps.append(RingStep("reduce_scatter", k, rank, (rank - k) % n, (rank - k - 1) % n,
                              dst, src))
    for k in range(n - 1):
        steps.append(RingStep("all_gather", k, rank, (rank + 1 - k) % n, (rank - k) % n,
                              dst, src))
    return steps


def ring_schedule(n: int) -> list[RingStep]:
    """The whole plan for a ring of ``n`` ranks, ordered by (phase, ring_step, rank).

    At every (phase, step) the chunk rank r sends is exactly the chunk rank (r+1) % N
    receives, which is what makes the point-to-point messages match up.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    per_rank = [rank_schedule(n, r) for r in range(n)]
    return [per_rank[r][i] for i in range(2 * (n - 1)) for r in range(n)]


def owned_chunk(n: int, rank: int) -> int:
    """Chunk that ``rank`` holds fully reduced after reduce-scatter: (rank + 1) % N."""
    return (rank + 1) % n
