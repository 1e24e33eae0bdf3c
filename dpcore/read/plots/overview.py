"""Step-time breakdown bars for the Overview view (input: `dpcore.read.analysis.job_summary`).

Why four stacked parts: a step's wall time T splits exactly into compute that ran alone,
compute that ran *while* communication was in flight (the overlapped comm, hidden for free),
communication nobody could hide (exposed comm E, which the step pays for), and everything else
(idle, waits, Python). Stacking them shows at a glance why `overlap`/`bucketed` beat `flat`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dpcore.read.plots.style import COMPONENT_COLORS, base_layout, empty_figure, esc, label_jobs, variant_rank

PARTS: list[tuple[str, str, str]] = [
    ("compute_only", "compute (no comm in flight)", COMPONENT_COLORS["compute"]),
    ("overlapped_ms", "overlapped comm (hidden under compute)", COMPONENT_COLORS["overlapped"]),
    ("exposed_ms", "exposed comm E = |comm \\ compute|", COMPONENT_COLORS["exposed"]),
    ("other_ms", "other (idle, waits, Python)", COMPONENT_COLORS["other"]),
]


def breakdown_figure(summary: pd.DataFrame, title: str | None = None, y_max: float | None = None) -> go.Figure:
    """Stacked bars per (variant, world size): compute-only + overlapped + exposed + other = step time.
    ``y_max``: a fixed top of the y-axis, so that two runs' charts side by side share one scale."""
    if summary is None or summary.empty:
        return empty_figure("No completed training jobs in this run.")
    df = summary.dropna(subset=["step_ms"])
    if df.empty:
        return empty_figure("No completed training jobs in this run.")
    df = df.assign(_o=variant_rank(df["variant"])).sort_values(["_o", "world_size", "bucket_mb"])
    df["label"] = label_jobs(df)
    if "gpus_shared" in df:  # ranks time-slicing one GPU: the bar is no world-size comparison
        df["label"] = df["label"].where(~df["gpus_shared"].astype("boolean").fillna(False).astype(bool),
                                        df["label"] + " (shared GPU)")
    df["compute_only"] = (df["compute_ms"] - df["overlapped_ms"]).clip(lower=0)
    fig = go.Figure()
    for col, name, color in PARTS:
        fig.add_bar(
            x=df["label"], y=df[col], name=name, marker_color=color,
            customdata=df[["step_ms", "comm_fraction", "overlap_pct"]].to_numpy(),
            hovertemplate=("%{x}<br>" + name + ": %{y:.2f} ms<br>step T: %{customdata[0]:.2f} ms"
                           "<br>comm fraction E/T: %{customdata[1]:.1%}"
                           "<br>overlap: %{customdata[2]:.0f}%<extra></extra>"),
        )
    _add_spread(fig, df, y_max)
    fig.update_layout(barmode="stack", xaxis_title="variant × world size",
                      yaxis_title="ms per step (median; whiskers p10–p90)")
    return upright_labels(base_layout(fig, title), df["label"])


#: An upper bound of one tick label character's width (px) in the dashboard's charts (Streamlit's
#: theme: 12 px Source Sans); measured: the sample run's longest label, 28 characters, 150 px.
LABEL_PX_PER_CHAR = 6.0
#: Labels are drawn upright when, even slanted at 30 degrees, they would not fit side by side in
#: a plot this wide (px): Plotly would turn them upright at any usual width anyway.
UPRIGHT_ABOVE_PX = 1200
#: Height (px) of the plot area between the top margin and the upright labels.
PLOT_AREA_PX = 285


def upright_labels(fig: go.Figure, labels: pd.Series) -> go.Figure:
    """For many long x labels: draw them upright and make room for them before Plotly measures.

    Why: with the labels' room left to Plotly's automargin, the sample run's 52 upright labels took
    199 px of the figure's 420, leaving a 136 px plot (its y-axis title cut), and the chart was laid
    out twice (once to measure the labels, once with the margins they pushed; with their
    room made first, the browser's main thread spent 491 instead of 597 ms of CPU from the page's
    commit to the first chart, docs/measurements.md). Here the bottom margin is the longest
    label's width (:data:`LABEL_PX_PER_CHAR` per character, an upper bound) plus the axis title,
    the figure grows by it so that the plot keeps :data:`PLOT_AREA_PX`, and the left margin fits
    the y-axis title. Automargin stays on: a label wider than the estimate still gets its room
    (then with the second layout pass). Fewer or shorter labels are left as Plotly lays them out."""
    n, longest = len(labels), max((len(str(x)) for x in labels), default=0)
    if n * longest * LABEL_PX_PER_CHAR * 0.87 <= UPRIGHT_ABOVE_PX:  # 0.87: cos 30 degrees
        return fig
    top = fig.layout.margin.t or 0
    bottom = round(longest * LABEL_PX_PER_CHAR) + 40  # tick padding, title standoff, title line
    fig.update_layout(margin=dict(b=bottom, l=80), height=top + PLOT_AREA_PX + bottom)
    fig.update_xaxes(tickangle=-90)
    return fig


#: A job whose median step time is this many times the run's median job is an outlier: the
#: y-axis is not stretched for it (its bar is cut and labelled "↑ value" instead; so is any bar
#: above a shared y_max in compare mode).
OUTLIER_FACTOR = 4.0


def robust_y_max(step_ms: pd.Series, p90: pd.Series) -> float | None:
    """Top of the y-axis so that one exploded job cannot squash every other bar: the highest
    p90 among jobs whose median is within OUTLIER_FACTOR x the median job; None when no job
    is an outlier (plotly's own range is then right)."""
    med = float(step_ms.median())
    ok = step_ms <= OUTLIER_FACTOR * med
    if ok.all() or not ok.any():
        return None
    return 1.15 * float(pd.concat([step_ms[ok], p90[ok]]).max())


def _add_spread(fig: go.Figure, df: pd.DataFrame, y_max: float | None = None) -> None:
    """p10–p90 whiskers on top of each stack, a marker on noisy jobs, a capped (or given) y-axis."""
    if "step_ms_p10" not in df or "step_ms_p90" not in df:
        return
    noisy = df["noisy"].fillna(False).astype(bool) if "noisy" in df else pd.Series(False, index=df.index)
    fig.add_scatter(
        x=df["label"], y=df["step_ms"], mode="markers", name="spread p10–p90 (timed steps)",
        marker=dict(color="#444", size=5, symbol=["x" if n else "line-ew" for n in noisy]),
        error_y=dict(type="data", symmetric=False, array=(df["step_ms_p90"] - df["step_ms"]).clip(lower=0),
                     arrayminus=(df["step_ms"] - df["step_ms_p10"]).clip(lower=0), color="#444", thickness=1.2),
        customdata=df[["step_ms_p10", "step_ms_p90"]].to_numpy(), text=["noisy: p90/p10 > 1.5" if n else ""
                                                                       for n in noisy],
        hovertemplate="%{x}<br>median %{y:.2f} ms, p10 %{customdata[0]:.2f}, p90 %{customdata[1]:.2f}"
                      "<br>%{text}<extra></extra>")
    top = y_max if y_max is not None else robust_y_max(df["step_ms"], df["step_ms_p90"])
    if top is None:
        return
    fig.update_yaxes(range=[0, top])
    stack = df[[c for c, _, _ in PARTS]].clip(lower=0).sum(axis=1)
    for label, v, high in zip(df["label"], df["step_ms"], stack):
        if max(v, high) > top:
            # drawn up the cut bar itself (rotated, one bar wide): labels of neighbouring cut bars
            # can never print over each other, however many there are
            fig.add_annotation(x=label, y=top, text=f"↑ {v:,.0f} ms", showarrow=False, yanchor="top",
                               textangle=-90, font=dict(size=11, color="#b00"), bgcolor="rgba(255,255,255,0.8)",
                               name="cut")


def comparison_figure(summaries: dict[str, pd.DataFrame]) -> go.Figure:
    """Median step time of the same jobs in two (or more) runs, side by side."""
    frames = [s.assign(run=name) for name, s in summaries.items() if s is not None and not s.empty]
    if not frames:
        return empty_figure("Nothing to compare: neither run has completed training jobs.")
    df = pd.concat(frames, ignore_index=True).dropna(subset=["step_ms"])
    df = df.assign(_o=variant_rank(df["variant"])).sort_values(["_o", "world_size", "bucket_mb"], kind="stable")
    df["label"] = label_jobs(df)
    fig = go.Figure()
    for run, part in df.groupby("run", sort=False):
        fig.add_bar(x=part["label"], y=part["step_ms"], name=str(run),
                    hovertemplate="%{x}<br>step T: %{y:.2f} ms<extra>" + esc(run) + "</extra>")
    fig.update_layout(barmode="group", xaxis_title="variant × world size", yaxis_title="median step time T (ms)")
    # One category per job, shared by the runs' grouped bars: the room is for the distinct labels.
    return upright_labels(base_layout(fig, "Step time, run against run", height=360), df["label"].drop_duplicates())
