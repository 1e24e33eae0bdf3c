"""Which ranks a view draws when a job has more than a screen can show (issue 23: 1,024 ranks).

Why these: a lane per rank stops being readable past a handful of ranks, and of hundreds of
ranks three tell the story: rank 0 (the one people log from, the reference), the slowest rank
(largest median step time: where the step's time goes) and the rank most often last at the
collectives (the straggler the others wait for). Every other rank is one pick away (the views'
rank picker); the rank x step heat strip (:func:`rank_step_matrix`) shows all ranks at once, one
pixel row each. Pure pandas.
"""
from __future__ import annotations

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
            out.append(int(med.sort_index().idxmax()))
    if stragglers is not None and len(stragglers) and {"rank", "last_arrival_pct"} <= set(stragglers.columns):
        s = stragglers.sort_values(["last_arrival_pct", "rank"], ascending=[False, True])
        out.append(int(s["rank"].iloc[0]))
    return [r for r in dict.fromkeys(out) if r in ranks]


def rank_step_matrix(steps: pd.DataFrame, value: str = "step_ms") -> pd.DataFrame:
    """Ranks (rows, ascending) x steps (columns, ascending) of ``value`` (the mean where a rank
    has several rows of a step): the rank x step heat strip's data, every rank of the job."""
    if steps is None or steps.empty or value not in steps:
        return pd.DataFrame()
    v = pd.to_numeric(steps[value], errors="coerce")
    return v.groupby([steps["rank"].astype(int), steps["step"].astype(int)]).mean().unstack("step").sort_index()
