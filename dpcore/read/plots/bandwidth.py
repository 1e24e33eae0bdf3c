"""All-reduce bandwidth curves, nccl-tests style (input: `dpcore.read.analysis.allreduce_bandwidth`).

Why two panels: algbw = bytes / t is what the application sees; busbw = algbw · 2(N−1)/N
normalises away the world size so that a ring at N=2 and N=8 can be compared against the link's
speed. Small messages are latency-bound (flat, low), large ones bandwidth-bound (plateau).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dpcore.contract.units import binary_size
from dpcore.read.plots.style import base_layout, color_for, empty_figure, esc, legend_right

DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]


def bandwidth_figure(df: pd.DataFrame) -> go.Figure:
    """algbw and busbw (GB/s, 10^9 B/s as nccl-tests) against message size (ticks in KiB/MiB), log-log,
    color = algorithm, dash = N."""
    if df is None or df.empty:
        return empty_figure("This run has no all-reduce benchmark: run python -m dpcore allreduce.")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["algbw = bytes / t", "busbw = algbw · 2(N−1)/N"])
    sizes = sorted(df["world_size"].unique())
    for (algo, ws), part in df.sort_values("bytes").groupby(["algo", "world_size"], sort=True):
        name = f"{algo} N={int(ws)}"
        dash = DASHES[sizes.index(ws) % len(DASHES)]
        for c, col in enumerate(("algbw_gbps", "busbw_gbps"), start=1):
            fig.add_scatter(
                x=part["bytes"], y=part[col], mode="lines+markers", name=name, legendgroup=name, showlegend=c == 1,
                line=dict(color=color_for(str(algo)), dash=dash),
                customdata=np.column_stack([part["time_ms"], [binary_size(b) for b in part["bytes"]]]),
                hovertemplate=esc(name) + "<br>%{customdata[1]} in %{customdata[0]:.3f} ms"
                "<br>%{y:.3g} GB/s<extra></extra>",
                row=1, col=c)
    # the measured sizes as ticks, in binary units like the table (plotly's own log ticks are decimal: 1M, 10M)
    ticks = sorted(int(b) for b in df["bytes"].unique())
    fig.update_xaxes(type="log", title="message size (binary units: KiB = 2^10 B, MiB = 2^20 B)", tickvals=ticks,
                     ticktext=[binary_size(b) for b in ticks])
    fig.update_yaxes(type="log", title="GB/s", dtick=1)
    return legend_right(base_layout(fig, None, height=420))
