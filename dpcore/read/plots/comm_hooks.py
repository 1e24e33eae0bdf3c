"""Bytes saved against time added, one point per comm-hook job (input:
`dpcore.read.analysis.comm_hooks.compression`).

Why this picture: compression pays when the step time it adds is below zero, i.e. the points
below the x axis; how far right a point lies is how much of the wire it saved. The hover
splits the time added into the hook's own compute (compress + decompress, measured apart from
its collectives) and gives the loss difference from the plain job, so a point that pays in time
can be checked for what it costs in training.

Why a legend and one reference point: a bucket sweep gives one plain job per bucket size, all at
the origin (nothing saved, nothing added), and a hook saves the same share at every bucket size,
so text beside the points would pile up; the legend names each hook job, and the origin is drawn
once as "no hook". The axes are padded so the origin's marker and label sit inside the plot.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dpcore.read.plots.style import base_layout, empty_figure, job_label

#: Share of each axis's span added on both sides, so no marker or label touches the frame.
PAD = 0.12


def _span(values: list[float]) -> list[float]:
    """An axis range holding 0 and every value, padded by PAD of its span (at least 1 unit)."""
    lo, hi = min([0.0, *values]), max([0.0, *values])
    pad = PAD * max(hi - lo, 1.0)
    return [lo - pad, hi + pad]


def compression_figure(df: pd.DataFrame) -> go.Figure:
    """x: MiB per step no longer sent; y: step time added vs the plain job (ms, below 0 = faster)."""
    done = df[df["bytes_wire"].notna()] if df is not None and not df.empty else None
    hooks = done[done["hook"] != "none"] if done is not None else None
    if hooks is None or hooks.empty:
        return empty_figure("This run has no comm-hook jobs (profile --comm-hook none,fp16,powersgd).")
    several = hooks["bucket_mb"].nunique() > 1
    fig = go.Figure()
    fig.add_scatter(x=[0.0], y=[0.0], mode="markers+text", text=["no hook"], textposition="top right",
                    name="no hook (the plain torch_ddp job)", showlegend=False,
                    marker=dict(size=12, color="grey", symbol="diamond"),
                    hovertemplate="the plain torch_ddp job: nothing saved, nothing added<extra></extra>")
    xs, ys = [], []
    for _, r in hooks.iterrows():
        saved = (r["bytes_in"] - r["bytes_wire"]) / 2**20
        xs.append(float(saved) if saved == saved else 0.0)
        ys.append(float(r["added_ms"]) if r["added_ms"] == r["added_ms"] else 0.0)
        label = f"{r['hook']}: " + job_label("torch_ddp", r["world_size"], r["bucket_mb"], several)
        compute = r.get("compress_ms", float("nan")) + r.get("decompress_ms", float("nan"))
        fig.add_scatter(x=[saved], y=[r["added_ms"]], mode="markers", name=label, marker=dict(size=12),
                        hovertemplate=(f"{r['job_id']}<br>saved %{{x:.2f}} MiB/step ({r['saved_pct']:.0f}%)"
                                       "<br>time added %{y:.2f} ms/step"
                                       f"<br>of which hook compute {compute:.3f} ms/step"
                                       f"<br>loss diff vs plain {r.get('loss_diff', float('nan')):.3g}"
                                       "<extra></extra>"))
    fig.add_hline(y=0, line=dict(color="grey", dash="dot"))
    base_layout(fig, "compression: bytes saved vs time added")
    fig.update_layout(showlegend=True, legend=dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top"),
                      margin=dict(r=220))
    fig.update_xaxes(title="bytes saved per step (MiB = 2^20 bytes)", range=_span(xs), zeroline=False)
    fig.update_yaxes(title="step time added vs no hook (ms)", range=_span(ys))
    return fig
