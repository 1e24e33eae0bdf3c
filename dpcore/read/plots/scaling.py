"""Scaling curves (input: `dpcore.read.analysis.scaling`): step time, throughput, speedup, efficiency.

Why the ideal line: speedup only means something next to what perfect scaling would give (N for
both weak and strong scaling as dpcore defines them); efficiency next to 1.0. Oversubscribed
points (more busy threads than cores) are drawn hollow with an ×: their slowdown is the machine's,
not the algorithm's, and a reader must not blame the ring for it. Points whose ranks shared a GPU
(``gpus_shared``) are drawn as open diamonds in the step-time and throughput panels and have no
speedup or efficiency (``analysis.scaling`` leaves them empty): processes taking turns on one GPU
are not a scaling point.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dpcore.read.plots.style import base_layout, color_for, empty_figure, esc, legend_right

PANELS: list[tuple[str, str]] = [
    ("step_ms", "step time T (ms), p10–p90 whiskers"), ("throughput", "throughput (samples/s)"),
    ("speedup", "speedup S(N)"), ("efficiency", "efficiency"),
]


def shared_ranges(frames: list[pd.DataFrame]) -> tuple[tuple[str, float], ...]:
    """One y-axis top per panel over several runs' scaling frames (compare mode), so the same
    height means the same value in both runs' charts; p90 whiskers and the ideal lines count."""
    tops: dict[str, float] = {}
    for df in frames:
        if df is None or df.empty:
            continue
        for col, _ in PANELS:
            cols = [c for c in (col, "step_ms_p90" if col == "step_ms" else "",
                                "ideal_speedup" if col == "speedup" else "") if c and c in df]
            top = float(pd.concat([df[c] for c in cols]).max()) if cols else float("nan")
            if col == "efficiency":
                top = max(top, 1.0)
            if pd.notna(top):
                tops[col] = max(tops.get(col, 0.0), top)
    return tuple((c, v * 1.08) for c, v in tops.items())


def scaling_figure(df: pd.DataFrame, mode: str = "weak", run_label: str | None = None,
                   ranges: tuple[tuple[str, float], ...] = ()) -> go.Figure:
    """2×2 panels against world size N, one line per variant, ideal speedup/efficiency dashed.
    ``ranges``: (panel column, y top) pairs from :func:`shared_ranges` (compare mode)."""
    if df is None or df.empty:
        return empty_figure("Scaling needs a variant measured at two or more world sizes.")
    fig = make_subplots(rows=2, cols=2, subplot_titles=[t for _, t in PANELS], horizontal_spacing=0.1,
                        vertical_spacing=0.16)
    df = df.sort_values(["variant", "world_size"])
    oversub = df.get("oversubscribed", pd.Series(False, index=df.index)).fillna(False).astype(bool)
    shared = df.get("gpus_shared", pd.Series(False, index=df.index)).astype("boolean").fillna(False).astype(bool)
    for i, (col, title) in enumerate(PANELS):
        row, c = divmod(i, 2)
        for variant, part in df.groupby("variant", sort=True):
            ov, sh = oversub.loc[part.index], shared.loc[part.index]
            spread = {}
            if col == "step_ms" and {"step_ms_p10", "step_ms_p90"} <= set(part.columns):
                spread = dict(error_y=dict(type="data", symmetric=False, thickness=1.2,
                                           array=(part["step_ms_p90"] - part["step_ms"]).clip(lower=0),
                                           arrayminus=(part["step_ms"] - part["step_ms_p10"]).clip(lower=0)))
            fig.add_scatter(**spread,
                x=part["world_size"], y=part[col], mode="lines+markers", name=str(variant),
                legendgroup=str(variant), showlegend=i == 0, line=dict(color=color_for(str(variant))),
                marker=dict(size=9, symbol=["diamond-open" if s else "x-open" if o else "circle"
                                            for o, s in zip(ov, sh)]),
                customdata=[(" (oversubscribed)" if o else "")
                            + (" (ranks shared a GPU: no scaling point)" if s else "") for o, s in zip(ov, sh)],
                hovertemplate=f"{esc(variant)}<br>N=%{{x}}<br>{title}: %{{y:.3g}}%{{customdata}}<extra></extra>",
                row=row + 1, col=c + 1,
            )
    ns = sorted(df["world_size"].unique())
    ideal = (df.groupby("world_size")["ideal_speedup"].first().reindex(ns) if "ideal_speedup" in df
             else pd.Series(ns, ns))
    fig.add_scatter(x=ns, y=ideal.to_numpy(), mode="lines", name="ideal", line=dict(color="black", dash="dash"),
                    legendgroup="ideal", row=2, col=1)
    fig.add_scatter(x=ns, y=[1.0] * len(ns), mode="lines", name="ideal", line=dict(color="black", dash="dash"),
                    legendgroup="ideal", showlegend=False, row=2, col=2)
    if oversub.any():
        fig.add_scatter(x=[None], y=[None], mode="markers", name="× = oversubscribed",
                        marker=dict(symbol="x-open", color="black", size=9), row=1, col=1)
    if shared.any():
        fig.add_scatter(x=[None], y=[None], mode="markers", name="◇ = ranks shared a GPU",
                        marker=dict(symbol="diamond-open", color="black", size=9), row=1, col=1)
    fig.update_xaxes(title="world size N", tickvals=ns)
    tops = dict(ranges)
    for i, (col, _) in enumerate(PANELS):
        if col in tops:
            row, c = divmod(i, 2)
            fig.update_yaxes(range=[0, tops[col]], row=row + 1, col=c + 1)
    title = f"{mode} scaling" + (f" · {run_label}" if run_label else "")
    return legend_right(base_layout(fig, title, height=620))
