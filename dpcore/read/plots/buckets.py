"""Bucket-size sweep (input: `dpcore.read.analysis.bucket_sweep`).

Why: bucketing trades launch overhead (many tiny all-reduces) against overlap (one huge bucket
can only start after the whole backward). The sweet spot shows as a dip in step time and
exposed comm in between — the reason DDP's default `bucket_cap_mb` is 25.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dpcore.contract.units import mib_size
from dpcore.read.plots.style import base_layout, color_for, empty_figure, esc, legend_right, mib_ticks

#: World sizes in ascending order get these line dashes and marker symbols (colour is the variant's).
DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x"]


def bucket_figure(df: pd.DataFrame) -> go.Figure:
    """Step time and exposed comm against bucket size (log x), one line per (variant, world size):
    colour = variant, dash and marker = world size, so `bucketed ×1` and `bucketed ×2` differ."""
    if df is None or df.empty:
        return empty_figure("This run has no bucket sweep (run with several --bucket-mb values).")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["step time T (ms)", "exposed comm E (ms)"])
    sizes_n = sorted(int(n) for n in df["world_size"].unique())
    for (variant, ws), part in df.sort_values("bucket_mb").groupby(["variant", "world_size"], sort=True):
        k = sizes_n.index(int(ws))
        name = f"{variant} ×{int(ws)}"
        labels = [mib_size(b) for b in part["bucket_mb"]]
        for c, col in enumerate(("step_ms", "exposed_ms"), start=1):
            fig.add_scatter(x=part["bucket_mb"], y=part[col], mode="lines+markers", name=name, legendgroup=name,
                            showlegend=c == 1, line=dict(color=color_for(str(variant)), dash=DASHES[k % len(DASHES)]),
                            marker=dict(symbol=SYMBOLS[k % len(SYMBOLS)], size=9), customdata=labels,
                            hovertemplate=esc(name) + "<br>bucket %{customdata}<br>%{y:.2f} ms<extra></extra>",
                            row=1, col=c)
    fig.update_xaxes(type="log", title="bucket size (MiB = 2^20 bytes)", **mib_ticks(df["bucket_mb"]))
    fig.update_yaxes(rangemode="tozero")
    return legend_right(base_layout(fig, None, height=380))
