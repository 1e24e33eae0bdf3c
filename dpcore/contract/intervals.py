"""Interval algebra on numpy arrays: the core of every overlap number.

Why a sweep over sorted boundaries: HTA's overlap (|comm ∩ compute| / |comm|) is defined on the
*unions* of kernel intervals, so nested, overlapping and touching intervals must be merged first.
A single sort + cumulative sum does that for any number of intervals without Python loops, which
keeps a 250k-event trace well under a second.
"""
from __future__ import annotations

import math

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]


def _arr(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1)


def merge(starts: object, ends: object) -> Intervals:
    """Union of intervals as sorted, disjoint (start, end) arrays; empty/inverted ones are dropped.

    Touching intervals ([0,1] and [1,2]) are merged into one.
    """
    s, e = _arr(starts), _arr(ends)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    out_s = s[new]
    out_e = np.full(out_s.size, -np.inf)
    np.maximum.at(out_e, group, e)
    return out_s, out_e


def union_length(starts: object, ends: object) -> float:
    """Length of the union of intervals (the docs/DESIGN.md 'comm time C' of a rank's collectives)."""
    s, e = merge(starts, ends)
    return float((e - s).sum())


def _sweep(a: Intervals, b: Intervals, want_b: bool) -> Intervals:
    """Pieces of union(a) that are (want_b) or are not (not want_b) covered by union(b)."""
    a_s, a_e = merge(*a)
    b_s, b_e = merge(*b)
    if a_s.size == 0:
        return a_s, a_e
    if b_s.size == 0:
        return (a_s[:0], a_e[:0]) if want_b else (a_s, a_e)
    t = np.concatenate([a_s, a_e, b_s, b_e])
    da = np.concatenate([np.ones(a_s.size), -np.ones(a_e.size), np.zeros(b_s.size + b_e.size)])
    db = np.concatenate([np.zeros(a_s.size + a_e.size), np.ones(b_s.size), -np.ones(b_e.size)])
    order = np.argsort(t, kind="stable")
    t, ca, cb = t[order], np.cumsum(da[order]), np.cumsum(db[order])
    inside = (ca[:-1] > 0) & ((cb[:-1] > 0) if want_b else (cb[:-1] <= 0))
    seg_s, seg_e = t[:-1][inside], t[1:][inside]
    return merge(seg_s, seg_e)


def intersect(a_starts: object, a_ends: object, b_starts: object, b_ends: object) -> Intervals:
    """union(A) ∩ union(B) as disjoint intervals."""
    return _sweep((_arr(a_starts), _arr(a_ends)), (_arr(b_starts), _arr(b_ends)), True)


def subtract(a_starts: object, a_ends: object, b_starts: object, b_ends: object) -> Intervals:
    """union(A) \\ union(B) as disjoint intervals (e.g. compute minus the main thread's waits)."""
    return _sweep((_arr(a_starts), _arr(a_ends)), (_arr(b_starts), _arr(b_ends)), False)


def intersect_length(a_starts: object, a_ends: object, b_starts: object, b_ends: object) -> float:
    """|A ∩ B| of two interval unions: the 'overlapped comm' of the HTA definition."""
    s, e = intersect(a_starts, a_ends, b_starts, b_ends)
    return float((e - s).sum())


def clip(starts: object, ends: object, lo: float, hi: float) -> Intervals:
    """Intervals clipped to the window [lo, hi] (a step window); empty pieces dropped."""
    s, e = np.clip(_arr(starts), lo, hi), np.clip(_arr(ends), lo, hi)
    keep = e > s
    return s[keep], e[keep]


def overlap_stats(comm: Intervals, compute: Intervals) -> dict[str, float]:
    """comm, compute, overlapped and exposed lengths plus overlap % (HTA: |comm ∩ compute| / |comm|).

    overlap_pct is NaN when there is no communication at all (the ratio is undefined).
    """
    comm_len = union_length(*comm)
    comp_len = union_length(*compute)
    ov = intersect_length(comm[0], comm[1], compute[0], compute[1])
    return {"compute": comp_len, "comm": comm_len, "overlapped": ov, "exposed": comm_len - ov,
            "overlap_pct": 100.0 * ov / comm_len if comm_len > 0 else float("nan")}


def comm_start(launch_ns: object, start_ns: object) -> np.ndarray:
    """When each collective began: its backend start where known (a finite, non-negative
    ``t_start_ns``), else its launch. gloo never reports a start, so on CPU this is the launch."""
    launch, start = _arr(launch_ns), _arr(start_ns)
    return np.where(np.isfinite(start) & (start >= 0), start, launch)


def has_peers(world_size: object) -> bool:
    """Whether a job's collectives communicate: a world of one rank has no peer, so its
    collectives move nothing and are no communication (C = 0). Unknown (None, NaN): assume so."""
    try:
        ws = float(world_size)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
    return not (math.isfinite(ws) and ws <= 1)


def step_comm(starts_ns: object, ends_ns: object, t_start_ns: float, step_ms: float,
              world_size: object = None) -> Intervals:
    """A rank's collective intervals of one step, clipped to the step window
    [t_start, t_start + step_ms]: what docs/DESIGN.md's comm time C of that step is the union of.
    None at world size 1 (:func:`has_peers`); ``world_size`` None: not known, kept.

    Both steps.csv's ``comm_ms`` (written by the engine) and the analysis' step breakdown use
    this, so the file and every view agree on C."""
    if not has_peers(world_size):
        return np.empty(0), np.empty(0)
    lo = float(t_start_ns)
    return clip(starts_ns, ends_ns, lo, lo + float(step_ms) * 1e6)
