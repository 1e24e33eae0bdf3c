"""Memory pictures (input: `dpcore.read.analysis.memory`): the memory/communication trade.

Why a scatter first: choosing between DDP, ZeRO-1 and FSDP is trading memory per rank for
step time (more communication); one marker per job at (step time, peak memory per rank) shows
the whole trade in one picture: down is less memory, left is faster. The stacked bars then say
what the memory is made of (parameters, gradients, optimizer state, other), with the peak as a
marker above: the gap between the stack and the peak is activations and what the step
allocates on the way. Units are binary (MiB = 2^20 bytes).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dpcore.read.plots.style import (
    MEMORY_COLORS,
    OP_COLORS,
    OP_LABELS,
    base_layout,
    color_for,
    empty_figure,
    label_jobs,
    variant_rank,
)

MIB = float(1 << 20)
KIND_LABELS = {"param_bytes": "parameters", "grad_bytes": "gradients", "optim_bytes": "optimizer state",
               "other_bytes": "other"}
EMPTY = "No memory recorded (memory.csv has no rows: a run made before dpcore recorded memory)."


def _ordered(df: pd.DataFrame, extra: list[str]) -> pd.DataFrame:
    return df.assign(_o=variant_rank(df["variant"])).sort_values(["_o", "world_size", *extra]).drop(columns="_o")


def memory_tradeoff_figure(jobs: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Peak bytes per rank (MiB, mean over ranks) against step time T (ms, p10–p90 whiskers):
    one marker per job, coloured and labelled by variant (``job_memory`` rows)."""
    if jobs is None or jobs.empty:
        return empty_figure(EMPTY)
    df = _ordered(jobs, ["job_id"])
    fig = go.Figure()
    for variant, part in df.groupby("variant", sort=False):
        t = part["step_ms"].astype(float)
        spread = {}
        if {"step_ms_p10", "step_ms_p90"} <= set(part.columns):
            spread = dict(error_x=dict(type="data", symmetric=False, thickness=1.2,
                                       array=(part["step_ms_p90"] - t).clip(lower=0).fillna(0),
                                       arrayminus=(t - part["step_ms_p10"]).clip(lower=0).fillna(0)))
        labels = label_jobs(df).loc[part.index].tolist()
        fig.add_scatter(
            x=t, y=part["peak_bytes"] / MIB, mode="markers+text", text=labels, textposition="top center",
            name=str(variant), marker=dict(size=12, color=color_for(str(variant)), line=dict(width=1, color="#333")),
            customdata=np.column_stack([part["job_id"].astype(str), part["held_bytes"] / MIB,
                                        part["peak_bytes_max"] / MIB]),
            hovertemplate=("%{customdata[0]}<br>step T %{x:.2f} ms<br>peak %{y:.2f} MiB per rank (mean; max "
                           "%{customdata[2]:.2f})<br>held %{customdata[1]:.2f} MiB<extra></extra>"),
            **spread)
    fig.update_xaxes(title="step time T (ms, median; whiskers p10–p90)", rangemode="tozero")
    fig.update_yaxes(title="peak memory per rank (MiB)", rangemode="tozero")
    return base_layout(fig, title, height=460)


def memory_breakdown_figure(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Stacked MiB per (job, rank): parameters, gradients, optimizer state, other; the peak as a
    black diamond (``memory_table`` rows)."""
    if table is None or table.empty:
        return empty_figure(EMPTY)
    df = _ordered(table, ["job_id", "rank"])
    # one bar per (job, rank): the bucket size joins the label where a variant ran with several,
    # else the jobs of a bucket sweep would stack on one bar
    x = [f"{lab} · r{int(r)}" for lab, r in zip(label_jobs(df), df["rank"])]
    fig = go.Figure()
    for col, label in KIND_LABELS.items():
        mib = df[col].astype(float) / MIB
        fig.add_bar(x=x, y=mib, name=label, marker_color=MEMORY_COLORS[col], customdata=df["job_id"],
                    hovertemplate=f"%{{customdata}} %{{x}}<br>{label}: %{{y:.3f}} MiB<extra></extra>")
    fig.add_scatter(x=x, y=df["peak_bytes"].astype(float) / MIB, mode="markers", name="peak",
                    marker=dict(symbol="diamond", size=10, color="black"), customdata=df["peak_method"],
                    hovertemplate="%{x}<br>peak %{y:.3f} MiB (%{customdata})<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="MiB per rank", rangemode="tozero")
    fig.update_xaxes(tickangle=-30)
    return base_layout(fig, title, height=460)


def volume_figure(volume: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Bus MiB per rank per step, measured (stacked by collective) with the expected total as an
    open diamond (``comm_volume`` rows)."""
    if volume is None or volume.empty:
        return empty_figure("No collectives recorded in this run's training steps.")
    df = _ordered(volume, ["job_id"])
    jobs = list(dict.fromkeys(df["job_id"].astype(str)))
    x = jobs  # job ids name the bucket size where it matters (bucketed-ws2-b25)
    fig = go.Figure()
    for op in OP_COLORS:
        part = df[df["op"] == op].set_index("job_id")
        if part.empty or not (part["bus_bytes_per_step"] > 0).any():
            continue
        y = [float(part.at[j, "bus_bytes_per_step"]) / MIB if j in part.index else 0.0 for j in jobs]
        fig.add_bar(x=x, y=y, name=OP_LABELS[op], marker_color=OP_COLORS[op],
                    hovertemplate=f"%{{x}}<br>{OP_LABELS[op]}: %{{y:.3f}} bus MiB per step<extra></extra>")
    expected = df.groupby("job_id", sort=False)["expected_bus_bytes_per_step"].sum(min_count=1).reindex(jobs) / MIB
    fig.add_scatter(x=x, y=expected, mode="markers", name="expected",
                    marker=dict(symbol="diamond-open", size=12, color="black", line=dict(width=2)),
                    hovertemplate="%{x}<br>expected %{y:.3f} bus MiB per step<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="bus MiB per rank per step", rangemode="tozero")
    return base_layout(fig, title, height=420)
