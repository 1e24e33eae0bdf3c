"""The rank x step heat strip (input: :func:`dpcore.read.analysis.rank_pick.rank_step_matrix`).

Why a heat strip: a job of hundreds of ranks cannot be drawn as lanes or bars, but one thin row
per rank and one column per step shows all of them at once: a slow rank is a bright row, a slow
step a bright column, a straggler that moves from rank to rank a scatter of bright cells.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dpcore.read.plots.style import base_layout, empty_figure, esc


def rank_step_heat_figure(matrix: pd.DataFrame, title: str | None = None, label: str = "step time (ms)") -> go.Figure:
    """One row per rank, one column per step, colour = ``label``'s value; at most ~600 px tall."""
    if matrix is None or matrix.empty:
        return empty_figure("No per-rank step times in this selection.")
    fig = go.Figure(go.Heatmap(z=matrix.to_numpy(), x=[str(s) for s in matrix.columns],
                               y=[int(r) for r in matrix.index], colorscale="Viridis",
                               colorbar=dict(title=label),
                               hovertemplate=f"rank %{{y}}, step %{{x}}<br>{label}: %{{z:.3f}}<extra></extra>"))
    fig.update_xaxes(title="step", type="category")
    fig.update_yaxes(title="rank", autorange="reversed")
    # the title is plain text naming a job (run text): escaped, it carries no markup of its own
    return base_layout(fig, esc(title) if title else None, height=int(min(600, max(220, 120 + 3 * len(matrix)))))
