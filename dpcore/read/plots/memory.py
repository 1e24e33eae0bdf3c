"""Memory pictures (input: `dpcore.read.analysis.memory`): the memory/communication trade.

Why a scatter first: choosing between DDP, ZeRO-1 and FSDP is trading memory per rank for
step time (more communication); one marker per job at (step time, peak memory per rank) shows
the whole trade in one picture: down is less memory, left is faster. The stacked bars then say
what the memory is made of (parameters, gradients, optimizer state, other), with the peak as a
marker above. The last, hatched segment is the rest of the peak (peak − held): activations and
what the step allocates on the way, inferred rather than measured, drawn so that a GPU rank's bar
reaches its allocator peak instead of stopping at the tensors it keeps. Units are binary (MiB = 2^20 bytes).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dpcore.read.plots.labels import spaced_labels
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
#: The inferred segment (``memory_table``'s activation_bytes = peak − held).
INFERRED_LABEL = "activations + temporaries (inferred: peak − held)"
#: The measured segment above the peak (``memory_table``'s reserve_bytes = reserved − peak).
RESERVE_LABEL = "allocator reserve (reserved − peak)"
#: The trade figure's height and the plot area it leaves in a half-width column (px; a slight
#: under-estimate, so that labels judged apart are apart on screen).
TRADE_HEIGHT = 460
TRADE_PLOT_PX = (380.0, 250.0)
#: Height of one job's row in the breakdown (px): above an 11 px label's line height.
ROW_PX = 18
EMPTY = "No memory recorded (memory.csv has no rows: a run made before dpcore recorded memory)."


def _ordered(df: pd.DataFrame, extra: list[str]) -> pd.DataFrame:
    return df.assign(_o=variant_rank(df["variant"])).sort_values(["_o", "world_size", *extra]).drop(columns="_o")


def memory_tradeoff_figure(jobs: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Peak bytes per rank (MiB, mean over ranks) against step time T (ms, p10–p90 whiskers):
    one marker per job, coloured by variant, labelled where the label is clear of the others
    (:func:`dpcore.read.plots.labels.spaced_labels`; hover names every job) (``job_memory`` rows)."""
    if jobs is None or jobs.empty:
        return empty_figure(EMPTY)
    df = _ordered(jobs, ["job_id"])
    names = label_jobs(df)
    t_all, peak_all = df["step_ms"].astype(float), df["peak_bytes"].astype(float) / MIB
    right = df["step_ms_p90"].astype(float).fillna(t_all) if "step_ms_p90" in df else t_all
    x_range = (0.0, 1.08 * float(np.nanmax([right.max(), t_all.max(), 1e-9])))
    y_range = (0.0, 1.18 * float(np.nanmax([peak_all.max(), 1e-9])))
    shown = pd.Series(spaced_labels(t_all.tolist(), peak_all.tolist(), names.tolist(), x_range, y_range,
                                    TRADE_PLOT_PX), index=df.index)
    fig = go.Figure()
    for variant, part in df.groupby("variant", sort=False):
        t = part["step_ms"].astype(float)
        spread = {}
        if {"step_ms_p10", "step_ms_p90"} <= set(part.columns):
            spread = dict(error_x=dict(type="data", symmetric=False, thickness=1.2,
                                       array=(part["step_ms_p90"] - t).clip(lower=0).fillna(0),
                                       arrayminus=(t - part["step_ms_p10"]).clip(lower=0).fillna(0)))
        fig.add_scatter(
            x=t, y=part["peak_bytes"] / MIB, mode="markers+text", text=shown.loc[part.index].tolist(),
            textposition="top center", textfont=dict(size=11),
            name=str(variant), marker=dict(size=12, color=color_for(str(variant)), line=dict(width=1, color="#333")),
            customdata=np.column_stack([names.loc[part.index], part["held_bytes"] / MIB,
                                        part["peak_bytes_max"] / MIB]),
            hovertemplate=("%{customdata[0]}<br>step T %{x:.2f} ms<br>peak %{y:.2f} MiB per rank (mean; max "
                           "%{customdata[2]:.2f})<br>held %{customdata[1]:.2f} MiB<extra></extra>"),
            **spread)
    fig.update_xaxes(title="step time T (ms, median; whiskers p10–p90)", range=list(x_range))
    fig.update_yaxes(title="peak memory per rank (MiB)", range=list(y_range))
    return base_layout(fig, title, height=TRADE_HEIGHT)


def memory_breakdown_figure(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Stacked MiB a rank holds per job (mean over its ranks): parameters, gradients, optimizer
    state, other, then the inferred rest of the peak (activations and temporaries, hatched), then
    on GPU ranks that recorded it the allocator's reserve above the peak (dotted); the largest
    rank's peak as a black diamond (``memory_table`` rows).

    Why horizontal, one row per job: the job names are long and a sweep has dozens of jobs; as
    rows, every name gets its own line (ROW_PX apart, more than a label's height) instead of
    slanted x labels printed over each other. Ranks of one job hold nearly the same (the hover
    gives the smallest and largest rank's total)."""
    if table is None or table.empty:
        return empty_figure(EMPTY)
    df = _ordered(table, ["job_id", "rank"])
    df = df.assign(_label=label_jobs(df).to_numpy(), _total=df[list(KIND_LABELS)].astype(float).sum(axis=1) / MIB)
    kinds = list(KIND_LABELS)
    per = df.groupby("job_id", sort=False).agg(
        label=("_label", "first"), ranks=("rank", "nunique"), lo=("_total", "min"), hi=("_total", "max"),
        peak=("peak_bytes", "max"), method=("peak_method", "first"),
        **{k: (k, "mean") for k in kinds})
    rest = (df["activation_bytes"] if "activation_bytes" in df else
            (df["peak_bytes"].astype(float) - df[kinds].astype(float).sum(axis=1)).clip(lower=0))
    per["activation_bytes"] = rest.astype(float).groupby(df["job_id"], sort=False).mean()
    reserve = df["reserve_bytes"].astype(float) if "reserve_bytes" in df else pd.Series(np.nan, index=df.index)
    per["reserve_bytes"] = reserve.groupby(df["job_id"], sort=False).mean()
    y = per["label"].tolist()
    fig = go.Figure()
    for col, label in KIND_LABELS.items():
        fig.add_bar(y=y, x=per[col].astype(float) / MIB, name=label, orientation="h", marker_color=MEMORY_COLORS[col],
                    customdata=np.column_stack([per["ranks"], per["lo"], per["hi"]]),
                    hovertemplate=(f"%{{y}}<br>{label}: %{{x:.3f}} MiB (mean of %{{customdata[0]}} ranks; held "
                                   "%{customdata[1]:.3f}–%{customdata[2]:.3f} MiB by rank)<extra></extra>"))
    if (per["activation_bytes"] > 0).any():
        fig.add_bar(y=y, x=per["activation_bytes"] / MIB, name=INFERRED_LABEL, orientation="h",
                    marker=dict(color="#e8e3f2", line=dict(color="#9d8fc4", width=1), pattern_shape="/",
                                pattern_fgcolor="#9d8fc4"),
                    hovertemplate="%{y}<br>activations + temporaries: %{x:.3f} MiB (peak − held: inferred, "
                                  "not measured)<extra></extra>")
    if (per["reserve_bytes"] > 0).any():
        fig.add_bar(y=y, x=per["reserve_bytes"] / MIB, name=RESERVE_LABEL, orientation="h",
                    marker=dict(color="#f2f2f2", line=dict(color="#7f7f7f", width=1), pattern_shape="."),
                    hovertemplate="%{y}<br>allocator reserve: %{x:.3f} MiB (torch.cuda.max_memory_reserved − "
                                  "peak: cached by the allocator, not handed out)<extra></extra>")
    fig.add_scatter(y=y, x=per["peak"].astype(float) / MIB, mode="markers", name="peak (largest rank)",
                    marker=dict(symbol="diamond", size=9, color="black"), customdata=per["method"].fillna(""),
                    hovertemplate="%{y}<br>peak %{x:.3f} MiB (%{customdata})<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="MiB per rank", rangemode="tozero")
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=11), automargin=True)
    height = max(TRADE_HEIGHT, int(ROW_PX * len(per)) + 170)
    return base_layout(fig, title, height=height)


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
