"""Reshape `dpcore.read.analysis.chunk_matrix` into heatmap cells for the ring chunk slider.

Why a separate adapter: the analysis returns one row per (phase, ring_step, rank) with a `held`
list (how many ranks' contributions each chunk copy contains); the heatmap wants one cell per
(frame, rank, chunk). This is reshaping only: the numbers are the analysis's.
"""
from __future__ import annotations

import pandas as pd

ABBREV = {"reduce_scatter": "reduce-scatter", "all_gather": "all-gather"}


def chunk_cells(matrix: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """Frames 'start', then one per ring step; cell text 'k/N' and an arrow on the chunk just received."""
    n = int(world_size)
    rows = [dict(frame="start", rank=r, chunk=c, count=1, text=f"1/{n}") for r in range(n) for c in range(n)]
    if matrix is None or matrix.empty or n < 2:
        return pd.DataFrame(rows)
    for _, m in matrix.iterrows():
        frame = f"{ABBREV.get(m['phase'], m['phase'])} step {int(m['ring_step']) + 1}"
        held = list(m["held"]) if not isinstance(m["held"], str) else [int(x) for x in m["held"].strip("[]").split(",")]
        recv = int(m["recv_chunk"]) if "recv_chunk" in m and pd.notna(m["recv_chunk"]) else -1
        for c, count in enumerate(held):
            mark = " ←" if c == recv else ""
            rows.append(dict(frame=frame, rank=int(m["rank"]), chunk=c, count=int(count),
                             text=f"{int(count)}/{n}{' ✓' if int(count) == n else ''}{mark}"))
    return pd.DataFrame(rows)
