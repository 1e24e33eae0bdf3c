"""The rank x step heat strip (input: :func:`dpcore.read.analysis.rank_pick.rank_step_matrix`).

Why a heat strip: a job of hundreds of ranks cannot be drawn as lanes or bars, but one thin row
per rank and one column per step shows all of them at once: a slow rank is a bright row, a slow
step a bright column, a straggler that moves from rank to rank a scatter of bright cells.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dpcore.read.plots.style import base_layout, empty_figure, esc

#: Up to this many ranks every rank gets its own tick; beyond, plotly picks whole-number ticks.
MAX_TICKED_RANKS = 16
#: The least plot height (px): a colour bar shorter than this squeezes its labels together.
MIN_PLOT_PX = 160


def rank_step_heat_figure(matrix: pd.DataFrame, title: str | None = None, label: str = "step time (ms)") -> go.Figure:
    """One row per rank, one column per step, colour = ``label``'s value; at most ~600 px tall.

    Ranks are integers: the rank axis ticks whole ranks only (every rank up to 16, else an
    integer step), never plotly's -0.5 / 0.5 of a two-row strip. The plot is at least
    MIN_PLOT_PX tall so the colour bar beside it has room for its tick labels, and its title
    stands on its side instead of over the bar."""
    if matrix is None or matrix.empty:
        return empty_figure("No per-rank step times in this selection.")
    ranks = [int(r) for r in matrix.index]
    fig = go.Figure(go.Heatmap(z=matrix.to_numpy(), x=[str(s) for s in matrix.columns], y=ranks,
                               colorscale="Viridis",
                               colorbar=dict(title=dict(text=label, side="right"), thickness=14, len=1,
                                             nticks=5),
                               hovertemplate=f"rank %{{y}}, step %{{x}}<br>{label}: %{{z:.3f}}<extra></extra>"))
    fig.update_xaxes(title="step", type="category")
    if len(ranks) <= MAX_TICKED_RANKS:
        fig.update_yaxes(tickmode="array", tickvals=ranks, ticktext=[str(r) for r in ranks])
    else:
        fig.update_yaxes(tickmode="auto", nticks=MAX_TICKED_RANKS, tickformat="d")
    fig.update_yaxes(title="rank", autorange="reversed")
    # the title is plain text naming a job (run text): escaped, it carries no markup of its own
    return base_layout(fig, esc(title) if title else None,
                       height=int(min(600, max(MIN_PLOT_PX + 135, 135 + 3 * len(matrix)))))
