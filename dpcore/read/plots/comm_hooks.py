"""Bytes saved against time added, one point per comm-hook job (input:
`dpcore.read.analysis.comm_hooks.compression`).

Why this picture: compression pays when the step time it adds is below zero, i.e. the points
below the x axis; how far right a point lies is how much of the wire it saved. The hover
splits the time added into the hook's own compute (compress + decompress, measured apart from
its collectives) and gives the loss difference from the plain job (the ``none`` point at the
origin), so a point that pays in time can be checked for what it costs in training.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dpcore.read.plots.style import base_layout, empty_figure


def compression_figure(df: pd.DataFrame) -> go.Figure:
    """x: MiB per step no longer sent; y: step time added vs the plain job (ms, below 0 = faster)."""
    done = df[df["bytes_wire"].notna()] if df is not None and not df.empty else None
    if done is None or done.empty:
        return empty_figure("This run has no comm-hook jobs (profile --comm-hook none,fp16,powersgd).")
    fig = go.Figure()
    for _, r in done.iterrows():
        saved = (r["bytes_in"] - r["bytes_wire"]) / 2**20
        label = f"{r['hook']} ×{int(r['world_size'])}"
        compute = r.get("compress_ms", float("nan")) + r.get("decompress_ms", float("nan"))
        fig.add_scatter(x=[saved], y=[r["added_ms"]], mode="markers+text", text=[label],
                        textposition="top center", name=str(r["job_id"]), marker=dict(size=12),
                        hovertemplate=(f"{r['job_id']}<br>saved %{{x:.2f}} MiB/step ({r['saved_pct']:.0f}%)"
                                       "<br>time added %{y:.2f} ms/step"
                                       f"<br>of which hook compute {compute:.3f} ms/step"
                                       f"<br>loss diff vs plain {r.get('loss_diff', float('nan')):.3g}"
                                       "<extra></extra>"))
    fig.add_hline(y=0, line=dict(color="grey", dash="dot"))
    base_layout(fig, "compression: bytes saved vs time added")
    fig.update_layout(showlegend=False)
    fig.update_xaxes(title="bytes saved per step (MiB = 2^20 bytes)", rangemode="tozero")
    fig.update_yaxes(title="step time added vs no hook (ms)")
    return fig
