"""Which ranks a view draws when a job has more than a screen can show (hundreds to 1,024 ranks).

Why these: a lane per rank stops being readable past a handful of ranks, and of hundreds of
ranks three tell the story: rank 0 (the one people log from, the reference), the slowest rank
(largest median step time: where the step's time goes) and the rank most often last at the
collectives (the straggler the others wait for). Every other rank is one pick away (the views'
rank picker); the rank x step heat strip (:func:`rank_step_matrix`) shows all ranks at once, one
pixel row each. Pure pandas.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: The most rank lanes a view draws at once (two lanes each on the Timeline).
MAX_RANK_LANES = 8


def default_ranks(ranks: list[int], steps: pd.DataFrame | None = None,
                  stragglers: pd.DataFrame | None = None) -> list[int]:
    """Rank 0 (or the lowest rank), the slowest rank and the most-often-last rank, in that order,
    without repeats; every rank when there are at most :data:`MAX_RANK_LANES`.

    ``steps``: rows with ``rank`` and ``step_ms`` (steps.csv's of the job; slowest = the largest
    median); ``stragglers``: :func:`~dpcore.read.analysis.stragglers.straggler_summary` rows of
    the job (most often last = the largest ``last_arrival_pct``, ties to the lower rank)."""
    ranks = sorted(int(r) for r in ranks)
    if len(ranks) <= MAX_RANK_LANES:
        return ranks
    out = [ranks[0]]
    if steps is not None and len(steps) and {"rank", "step_ms"} <= set(steps.columns):
        med = pd.to_numeric(steps["step_ms"], errors="coerce").groupby(steps["rank"]).median().dropna()
        if len(med):
            med = med.sort_index()
            out.append(int(med.index.to_numpy()[int(np.argmax(med.to_numpy(dtype=float)))]))  # idxmax, as a number
    if stragglers is not None and len(stragglers) and {"rank", "last_arrival_pct"} <= set(stragglers.columns):
        s = stragglers.sort_values(["last_arrival_pct", "rank"], ascending=[False, True])
        out.append(int(s["rank"].iloc[0]))
    return [r for r in dict.fromkeys(out) if r in ranks]


#: Most rows of the heat strip (a strip is at most ~600 px tall: more rows share pixels anyway).
MAX_HEAT_ROWS = 4096
#: Most cells of the heat strip: 8 MB of float64, a few MB of plotly JSON.
MAX_HEAT_CELLS = 1_000_000


def _bins(codes: np.ndarray, n: int, limit: int) -> tuple[np.ndarray, int]:
    """Dense codes ``0 .. n-1`` folded into at most ``limit`` consecutive bins, and the width."""
    width = max(1, -(-n // max(1, limit)))
    return codes // width, width


def rank_step_matrix(steps: pd.DataFrame, value: str = "step_ms",
                     max_cells: int = MAX_HEAT_CELLS) -> pd.DataFrame:
    """Ranks (rows, ascending) x steps (columns, ascending) of ``value`` (the mean where a rank
    has several rows of a step): the rank x step heat strip's data, every rank of the job.

    Why bounded: the grid is every rank by every step, so sparse rows (rank i only at step i)
    make it quadratic: 30,000 such rows would be a 30,000 x 30,000 grid (7 GB). Past
    :data:`MAX_HEAT_ROWS` ranks or ``max_cells`` cells, neighbouring ranks and then
    neighbouring steps (in order of the values present) share a cell, its value their mean, and
    the cell is labelled by its first rank and step; a strip that fits is exact."""
    if steps is None or steps.empty or value not in steps:
        return pd.DataFrame()
    v = pd.to_numeric(steps[value], errors="coerce")
    rank = steps["rank"].astype(int).to_numpy()
    step = steps["step"].astype(int).to_numpy()
    ranks, rc = np.unique(rank, return_inverse=True)
    steps_u, sc = np.unique(step, return_inverse=True)
    if len(ranks) * len(steps_u) <= max_cells and len(ranks) <= MAX_HEAT_ROWS:
        return v.groupby([rank, step]).mean().rename_axis(["rank", "step"]).unstack("step").sort_index()
    rb, rw = _bins(rc, len(ranks), MAX_HEAT_ROWS)
    sb, sw = _bins(sc, len(steps_u), max_cells // (int(rb.max()) + 1))
    grid = v.groupby([rb, sb]).mean().unstack()
    grid.index = pd.Index(ranks[grid.index.to_numpy() * rw], name="rank")
    grid.columns = pd.Index(steps_u[grid.columns.to_numpy() * sw], name="step")
    return grid.sort_index()
