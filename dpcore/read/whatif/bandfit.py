"""Fitting a family's band, below and above the prediction, from held-out cells (numpy in, out).

A what-if band is prediction x (1 - sqrt(e_lo² + u_dn²)) to prediction x (1 + sqrt(e_hi² +
u_up²)) (:func:`dpcore.read.whatif.advice.add_bands`): e_lo and e_hi the model's error below and
above, u the source's doubt on that side. This module picks (e_lo, e_hi) for one family from its
held-out cells, each given as measured / predicted - 1 and its own source's doubt.

Why two sides: a family the model predicts low (a 1-rank source at 2 ranks: 97 % of the
held-out 1 -> 2 cells of 2026-11-27 came out below their measurement) needs a band reaching up,
not down; one half-width pays for that bias on both sides and still misses on the side it errs.

Why held out by source, and why a level above the one promised: the quantile of the cells a band
was fitted on holds that share of them (in sample) and less of cells it never saw; the cells of
one source move together (they replay the same steps). :func:`fit_family` raises the level the
band is fitted at until, with each source's cells left out of the fit in turn, the band holds
the promised share of them, and then fits on every cell at that level.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: The share of held-out cells a band promises to hold.
COVERAGE = 0.9


def side_needs(ratio: np.ndarray, u_dn: np.ndarray | float = 0.0,
               u_up: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(down, up): per cell, the model error (same unit as ``ratio``) the band needs below and
    above the prediction to hold it, with the source's doubt on that side in quadrature.
    ``ratio``: measured / predicted - 1 (a cell predicted 30 % low, measured 1.43 x the
    prediction, needs 0.43 up: the band is drawn around the prediction). A cell above its
    prediction needs nothing below, and the reverse; a doubt wider than the miss needs nothing."""
    r = np.asarray(ratio, float)
    dn = np.broadcast_to(np.asarray(u_dn, float), r.shape)
    up = np.broadcast_to(np.asarray(u_up, float), r.shape)
    down = np.where(r < 0, np.sqrt(np.maximum(r ** 2 - dn ** 2, 0.0)), 0.0)
    upward = np.where(r > 0, np.sqrt(np.maximum(r ** 2 - up ** 2, 0.0)), 0.0)
    return down, upward


def narrowest(down: np.ndarray, up: np.ndarray, level: float = COVERAGE) -> tuple[float, float]:
    """(e_lo, e_hi): the pair with the smallest e_lo + e_hi that holds at least ``level`` of the
    cells (a cell is held when its ``down`` <= e_lo and its ``up`` <= e_hi: :func:`side_needs`).

    The cells it may miss, n - ceil(level x n), are split between the two sides every way and
    the narrowest split is taken: a family that errs one way misses on neither side more than it
    must, and a symmetric one gets about the same error both ways. (0, 0) without cells."""
    d = np.sort(np.asarray(down, float))[::-1]
    u = np.sort(np.asarray(up, float))[::-1]
    n = len(d)
    if n == 0:
        return 0.0, 0.0
    miss = n - min(n, math.ceil(level * n - 1e-9))
    d, u = np.append(d, 0.0), np.append(u, 0.0)
    # with j cells missed below, e_lo = the (j+1)-th largest need down: only the j above it miss
    best = min(range(miss + 1), key=lambda j: (d[j] + u[miss - j], max(d[j], u[miss - j])))
    return float(d[best]), float(u[miss - best])


def held_out_inside(down: np.ndarray, up: np.ndarray, groups: np.ndarray, level: float = COVERAGE) -> float:
    """The share of cells inside the band :func:`narrowest` fits at ``level`` on the OTHER
    groups' cells (leave one group, a source, out at a time); NaN with fewer than two groups."""
    down, up, groups = np.asarray(down, float), np.asarray(up, float), np.asarray(groups)
    names = list(dict.fromkeys(groups.tolist()))
    if len(names) < 2:
        return float("nan")
    held = 0
    for g in names:
        mine = groups == g
        lo, hi = narrowest(down[~mine], up[~mine], level)
        held += int(((down[mine] <= lo) & (up[mine] <= hi)).sum())
    return held / len(down)


@dataclass(frozen=True)
class BandFit:
    """One family's band: ``lower``/``upper`` the model errors below and above the prediction
    (the unit of the needs it was fitted on), ``level`` the share of the fitted cells they hold
    (in sample), ``held_out`` the share held with each source left out (:func:`held_out_inside`
    at that level; NaN with one source)."""

    lower: float
    upper: float
    level: float
    held_out: float


def fit_family(down: np.ndarray, up: np.ndarray, groups: np.ndarray, coverage: float = COVERAGE,
               steps: int = 20) -> BandFit:
    """The band of one family (:class:`BandFit`): the lowest level from ``coverage`` up to 1 (in
    ``steps`` steps) at which the band fitted on the other sources' cells holds ``coverage`` of
    each left-out source's cells (:func:`held_out_inside`), then :func:`narrowest` on every cell
    at that level. None holds it: level 1 (every cell held in sample), its held-out share as it is."""
    levels = [coverage + (1.0 - coverage) * k / steps for k in range(steps + 1)]
    level, held = levels[-1], held_out_inside(down, up, groups, levels[-1])
    for lv in levels:
        h = held_out_inside(down, up, groups, lv)
        if not np.isfinite(h):
            level, held = coverage, h
            break
        if h >= coverage - 1e-9:
            level, held = lv, h
            break
    lo, hi = narrowest(down, up, level)
    return BandFit(lo, hi, level, held)
