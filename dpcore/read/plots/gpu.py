"""GPU time pictures (input: `dpcore.read.analysis.gpu_time` rows, as `dpcore.read.tables.run_gpu`
returns them): the ledger of each window as one stacked bar, and the host causes of idle time.

Why one bar per window that sums to its span: the ledger's parts are disjoint (compute, then the
rest of the busy time, then idle split by who was late), so a bar whose length is the span shows
at a glance how much of the GPU's time was work; the whole trace and each traced step get their
own bar, so a step that differs from the others stands out. Why the causes as a separate bar
chart: host idle is the GPU waiting for the CPU, and what the CPU was in at the time (the
optimizer, a DataLoader iteration, ``aten::item``) is the lever a user pulls.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dpcore.read.plots.style import base_layout, empty_figure

#: The ledger's disjoint parts, stacked in this order (column, legend name, colour): together they
#: are the window's span.
LEDGER_PARTS: tuple[tuple[str, str, str], ...] = (
    ("compute_ms", "compute", "#4c78a8"),
    ("non_compute_ms", "non-compute (comm, copies)", "#72b7b2"),
    ("idle_host_ms", "GPU idle: host (CPU late)", "#e45756"),
    ("idle_device_ms", "GPU idle: device (queued)", "#bab0ac"),
)
#: Height of one bar's row (px).
ROW_PX = 34
#: Host causes drawn per chart (the rest are summed into one bar).
TOP_CAUSES = 8


def window_label(step: int | float | str) -> str:
    """A ledger row's window as the chart names it: the whole trace, or the traced step."""
    return "whole trace" if int(step) < 0 else f"step {int(step)}"


#: Longest cause label drawn (the hover names the op in full).
LABEL_CHARS = 34


def short_cause(cause: str) -> str:
    """A cause as a tick label: its end where it is long (an autograd op's name ends in what it
    runs, ``...evaluate_function: AddmmBackward0``), with "…" in front."""
    return cause if len(cause) <= LABEL_CHARS else "…" + cause[-(LABEL_CHARS - 1):]


def ledger_figure(ledger: pd.DataFrame, title: str | None = None) -> go.Figure:
    """One horizontal stacked bar per (rank, window) of ``ledger``: compute + non-compute + host
    idle + device idle = the window's span (ms); the hover gives each part's share of the span."""
    if ledger is None or ledger.empty:
        return empty_figure("No GPU events in this job's traces.")
    df = ledger.sort_values(["rank", "step"]).reset_index(drop=True)
    y = [f"rank {int(r)} · {window_label(s)}" for r, s in zip(df["rank"], df["step"])]
    span = df["span_ms"].astype(float).to_numpy()
    fig = go.Figure()
    for col, name, color in LEDGER_PARTS:
        ms = df[col].astype(float).to_numpy()
        pct = np.divide(100 * ms, span, out=np.zeros_like(ms), where=span > 0)
        fig.add_bar(y=y, x=ms, name=name, orientation="h", marker_color=color,
                    customdata=np.column_stack([pct, span]),
                    hovertemplate=(f"%{{y}}<br>{name}: %{{x:.3f}} ms (%{{customdata[0]:.1f}} % of the "
                                   "%{customdata[1]:.3f} ms span)<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="ms of the window (first GPU event start to last end)", rangemode="tozero")
    fig.update_yaxes(autorange="reversed", automargin=True)
    return base_layout(fig, title, height=max(220, ROW_PX * len(df) + 150))


def causes_figure(causes: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Host idle ms per cause (what the CPU was in while the GPU waited), largest first: the top
    :data:`TOP_CAUSES` and the rest summed. ``causes``: one window's rows (cause, idle_ms)."""
    if causes is None or causes.empty:
        return empty_figure("No host idle: the GPU never waited for the CPU in this window.")
    per = causes.groupby("cause", sort=False)["idle_ms"].sum().sort_values(ascending=False)
    top = per.head(TOP_CAUSES)
    if len(per) > TOP_CAUSES:
        top = pd.concat([top, pd.Series({f"{len(per) - TOP_CAUSES} other causes": per.iloc[TOP_CAUSES:].sum()})])
    labels = [short_cause(c) for c in top.index.astype(str)]
    fig = go.Figure()
    fig.add_bar(y=labels, x=top.to_numpy(float), orientation="h", marker_color=LEDGER_PARTS[2][2],
                customdata=np.asarray(top.index.astype(str), dtype=object), name="host idle",
                hovertemplate="%{customdata}<br>%{x:.3f} ms of host idle<extra></extra>")
    fig.update_xaxes(title="ms of host idle", rangemode="tozero")
    fig.update_yaxes(autorange="reversed", automargin=True)
    return base_layout(fig, title, height=max(220, 30 * len(top) + 150))


def kernel_figure(kernels: pd.DataFrame, title: str | None = None) -> go.Figure:
    """GPU event time (ms) per kernel class of one rank (`gpu_kernels.kernel_rows` rows; a
    class with several dtypes is one bar per dtype), largest first; hover gives calls and share,
    and for a row with FLOPs its TFLOP/s and efficiency over the calls they cover."""
    if kernels is None or kernels.empty:
        return empty_figure("No GPU kernels in this rank's trace.")
    df = kernels.sort_values("total_ms", ascending=False)
    labels = [f"{c} ({d})" if d else str(c) for c, d in zip(df["kernel_class"], df["dtype"].fillna(""))]
    rate = [f"; {t:.2f} TFLOP/s over {int(n)} of its calls ({e:.1f} % of the peak)" if pd.notna(t) and pd.notna(e)
            else f"; {t:.2f} TFLOP/s over {int(n)} of its calls" if pd.notna(t) else ""
            for t, e, n in zip(df.get("tflops", pd.Series(np.nan, df.index)),
                               df.get("eff_pct", pd.Series(np.nan, df.index)),
                               df.get("flops_calls", pd.Series(0, df.index)))]
    fig = go.Figure()
    fig.add_bar(y=labels, x=df["total_ms"].astype(float), orientation="h", marker_color=LEDGER_PARTS[0][2],
                name="GPU time", customdata=np.column_stack([df["calls"], df["share_pct"].astype(float),
                                                             np.asarray(rate, dtype=object)]),
                hovertemplate="%{y}<br>%{x:.3f} ms in %{customdata[0]} calls (%{customdata[1]:.1f} % of GPU "
                              "event time)%{customdata[2]}<extra></extra>")
    fig.update_xaxes(title="ms of GPU event time (whole trace)", rangemode="tozero")
    fig.update_yaxes(autorange="reversed", automargin=True)
    return base_layout(fig, title, height=max(220, 30 * len(df) + 150))
