"""What-if figures (inputs: `dpcore.read.whatif.predict` frames). Pure plotly, no st.* calls.

Why three pictures: the breakdown says what the step would be made of (compute, comm hidden
under backward, comm exposed after it); the replayed timeline shows why (which bucket waits for
which gradients, and for the bucket before it); the sweep puts the prediction on the same axes
as what the run measured, so the model's error is visible, not just claimed.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dpcore.contract.units import mib_size, ranks_text
from dpcore.read.plots.style import COMPONENT_COLORS, LANE_COLORS, base_layout, empty_figure, legend_right, mib_ticks

#: Stacked parts of a predicted step, bottom to top: (column, legend, color).
PARTS = [("compute_only_ms", "compute (no comm in flight)", COMPONENT_COLORS["compute"]),
         ("hidden_comm_ms", "hidden comm (under backward)", COMPONENT_COLORS["overlapped"]),
         ("exposed_comm_ms", "exposed comm", COMPONENT_COLORS["exposed"]),
         ("other_ms", "other (bookkeeping)", COMPONENT_COLORS["other"]),
         # the source's measured step the replay of its own plan misses, carried to every cell
         ("unexplained_ms", "unexplained (source's measured step minus its replay)", "#9d755d")]
MEASURED = dict(symbol="diamond", size=12, color="#000000")
#: A measured cell outside its predicted band: the model missed by more than it admits.
OUTSIDE = dict(symbol="x", size=13, color="#d62728", line=dict(width=1, color="#d62728"))


def _label(mb: float) -> str:
    return mib_size(mb)


def _outside(df: pd.DataFrame) -> pd.Series:
    """Rows whose measured step lies outside [step_ms_lo, step_ms_hi] (False without a band)."""
    if not {"measured_step_ms", "step_ms_lo", "step_ms_hi"} <= set(df.columns):
        return pd.Series(False, index=df.index)
    m = df["measured_step_ms"]
    return (m.notna() & ((m < df["step_ms_lo"]) | (m > df["step_ms_hi"]))).astype(bool)


def stacked_parts(cells: pd.DataFrame) -> pd.DataFrame:
    """The parts :func:`breakdown_figure` stacks, per cell, adding up to its predicted step_ms.

    compute_only_ms = compute − hidden comm. The anchor's ``unexplained_ms`` is what the source's
    measured step adds to the replay: stacked as a block where positive; where negative (the source
    ran faster than its replay) a negative block cannot be stacked, so it is folded: every other part
    is scaled by step_ms / (step_ms − unexplained_ms), the anchor ratio, and ``folded`` is True
    (the legend then says "x anchor"). ``other_ms`` is taken as what is left of the step after the
    other parts (never below 0), so the stack is the prediction."""
    df = cells.assign(compute_only_ms=(cells["compute_ms"] - cells["hidden_comm_ms"]).clip(lower=0), folded=False)
    if "unexplained_ms" not in df:
        return df
    replayed = df["step_ms"] - df["unexplained_ms"]
    neg = (df["unexplained_ms"] < 0) & (replayed > 0)
    scale = (df["step_ms"] / replayed).where(neg, 1.0)
    for col in ("compute_only_ms", "hidden_comm_ms", "exposed_comm_ms", "other_ms"):
        df[col] = df[col] * scale
    df.loc[neg, "unexplained_ms"] = 0.0
    df["folded"] = neg
    parts = df[["compute_only_ms", "hidden_comm_ms", "exposed_comm_ms"]].sum(axis=1)
    rest = df["step_ms"] - df["unexplained_ms"] - parts
    df["other_ms"] = rest.clip(lower=0)
    # compute and exposed comm are medians over different rank-steps: where they overrun the
    # step's median, compute gives up the excess (the stack is the prediction, not more)
    df["compute_only_ms"] = (df["compute_only_ms"] + rest.clip(upper=0)).clip(lower=0)
    return df


def breakdown_figure(cells: pd.DataFrame, chosen_mb: float | None = None) -> go.Figure:
    """Stacked predicted step per bucket size (WHATIF_COLUMNS rows of one world size), with the
    run's measured step time of the same cell as a black diamond."""
    if cells is None or cells.empty:
        return empty_figure("Nothing to predict.")
    df = stacked_parts(cells.sort_values("bucket_mb"))
    x = [_label(b) for b in df["bucket_mb"]]
    fig = go.Figure()
    folded = "unexplained_ms" in df and bool(df["folded"].any())
    for col, name, color in PARTS:
        if col not in df or (col == "unexplained_ms" and not (df[col] > 0).any()):
            continue  # rows of a model without the anchor; an anchor below 1 is folded into the parts
        if folded and col != "unexplained_ms":
            name += " (x anchor)"
        fig.add_bar(x=x, y=df[col], name=name, marker_color=color,
                    hovertemplate=name + ": %{y:.1f} ms<extra></extra>")
    if {"step_ms_lo", "step_ms_hi"} <= set(df.columns):
        fig.add_scatter(x=x, y=df["step_ms"], mode="markers", name="band (spread x model error)",
                        marker=dict(size=1, color="#333333"), customdata=df[["step_ms_lo", "step_ms_hi"]],
                        error_y=dict(type="data", array=df["step_ms_hi"] - df["step_ms"],
                                     arrayminus=df["step_ms"] - df["step_ms_lo"], color="#333333", thickness=1.5),
                        hovertemplate="band %{customdata[0]:.1f} to %{customdata[1]:.1f} ms<extra></extra>")
    meas = df["measured_step_ms"].notna() if "measured_step_ms" in df else pd.Series(False, index=df.index)
    out = _outside(df)
    for sel, name, marker in ((meas & ~out, "measured step (same cell)", MEASURED),
                              (out, "measured, outside the band", OUTSIDE)):
        if sel.any():
            fig.add_scatter(x=[xi for xi, m in zip(x, sel) if m], y=df.loc[sel, "measured_step_ms"], mode="markers",
                            name=name, marker=marker, hovertemplate="measured %{y:.1f} ms<extra></extra>")
    if chosen_mb is not None and chosen_mb in set(df["bucket_mb"]):
        fig.add_annotation(x=_label(chosen_mb), y=float(df.loc[df["bucket_mb"] == chosen_mb, "step_ms"].iloc[0]),
                           text="chosen", showarrow=True, arrowhead=2, ay=-30)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="bucket size", type="category")
    fig.update_yaxes(title="predicted step (ms)", rangemode="tozero")
    return legend_right(base_layout(fig, None, height=380))


def replay_figure(lanes: pd.DataFrame) -> go.Figure:
    """The replayed step: one row per rank (forward, backward, optimizer) and one comm row of
    buckets; a tick where each bucket became ready on every rank. Input: ``replay_lanes``."""
    if lanes is None or lanes.empty:
        return empty_figure("No replay to draw.")
    fig = go.Figure()
    colors = {"forward": "#9ecae9", "backward": LANE_COLORS["compute"], "optimizer": "#54a24b",
              "bucket": LANE_COLORS["comm"], "bookkeeping": COMPONENT_COLORS["other"]}
    bars = lanes[lanes["kind"] != "ready"]
    for kind, part in bars.groupby("kind", sort=False):
        fig.add_bar(y=part["lane"], x=part["end_ms"] - part["start_ms"], base=part["start_ms"], orientation="h",
                    name=str(kind), marker_color=colors.get(str(kind), "#bab0ac"), customdata=part["label"],
                    marker_line=dict(width=0.5, color="white"),
                    hovertemplate="%{customdata}<br>%{base:.1f} to %{x:.1f} ms long<extra></extra>")
    ready = lanes[lanes["kind"] == "ready"]
    if not ready.empty:
        fig.add_scatter(y=ready["lane"], x=ready["start_ms"], mode="markers", name="bucket ready (all ranks)",
                        marker=dict(symbol="line-ns-open", size=14, color="#e45756"), customdata=ready["label"],
                        hovertemplate="%{customdata} ready at %{x:.1f} ms<extra></extra>")
    order = list(dict.fromkeys(lanes["lane"]))
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], title=None)
    fig.update_xaxes(title="ms from the step's start", rangemode="tozero")
    fig.update_layout(barmode="overlay", bargap=0.35)
    return legend_right(base_layout(fig, None, height=120 + 45 * len(order)))


def sweep_figure(pred: pd.DataFrame, measured: pd.DataFrame, x: str = "bucket_mb") -> go.Figure:
    """Predicted step time against ``x`` (bucket_mb, log axis, or world_size), one line per value
    of the other with its band shaded where ``pred`` has ``step_ms_lo``/``step_ms_hi``; the run's
    measured jobs as diamonds on the same axes, a red x where one lies outside its band."""
    if pred is None or pred.empty:
        return empty_figure("Nothing to predict.")
    other = "world_size" if x == "bucket_mb" else "bucket_mb"
    fig = go.Figure()
    for val, part in pred.sort_values(x).groupby(other, sort=True):
        name = f"predicted, {ranks_text(val) if other == 'world_size' else mib_size(val)}"
        if {"step_ms_lo", "step_ms_hi"} <= set(part.columns):
            fig.add_scatter(x=list(part[x]) + list(part[x])[::-1],
                            y=list(part["step_ms_hi"]) + list(part["step_ms_lo"])[::-1], fill="toself",
                            mode="lines", line=dict(width=0), opacity=0.2, name=f"band, {name[11:]}",
                            hoverinfo="skip")
        fig.add_scatter(x=part[x], y=part["step_ms"], mode="lines+markers", name=name,
                        hovertemplate=name + "<br>%{x:g}: %{y:.1f} ms<extra></extra>")
    if measured is not None and not measured.empty:
        band = [c for c in ("step_ms_lo", "step_ms_hi") if c in pred.columns]
        m = measured[["job_id", "world_size", "bucket_mb", "step_ms"]].merge(
            pred[["world_size", "bucket_mb", *band]], on=["world_size", "bucket_mb"], how="left")
        out = _outside(m.rename(columns={"step_ms": "measured_step_ms"}))
        for val, part in m[~out].groupby(other, sort=True):
            name = f"measured, {ranks_text(val) if other == 'world_size' else mib_size(val)}"
            fig.add_scatter(x=part[x], y=part["step_ms"], mode="markers", name=name, marker=MEASURED | {"color": None},
                            customdata=part["job_id"], hovertemplate="%{customdata}: %{y:.1f} ms<extra></extra>")
        if out.any():
            part = m[out]
            fig.add_scatter(x=part[x], y=part["step_ms"], mode="markers", name="measured, outside the band",
                            marker=OUTSIDE, customdata=part["job_id"],
                            hovertemplate="%{customdata}: %{y:.1f} ms, outside the band<extra></extra>")
    if x == "bucket_mb":
        shown = list(pred["bucket_mb"]) + (list(measured["bucket_mb"]) if measured is not None else [])
        fig.update_xaxes(type="log", title="bucket size (MiB = 2^20 bytes)", **mib_ticks(shown))
    else:
        fig.update_xaxes(type="linear", title="world size (ranks)")
    fig.update_yaxes(title="step time (ms)", rangemode="tozero")
    return legend_right(base_layout(fig, None, height=380))
