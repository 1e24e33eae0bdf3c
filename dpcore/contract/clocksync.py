"""Placing torch.profiler traces on dpcore's shared clock (pure; no torch import).

The profiler stamps events on its own clock. While profiling, each rank opens a few empty
``record_function`` ranges named ``dpcore_clock_sync#k``, reading the shared clock right before
(t_a) and inside (t_b) each one; the range's start in the trace lies between the two. The
sample with the tightest bracket bounds the error best (a rank descheduled between the two
reads only widens that sample's bracket), the same minimum-delay rule as the clock offset.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

SYNC_MARKER = "dpcore_clock_sync"


def marker_name(k: int) -> str:
    return f"{SYNC_MARKER}#{k}"


def marker_index(name: str) -> int | None:
    """k of ``dpcore_clock_sync#k``, else None."""
    if not name.startswith(SYNC_MARKER + "#"):
        return None
    try:
        return int(name[len(SYNC_MARKER) + 1:])
    except ValueError:
        return None


def shift_us(markers: Mapping[int, float], samples: Sequence[Sequence[int]]) -> float | None:
    """µs to add to trace ``ts`` to get shared-clock µs.

    ``markers``: k -> trace ts (µs) of ``dpcore_clock_sync#k``; ``samples[k]`` = (t_a, t_b) ns.
    Returns None when no marker matches a sample.
    """
    best = None
    for k, ts in markers.items():
        if 0 <= k < len(samples):
            t_a, t_b = samples[k]
            width = t_b - t_a
            if best is None or width < best[0]:
                best = (width, (t_a + t_b) / 2e3 - float(ts))
    return None if best is None else best[1]


def markers_from(names: Iterable[str], ts: Iterable[float]) -> dict[int, float]:
    """Collect {k: ts} of the sync markers among (name, ts) pairs."""
    out = {}
    for n, t in zip(names, ts):
        k = marker_index(str(n))
        if k is not None:
            out[k] = float(t)
    return out


def trace_shift_us(names: Iterable[str], ts: Iterable[float],
                   samples: Sequence[Sequence[int]]) -> float | None:
    """µs to add to one rank's trace ``ts`` (events given as parallel names/ts) to land on the
    shared clock, from its ``dpcore_clock_sync#k`` markers and their (t_a, t_b) samples."""
    return shift_us(markers_from(names, ts), samples)
