"""Straggler pictures (input: `dpcore.read.analysis.stragglers.straggler_summary`).

Why two pictures: "who arrives last" is a share per rank (a straggler's bar towers over the
chance line 100/N), while "what it costs" is time: each rank's comm time per collective split
into waiting for the last rank (latest arrival − own arrival, docs/DESIGN.md) and the transfer after
everyone arrived. A straggler itself waits almost nothing; the ranks it delays wait a lot.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dpcore.read.plots.style import COMPONENT_COLORS, LANE_COLORS, base_layout, empty_figure, esc

WAIT_COLOR, TRANSFER_COLOR, LAST_COLOR = COMPONENT_COLORS["exposed"], LANE_COLORS["comm"], "#4c78a8"
MAX_PANELS = 4
EMPTY = "No collective was matched across 2 or more ranks in this selection."


def _panels(summary: pd.DataFrame) -> tuple[go.Figure, list[tuple[str, pd.DataFrame, int, int]]]:
    """One subplot per job (up to MAX_PANELS per row), each with its rows sorted by rank."""
    jobs = list(dict.fromkeys(summary["job_id"]))
    cols = min(MAX_PANELS, len(jobs))
    rows = -(-len(jobs) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[str(j) for j in jobs] if len(jobs) > 1 else None,
                        vertical_spacing=0.25 / rows if rows > 1 else 0.1)
    cells = [(str(j), summary[summary["job_id"] == j].sort_values("rank"), i // cols + 1, i % cols + 1)
             for i, j in enumerate(jobs)]
    return fig, cells


def last_arrival_figure(summary: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Bars of last_arrival_pct per rank, one panel per job, with the chance line 100/N."""
    if summary is None or summary.empty:
        return empty_figure(EMPTY)
    fig, cells = _panels(summary)
    for k, (job, part, r, c) in enumerate(cells):
        x = [f"rank {int(v)}" for v in part["rank"]]
        fig.add_bar(x=x, y=part["last_arrival_pct"], marker_color=LAST_COLOR, name="arrived last (%)",
                    showlegend=k == 0, legendgroup="last",
                    customdata=part[["collectives", "mean_wait_ms"]].to_numpy(),
                    hovertemplate=(f"{esc(job)}<br>%{{x}} arrived last in %{{y:.0f}}% of %{{customdata[0]}} "
                                   "collectives<br>its mean wait: %{customdata[1]:.3f} ms<extra></extra>"),
                    row=r, col=c)
        chance = 100.0 / max(1, len(part))
        fig.add_scatter(x=x, y=[chance] * len(x), mode="lines", line=dict(color="#7f7f7f", dash="dash"),
                        name="chance = 100/N", showlegend=k == 0, legendgroup="chance",
                        hovertemplate=f"chance: {chance:.0f}%<extra></extra>", row=r, col=c)
        fig.update_yaxes(range=[0, 105], title="arrived last (% of collectives)" if c == 1 else None, row=r, col=c)
    return base_layout(fig, title, height=max(320, 300 * cells[-1][2]))


def wait_transfer_by_rank_figure(summary: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Stacked bars per rank: mean wait + mean transfer per collective (ms) = mean comm time."""
    if summary is None or summary.empty:
        return empty_figure(EMPTY)
    fig, cells = _panels(summary)
    for k, (job, part, r, c) in enumerate(cells):
        x = [f"rank {int(v)}" for v in part["rank"]]
        n = part["collectives"].clip(lower=1)
        for col, name, color in (("wait_ms", "waiting for the last rank", WAIT_COLOR),
                                 ("transfer_ms", "transfer (after everyone arrived)", TRANSFER_COLOR)):
            fig.add_bar(x=x, y=part[col] / n, marker_color=color, name=name, showlegend=k == 0, legendgroup=col,
                        customdata=(part["comm_ms"] / n).to_numpy(),
                        hovertemplate=(f"{esc(job)}<br>%{{x}}<br>{name}: %{{y:.3f}} ms per collective"
                                       "<br>comm (end − arrival): %{customdata:.3f} ms<extra></extra>"),
                        row=r, col=c)
        fig.update_yaxes(title="ms per collective (mean)" if c == 1 else None, row=r, col=c)
    fig.update_layout(barmode="stack")
    return base_layout(fig, title, height=max(320, 300 * cells[-1][2]))
