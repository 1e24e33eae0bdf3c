"""Per-rank compute/comm lanes on the shared clock (input: `dpcore.read.analysis.timeline`).

Why lane pairs: with compute directly above comm for each rank, overlap is literally visible as
orange under blue; a blocking all-reduce shows up as an orange block under an empty compute lane.
Why reduce first: a torch.profiler trace easily holds 250,000 events; a browser cannot draw that
many SVG bars, and at screen resolution most of them are sub-pixel anyway. We merge intervals of
a lane that touch within one "pixel" of time into a single bar (hover says how many ops it holds)
until each lane has at most `max_bars_per_lane` bars.
Why one colour per collective: sharded variants mix collectives in one step (FSDP all-gathers
parameters before each module's forward and backward, then reduce-scatters gradients); the comm
lane draws each family (the ``op`` column that the analysis fills) in its own colour, and bars of
different families are never merged into one. The family comes with the data: this module never
re-classifies event names (plots import only the contract and other plots).
Why other lanes on a GPU rank: there the analysis gives each launch thread and each CUDA stream a
lane, with rows of their own ``kind``; a stream lane draws compute kernels, NCCL kernels (by
collective family), memory copies and syncs in their own colours, and the launch thread's lane
in grey above the streams says what the CPU was doing while a stream sat empty.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dpcore.contract.clocksync import SYNC_MARKER
from dpcore.read.plots.style import LANE_COLORS, OP_COLORS, OP_LABELS, base_layout, empty_figure

COLS = ["rank", "lane", "name", "start_ms", "end_ms"]
#: Colours and legend names of the kinds other than compute and comm (a GPU rank's lanes).
KIND_STYLE: dict[str, tuple[str, str]] = {
    "cpu": ("CPU op (launch thread)", "#9d9d9d"), "memcpy": ("memory copy / set", "#72b7b2"),
    "sync": ("sync kernel", "#e45756"), "other": ("other GPU event", "#d8b5a5")}
#: The family a comm bar is drawn as when its row names none (no ``op`` column, or an unknown one).
OTHER = "other"


def _merge_lane(lane: pd.DataFrame, tol: float) -> pd.DataFrame:
    """Merge intervals whose start lies within `tol` ms of the running end (sorted sweep, vectorized).

    `lane` carries `ops` (how many original ops each row stands for) and `name` (the first op's name).
    """
    lane = lane.sort_values("start_ms", kind="stable")
    starts, ends = lane["start_ms"].to_numpy(float), lane["end_ms"].to_numpy(float)
    run_end = np.maximum.accumulate(ends)
    new = np.ones(len(lane), dtype=bool)
    new[1:] = starts[1:] > run_end[:-1] + tol
    g = lane.assign(_g=np.cumsum(new)).groupby("_g", sort=False)
    extra = {c: (c, "first") for c in ("op", "kind") if c in lane}
    out = g.agg(rank=("rank", "first"), lane=("lane", "first"), name=("name", "first"),
                start_ms=("start_ms", "min"), end_ms=("end_ms", "max"), ops=("ops", "sum"), **extra)
    return out.reset_index(drop=True)


def reduce_intervals(df: pd.DataFrame, max_bars_per_lane: int = 1500) -> pd.DataFrame:
    """Cap the bars per (rank, lane) by merging near-adjacent intervals; adds an `ops` count column.

    With an ``op`` column (the collective family of comm bars), only bars of one family merge."""
    df = df.assign(ops=1)
    if df.empty:
        return df
    span = float(df["end_ms"].max() - df["start_ms"].min()) or 1.0
    parts = []
    keys = ["rank", "lane"] + [c for c in ("kind", "op") if c in df]
    for _, lane in df.groupby(keys, sort=True):
        tol = span / (4 * max_bars_per_lane)
        while len(lane) > max_bars_per_lane:
            lane, tol = _merge_lane(lane, tol), tol * 2
        parts.append(lane)
    out = pd.concat(parts, ignore_index=True)
    many = out["ops"] > 1
    out["name"] = out["name"].astype(str)
    out.loc[many, "name"] = out.loc[many, "name"] + " + " + (out.loc[many, "ops"] - 1).astype(str) + " more ops"
    return out


def _lane_key(lane: str) -> tuple[int, int, str]:
    """compute, comm, then launch threads, then streams by number."""
    head, _, rest = lane.partition(" ")
    rank = {"compute": 0, "comm": 1, "thread": 2, "stream": 3}.get(head, 4)
    return rank, int(rest) if rest.isdigit() else 0, lane


def lane_order(lanes: pd.DataFrame) -> list[str]:
    """Category order top-to-bottom: rank 0's lanes (compute, comm; or its launch threads, then its
    streams), then rank 1's, ..."""
    order = []
    for r, part in lanes.groupby("rank", sort=True):
        order += [f"rank {int(r)} · {lane}" for lane in sorted(set(part["lane"].astype(str)), key=_lane_key)]
    return order


def timeline_figure(intervals: pd.DataFrame, title: str | None = None,
                    max_bars_per_lane: int = 1500) -> go.Figure:
    """Horizontal bars (base = start, length = duration): one trace for compute and one per
    collective family on the comm lanes (all-reduce, all-gather, reduce-scatter, ...); zoom with the mouse.

    ``intervals``: `dpcore.read.analysis.timeline` rows; their ``op`` column (the collective family
    of each comm row) picks the colour. Comm rows without one are drawn as ``other``."""
    if intervals is None or intervals.empty:
        return empty_figure("No intervals recorded for this job and step.")
    # dpcore's clock-sync markers are its own instrumentation, before the step: not drawn (they set
    # the axis's start a few ms before the step's 0)
    mine = intervals["name"].astype(str).str.startswith(SYNC_MARKER)
    df = intervals.loc[~mine, COLS].dropna(subset=["start_ms", "end_ms"])
    if df.empty:
        return empty_figure("No intervals recorded for this job and step.")
    kind = (intervals.loc[df.index, "kind"].fillna("").astype(str) if "kind" in intervals
            else df["lane"].astype(str))
    kind = kind.where(kind.isin(["compute", "comm", *KIND_STYLE]), "compute")
    ops = intervals.loc[df.index, "op"] if "op" in intervals else pd.Series(OTHER, index=df.index)
    ops = ops.where(ops.isin(list(OP_COLORS)), OTHER).astype(str)
    df = df.assign(kind=kind, op=ops.where(kind == "comm", ""))
    df = reduce_intervals(df, max_bars_per_lane)
    order = lane_order(df)
    fig = go.Figure()
    kinds = [("compute", "", "compute", LANE_COLORS["compute"])] + [
        ("comm", op, OP_LABELS[op], OP_COLORS[op]) for op in OP_COLORS] + [
        (k, "", label, color) for k, (label, color) in KIND_STYLE.items()]
    for kind, op, label, color in kinds:
        part = df[(df["kind"] == kind) & (df["op"] == op)]
        if part.empty:
            continue
        dur = (part["end_ms"] - part["start_ms"]).clip(lower=1e-4)
        fig.add_bar(
            y=[f"rank {int(r)} · {lane}" for r, lane in zip(part["rank"], part["lane"])], x=dur, base=part["start_ms"],
            orientation="h",
            name=label, marker_color=color, marker_line_width=0,
            customdata=np.column_stack([part["name"].astype(str), dur, part["start_ms"]]),
            hovertemplate="%{customdata[0]}<br>start %{customdata[2]:.3f} ms · duration %{customdata[1]:.3f} ms"
                          "<extra>%{y}</extra>",
        )
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], title=None)
    fig.update_xaxes(title="ms since the step started (shared clock)")
    fig.update_layout(barmode="overlay", bargap=0.25)
    return base_layout(fig, title, height=max(260, 35 * len(order) + 120))
