"""Shared look of every dpcore figure: one color per variant/algorithm and per time component.

Why: the same variant must have the same color in every view, so a student can follow `ring`
from the overview to the scaling curve without reading legends twice.
"""
from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dpcore.contract.units import mib_size

VARIANT_COLORS: dict[str, str] = {
    "single": "#7f7f7f", "manual": "#bcbd22", "naive": "#d62728", "flat": "#ff7f0e", "central": "#8c564b",
    "ring": "#1f77b4", "overlap": "#17becf", "bucketed": "#2ca02c", "torch_ddp": "#9467bd",
    "data_parallel": "#e377c2", "native": "#9467bd",
    "zero1": "#aec7e8", "torch_zero1": "#c5b0d5", "fsdp": "#98df8a", "torch_fsdp": "#ffbb78",
}
COMPONENT_COLORS: dict[str, str] = {
    "compute": "#4c78a8", "overlapped": "#72b7b2", "exposed": "#e45756", "other": "#bab0ac",
}
LANE_COLORS: dict[str, str] = {"compute": "#4c78a8", "comm": "#f58518"}
PHASE_COLORS: dict[str, str] = {
    "reduce_scatter": "#e45756", "all_gather": "#4c78a8", "gather": "#f58518", "broadcast": "#54a24b",
    "exchange": "#b279a2",
}
#: Bars of the message picture: a send and its receive must never look alike.
SIDE_COLORS: dict[str, str] = {"send": "#f58518", "recv": "#72b7b2"}
VARIANT_ORDER = ["single", "manual", "data_parallel", "naive", "flat", "central", "ring", "overlap", "bucketed",
                 "torch_ddp", "zero1", "torch_zero1", "fsdp", "torch_fsdp"]
#: One color per collective (``dpcore.read.traces.kinds.comm_op``), so the Timeline shows
#: FSDP's all-gathers and reduce-scatters apart from DDP's all-reduces. All-reduce keeps the comm
#: lane's orange; none is the compute blue.
OP_COLORS: dict[str, str] = {
    "all_reduce": "#f58518", "all_gather": "#b279a2", "reduce_scatter": "#e45756", "broadcast": "#54a24b",
    "send_recv": "#9d755d", "other": "#bab0ac",
}
OP_LABELS: dict[str, str] = {
    "all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
    "broadcast": "broadcast", "send_recv": "send/recv", "other": "other comm",
}
#: Memory kinds (memory.csv), stacked in this order: what the model is, what backward adds,
#: what the optimizer keeps, and the rest.
MEMORY_COLORS: dict[str, str] = {
    "param_bytes": "#4c78a8", "grad_bytes": "#f58518", "optim_bytes": "#54a24b", "other_bytes": "#bab0ac",
}
FALLBACK = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def color_for(name: str, table: dict[str, str] = VARIANT_COLORS) -> str:
    """Stable color for a name: the table's entry, else a hash-picked fallback (stable across runs)."""
    if name in table:
        return table[name]
    return FALLBACK[sum(map(ord, str(name))) % len(FALLBACK)]


def esc(value: object) -> str:
    """Run text as plotly shows it literally: ``<``, ``>`` and ``&`` as entities (plotly renders
    a subset of HTML -- ``<a href>``, ``<b>``, ``<br>`` -- in titles, ticks, legends, hovers and
    text, and decodes entities back), ``%`` as ``&#37;`` so that a value pasted into a
    hovertemplate cannot become a ``%{...}`` placeholder. Job ids, variants, phases, event
    names and run names come from files anyone can edit: every builder passes them through
    this before they meet its own markup (:func:`escape_data` does it for the data arrays)."""
    return html.escape(str(value), quote=False).replace("%", "&#37;")


#: Trace fields whose strings plotly renders as text (ticks of category axes, bar text, hovers,
#: legend names).
_TEXT_FIELDS = ("x", "y", "text", "hovertext", "customdata", "name", "legendgroup")


def _esc_values(v: Any) -> Any:
    """``v`` with every str escaped (scalars, lists, tuples and numpy object arrays, nested);
    numbers, dates and numeric arrays untouched (nothing to render as markup)."""
    if isinstance(v, str):
        return esc(v)
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in "OUS":
            return v
        return np.vectorize(lambda x: esc(x) if isinstance(x, (str, bytes)) else x, otypes=[object])(v) if v.size else v
    if isinstance(v, (list, tuple)):
        return type(v)(_esc_values(x) for x in v)
    return v


def escape_data(fig: go.Figure) -> go.Figure:
    """Escape (:func:`esc`) every string in the figure's data arrays, its frames' data, its
    category axes' tick values/texts and orders, and its annotations (subplot titles name jobs).

    Why one pass over the finished figure: the data is where run text lands (a job id as an x
    category, an event name in customdata), and a builder cannot forget a field. Titles and
    hovertemplates hold dpcore's own markup (``<br>``, ``<sup>``): builders escape the run text
    they put there with :func:`esc`. Called by :func:`base_layout`, which every builder ends with."""
    traces = [*fig.data, *(t for f in (fig.frames or ()) for t in f.data)]
    for tr in traces:
        for f in _TEXT_FIELDS:
            v = tr[f] if f in tr else None
            if v is not None:
                tr[f] = _esc_values(v)
    for ax in [k for k in fig.layout if k.startswith(("xaxis", "yaxis"))]:
        a = fig.layout[ax]
        for f in ("categoryarray", "tickvals", "ticktext"):
            if a[f] is not None:
                a[f] = _esc_values(a[f])
    for ann in fig.layout.annotations or ():
        if ann.text is not None:
            ann.text = esc(ann.text)
    return fig


def base_layout(fig: go.Figure, title: str | None = None, height: int = 420) -> go.Figure:
    """Common margins/legend so figures line up in the page and stay readable in screenshots,
    and every string of the figure's data escaped (:func:`escape_data`).

    A two-line title (``<br>``) gets more room and is anchored lower: plotly measures a
    top-anchored multi-line title from its last line, which would clip the first one."""
    two = bool(title) and "<br>" in str(title)
    fig.update_layout(
        title=dict(text=title, x=0.01, xanchor="left", y=0.93 if two else 0.99, yref="container",
                   yanchor="top") if title else None,
        height=height + (50 if two else 0), template="plotly_white",
        margin=dict(l=60, r=20, t=(135 if two else 85) if title else 60, b=50),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0, traceorder="normal"),
        hovermode="closest",
    )
    return escape_data(fig)


def legend_right(fig: go.Figure) -> go.Figure:
    """Vertical legend right of the plot: subplot titles own the space above the panels."""
    fig.update_layout(legend=dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top"),
                      margin=dict(r=170, t=fig.layout.margin.t or 60))
    return fig


def empty_figure(message: str, height: int = 240) -> go.Figure:
    """A figure that says why there is nothing to draw (instead of an empty axis box)."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=14))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return base_layout(fig, height=height)


def variant_rank(variants: pd.Series) -> pd.Series:
    """Sort key in docs/DESIGN.md's teaching order: baseline first, then blocking, then overlapping variants."""
    return variants.map({v: i for i, v in enumerate(VARIANT_ORDER)}).fillna(len(VARIANT_ORDER))


def job_label(variant: object, world_size: Any, bucket_mb: object = None, show_bucket: bool = False) -> str:
    """Short x-axis label of a job: 'ring ×4' or 'bucketed ×2 · 5 MiB' (binary units, as everywhere)."""
    label = f"{variant} ×{int(world_size)}" if world_size == world_size and world_size is not None else str(variant)
    if show_bucket and bucket_mb is not None and bucket_mb == bucket_mb:
        label += f" · {mib_size(bucket_mb)}"
    return label


def label_jobs(jobs: pd.DataFrame) -> pd.Series:
    """Labels of a frame's jobs (variant, world_size, bucket_mb columns); the bucket size is shown
    only for variants that were run with several, so each job of a bucket sweep gets its own."""
    if not len(jobs):
        return pd.Series(dtype=object)
    multi = jobs.groupby("variant")["bucket_mb"].transform("nunique") > 1
    labels = pd.Series([job_label(v, w, b, bool(m)) for v, w, b, m in
                        zip(jobs["variant"], jobs["world_size"], jobs["bucket_mb"], multi)], index=jobs.index)
    if "job_id" in jobs and labels.duplicated().any():
        labels = _distinct(labels, jobs["job_id"].astype(str))
    return labels


def _distinct(labels: pd.Series, ids: pd.Series) -> pd.Series:
    """Labels shared by several jobs (a comm-hook job beside its plain torch_ddp job: same variant,
    world size and bucket) told apart: the job with the shortest id keeps the label, the others
    add what their id adds to it ("torch_ddp ×2 · 1 MiB · fp16"). On a category axis two jobs of
    one label would be drawn as one bar."""
    out = labels.copy()
    for _, group in labels.groupby(labels):
        if len(group) < 2:
            continue
        base = min(ids[group.index], key=len)
        for i in group.index:
            if ids[i] != base:
                extra = ids[i][len(base) + 1:] if ids[i].startswith(base + "-") else ids[i]
                out[i] = f"{labels[i]} · {extra}"
    return out


def mib_ticks(sizes: Iterable[Any], most: int = 10) -> dict:
    """A log axis's ticks at the given sizes in MiB, labelled in binary units ("256 KiB",
    "25 MiB"), at most ``most`` of them (every k-th, the largest kept): plotly's own log ticks
    label the minor steps by their first digit only ("2 5 1 2 5 10")."""
    vals = sorted({float(v) for v in sizes if v == v and v is not None and float(v) > 0})
    step = -(-len(vals) // most) if vals else 1
    vals = vals[::-1][::step][::-1]
    return dict(tickmode="array", tickvals=vals, ticktext=[mib_size(v) for v in vals])
