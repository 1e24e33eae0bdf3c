"""Bucket-size sweep (input: `dpcore.read.analysis.bucket_sweep`).

Why: bucketing trades launch overhead (many tiny all-reduces) against overlap (one huge bucket
can only start after the whole backward). The sweet spot shows as a dip in step time and
exposed comm in between — the reason DDP's default `bucket_cap_mb` is 25.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dpcore.read.plots.style import base_layout, color_for, empty_figure, legend_right


def bucket_figure(df: pd.DataFrame) -> go.Figure:
    """Step time and exposed comm against bucket MB (log x), one line per (variant, world size)."""
    if df is None or df.empty:
        return empty_figure("This run has no bucket sweep (run with several --bucket-mb values).")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["step time T (ms)", "exposed comm E (ms)"])
    for (variant, ws), part in df.sort_values("bucket_mb").groupby(["variant", "world_size"], sort=True):
        name = f"{variant} ×{int(ws)}"
        for c, col in enumerate(("step_ms", "exposed_ms"), start=1):
            fig.add_scatter(x=part["bucket_mb"], y=part[col], mode="lines+markers", name=name, legendgroup=name,
                            showlegend=c == 1, line=dict(color=color_for(str(variant))),
                            hovertemplate=name + "<br>bucket %{x:g} MB<br>%{y:.2f} ms<extra></extra>", row=1, col=c)
    sizes = sorted(float(b) for b in df["bucket_mb"].unique())
    fig.update_xaxes(type="log", title="bucket size (MB)", tickvals=sizes, ticktext=[f"{b:g}" for b in sizes])
    fig.update_yaxes(rangemode="tozero")
    return legend_right(base_layout(fig, None, height=380))
