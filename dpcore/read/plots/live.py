"""The Live page's rank x step strip: one cell per (rank, step), coloured by step time."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go


def live_strip_figure(rows: pd.DataFrame, value: str = "step_ms") -> go.Figure:
    """Heatmap of ``value`` (ms) by rank (rows) and step (columns); empty figure without rows."""
    fig = go.Figure()
    if not rows.empty:
        grid = rows.pivot_table(index="rank", columns="step", values=value, aggfunc="last")
        fig.add_trace(go.Heatmap(
            z=grid.to_numpy(), x=[int(s) for s in grid.columns], y=[f"rank {int(r)}" for r in grid.index],
            colorscale="Viridis", colorbar={"title": "ms"},
            hovertemplate="%{y}, step %{x}: %{z:.2f} ms<extra></extra>"))
    fig.update_layout(height=120 + 30 * max(1, rows["rank"].nunique() if not rows.empty else 1),
                      margin={"l": 60, "r": 20, "t": 30, "b": 40},
                      xaxis_title="step", yaxis={"autorange": "reversed"},
                      title=f"{value} per rank and step")
    return fig
