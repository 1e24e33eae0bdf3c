"""CPU resources of a rank: physical cores, threads per rank, and pinning ranks to their own CPUs.

Why a module of its own: every number dpcore compares across world sizes depends on the
resources each rank had. One policy (same threads for every job of a run, each rank on CPUs of
its own where they fit) lives here, used by the launcher and recorded in run.json.
"""
from __future__ import annotations

import functools
import os

from dpcore.contract.limits import usable_cpus

__all__ = ["physical_cores", "threads_per_rank", "rank_cpus", "pinning", "pin_rank", "is_oversubscribed"]


@functools.lru_cache(maxsize=1)
def physical_cores() -> int:
    """Physical CPU cores usable by this process (hyper-threads don't add matmul throughput)."""
    usable = usable_cpus()
    cores: set[tuple[str, str]] = set()
    try:
        phys = core = ""
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                    cores.add((phys, core))
    except OSError:
        pass
    return max(1, min(usable, len(cores) or usable))


def threads_per_rank(ranks_on_host: int) -> int:
    """max(1, physical cores // ranks on this host): ranks never fight over the same core."""
    return max(1, physical_cores() // max(1, ranks_on_host))


def rank_cpus(local_rank: int, ranks_on_host: int, threads: int) -> tuple[int, ...]:
    """The CPUs a rank is pinned to: a slice of its own, ``threads`` wide, of the CPUs this
    process may use; () when the ranks' slices would not fit (then nobody is pinned: sharing
    is better left to the OS scheduler than forced onto the same core).

    Why pin: an unpinned rank migrates between cores and competes with its neighbours' OpenMP
    threads, which is what makes small world-size-1 jobs explode under contention (p90/p10 of
    step time up to 60x unpinned, at most 1.5x pinned, on this 2-core machine). The whole
    process is pinned, gloo's threads included, so a rank's communication competes with its own
    compute for its own cores, as on a machine with that many cores per rank; ``--no-pin``
    lets them float."""
    try:
        usable = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux: no affinity API
        return ()
    if threads < 1 or ranks_on_host * threads > len(usable):
        return ()
    return tuple(usable[local_rank * threads:(local_rank + 1) * threads])


def pinning(ranks_on_host: int, threads: int) -> str:
    """How ranks of this many local ranks x threads are placed: 'per-rank' (each on its own
    CPUs) or why not, for run.json."""
    if not hasattr(os, "sched_setaffinity"):
        return "unavailable (no sched_setaffinity on this OS)"
    if not rank_cpus(0, ranks_on_host, threads):
        return f"none ({ranks_on_host} ranks x {threads} threads exceed the usable CPUs)"
    return "per-rank"


def pin_rank(local_rank: int, ranks_on_host: int, threads: int) -> tuple[int, ...]:
    """Pin this process to its :func:`rank_cpus` and return them; () where the slices don't fit
    or the OS refuses (a container may: the rank then runs unpinned rather than fail)."""
    cpus = rank_cpus(local_rank, ranks_on_host, threads)
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:  # a container may forbid it: run unpinned rather than fail
            return ()
    return cpus


def is_oversubscribed(ranks_on_host: int) -> bool:
    """More ranks than physical cores: timings mean little (ranks time-slice one core)."""
    return ranks_on_host > physical_cores()
