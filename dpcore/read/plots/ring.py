"""Ring-message pictures (inputs: `messages.csv` rows, `ring_step_times`, `message_counts`, `chunk_matrix`).

Why: the ring all-reduce is easiest to understand by watching it. Each rank is a lane; every
point-to-point message is a bar on the sender (isend posted → done) and on the receiver (irecv
posted → done) in two different colours, joined by an arrow from send start to receive end. The
arrows of reduce-scatter and all-gather get different colors, so the 2(N−1) steps and their
chunk-sized messages are countable, and the same picture for `naive` (N(N−1) whole-tensor
messages) or `central` (everything through rank 0) shows why the ring wins on bandwidth. The
pipelined ring splits a large chunk into sub-messages; drawn one by one they are a tangle, so
by default each (chunk, ring step) is one arrow with its sub-messages aggregated.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dpcore.contract.messages import pair_messages
from dpcore.contract.runformat import MESSAGE_KEY
from dpcore.contract.units import binary_size
from dpcore.read.plots.labels import spaced_labels
from dpcore.read.plots.style import PHASE_COLORS, SIDE_COLORS, base_layout, color_for, empty_figure, esc

MAX_MESSAGES = 3000
#: Bar patterns by phase, in the order phases first appear: the bar colour says send or receive.
PATTERNS = ["", "/", "x", ".", "+"]
SIDE_LABEL = {"send": "send", "recv": "receive"}  # bars run from isend/irecv posted to done


def aggregate_pieces(msgs: pd.DataFrame) -> pd.DataFrame:
    """One row per logical message and side: the pipelined ring sends a chunk as S sub-messages
    sharing one key (``MESSAGE_KEY``); they become one bar from the first post to the last
    completion, with the bytes summed and ``pieces`` = S. Reshaping only."""
    if msgs is None or msgs.empty:
        return msgs
    keys = [k for k in MESSAGE_KEY if k in msgs.columns] + ["rank", "side"]
    g = msgs.groupby(keys, sort=False, dropna=False)
    out = g.agg(t_post_ns=("t_post_ns", "min"), t_done_ns=("t_done_ns", "max"), bytes=("bytes", "sum"),
                pieces=("t_post_ns", "size")).reset_index()
    return out


def message_figure(msgs: pd.DataFrame, title: str | None = None, show_pieces: bool = False,
                   label_size: int = 0) -> go.Figure:
    """Lanes per rank: send bars above the lane centre, receive bars below (different colours),
    one arrow per message from send start to receive end, coloured by phase. Sub-messages of a
    pipelined chunk are drawn as one message unless ``show_pieces``; ``label_size`` > 0 writes
    the chunk on each arrow."""
    if msgs is None or msgs.empty:
        return empty_figure("No point-to-point messages for this selection.")
    msgs = msgs.head(2 * MAX_MESSAGES)
    if "pieces" not in msgs:
        msgs = msgs.assign(pieces=1) if show_pieces else aggregate_pieces(msgs)
    t0 = float(msgs["t_post_ns"].min())
    df = msgs.assign(start=(msgs["t_post_ns"] - t0) / 1e6, end=(msgs["t_done_ns"] - t0) / 1e6)
    df["y"] = df["rank"] + np.where(df["side"] == "send", -0.18, 0.18)
    fig = go.Figure()
    labels: list[tuple[float, float, str, str]] = []
    for i, (phase, part) in enumerate(df.groupby("phase", sort=False)):
        for side in ("send", "recv"):
            p = part[part["side"] == side]
            if p.empty:
                continue
            fig.add_bar(
                y=p["y"], x=(p["end"] - p["start"]).clip(lower=1e-4), base=p["start"], orientation="h", width=0.3,
                marker=dict(color=SIDE_COLORS[side], line=dict(color=color_for(str(phase), PHASE_COLORS), width=1),
                            pattern=dict(shape=PATTERNS[i % len(PATTERNS)], fgcolor="white", solidity=0.3)),
                name=f"{SIDE_LABEL[side]} · {phase}", legendgroup=f"{phase}-{side}",
                customdata=np.column_stack([p["src"], p["dst"], p["chunk"], [binary_size(b) for b in p["bytes"]],
                                            p["ring_step"] + 1, p["end"] - p["start"], p["pieces"]]),
                hovertemplate=(f"{esc(phase)} {esc(side)}" + "<br>rank %{customdata[0]} → rank %{customdata[1]}, chunk "
                               "%{customdata[2]}<br>%{customdata[3]} in %{customdata[6]} sub-message(s), ring step "
                               "%{customdata[4]}<br>%{customdata[5]:.3f} ms<extra></extra>"))
        labels += _add_arrows(fig, part, color_for(str(phase), PHASE_COLORS), str(phase), label_size)
    ranks = sorted(int(r) for r in df["rank"].unique())
    height = max(300, 110 * len(ranks) + 140)
    if labels:
        _add_labels(fig, labels, (float(df["start"].min()), float(df["end"].max())),
                    (min(ranks) - 0.5, max(ranks) + 0.5), height, label_size)
    fig.update_yaxes(tickvals=ranks, ticktext=[f"rank {r}" for r in ranks], autorange="reversed", title=None)
    fig.update_xaxes(title="ms since the first message was posted")
    fig.update_layout(barmode="overlay")
    return base_layout(fig, title, height=height)


#: Plot-area width (px) the space-time diagram gets in its column (3/5 of the page): labels are
#: spaced for this width or less.
DIAGRAM_PLOT_PX = 560.0


def _add_labels(fig: go.Figure, labels: list[tuple[float, float, str, str]], x_range: tuple[float, float],
                y_range: tuple[float, float], height: int, size: int) -> None:
    """The chunk labels that are clear of each other (:func:`spaced_labels`), one text trace per
    colour; a label crowded out is still in the bars' hover."""
    xs, ys, texts, colors = zip(*labels)
    # y grows downwards on the lanes' reversed axis: distances are what matter, not the direction
    kept = spaced_labels(xs, ys, texts, x_range, y_range, (DIAGRAM_PLOT_PX, max(height - 180.0, 100.0)))
    for color in dict.fromkeys(colors):
        pick = [i for i, (c, k) in enumerate(zip(colors, kept)) if c == color and k]
        if pick:
            fig.add_scatter(x=[xs[i] for i in pick], y=[ys[i] for i in pick], mode="text",
                            text=[kept[i] for i in pick], textposition="top center",
                            textfont=dict(size=size, color=color), showlegend=False, hoverinfo="skip")


def _add_arrows(fig: go.Figure, part: pd.DataFrame, color: str, phase: str,
                label_size: int = 0) -> list[tuple[float, float, str, str]]:
    """One line trace with None breaks (cheap even for thousands of arrows), arrowheads at the
    receiver; returns the chunk labels (x, y, text, colour) to place when ``label_size`` > 0."""
    keys = list(part[[k for k in MESSAGE_KEY if k in part.columns]].astype(str).itertuples(index=False))
    idx = pair_messages(keys, part["side"].tolist(), part["t_post_ns"].tolist())
    if not idx:
        return []
    snd, rcv = part.iloc[[a for a, _ in idx]], part.iloc[[b for _, b in idx]]
    n = len(idx)
    xs = np.column_stack([snd["start"], rcv["end"], np.full(n, np.nan)]).ravel()
    ys = np.column_stack([snd["y"], rcv["y"], np.full(n, np.nan)]).ravel()
    sym = np.tile(["circle", "arrow", "circle"], n)
    fig.add_scatter(x=xs, y=ys, mode="lines+markers", line=dict(color=color, width=1.5),
                    marker=dict(symbol=sym, size=np.tile([4, 11, 0], n), angleref="previous", color=color),
                    name=f"{phase} message →", legendgroup=f"{phase}-msg", hoverinfo="skip")
    if label_size <= 0:
        return []
    pieces = snd["pieces"].to_numpy() if "pieces" in snd else np.ones(n)
    text = [f"chunk {c}" + (f" ×{int(k)}" if k > 1 else "") for c, k in zip(snd["chunk"], pieces)]
    # a third of the way from the sender: the two arrows of a pair of ranks that cross at their
    # midpoints (a 2-rank ring) get their labels on different lanes
    x = snd["start"].to_numpy() + (rcv["end"].to_numpy() - snd["start"].to_numpy()) / 3
    y = snd["y"].to_numpy() + (rcv["y"].to_numpy() - snd["y"].to_numpy()) / 3
    return list(zip(x.tolist(), y.tolist(), text, [color] * n))


def wait_transfer_figure(times: pd.DataFrame) -> go.Figure:
    """Per ring step, the mean over ranks of transfer (fastest send→recv) and wait (the rest), stacked."""
    if times is None or times.empty:
        return empty_figure("No ring-step timings for this selection.")
    g = times.groupby(["phase", "ring_step"], sort=False)[["transfer_ms", "wait_ms"]].mean().reset_index()
    order = {"reduce_scatter": 0, "all_gather": 1}
    g = g.sort_values(["phase", "ring_step"], key=lambda s: s.map(order).fillna(2) if s.name == "phase" else s)
    abbrev = {"reduce_scatter": "RS", "all_gather": "AG"}
    x = [f"{abbrev.get(p, p)} {int(k) + 1}" for p, k in zip(g["phase"], g["ring_step"])]  # 1-based, as the ring
    fig = go.Figure()
    fig.add_bar(x=x, y=g["transfer_ms"], name="transfer (fastest matching send→recv)", marker_color="#4c78a8",
                hovertemplate="%{x}: transfer %{y:.3f} ms<extra></extra>")
    fig.add_bar(x=x, y=g["wait_ms"], name="wait (the rest)", marker_color="#e45756",
                hovertemplate="%{x}: wait %{y:.3f} ms<extra></extra>")
    fig.update_layout(barmode="stack", xaxis_title="ring step (RS = reduce-scatter, AG = all-gather)",
                      yaxis_title="ms (mean over ranks)")
    return base_layout(fig, None, height=320)


def message_count_figure(counts: pd.DataFrame) -> go.Figure:
    """Messages per all-reduce call per job: the N(N−1) of `naive` against the ring's 2N(N−1) chunk
    messages (times S sub-messages per chunk when a chunk is large enough to be pipelined).

    Per call (not in total) so that a training job with many steps compares fairly with a one-shot benchmark.
    """
    if counts is None or counts.empty:
        return empty_figure("No from-scratch algorithm messages in this run.")
    df = counts.sort_values(["algo", "job_id"])
    per_call = "messages_per_call" in df and df["messages_per_call"].notna().all()
    y = df["messages_per_call"] if per_call else df["messages"]
    fig = go.Figure()
    subs = df["sub_messages"] if "sub_messages" in df else df["messages"]
    fig.add_bar(x=df["job_id"], y=y, marker_color=[color_for(str(a)) for a in df["algo"]],
                customdata=np.column_stack([df["messages"], df["bytes"], subs]), name="messages",
                hovertemplate="%{x}<br>%{y:.0f} per call<br>%{customdata[0]} messages (%{customdata[2]} sub-messages), "
                              "%{customdata[1]:,} bytes in all<extra></extra>")
    fig.update_layout(xaxis_title="job", yaxis_title="messages per all-reduce call" if per_call
                      else "messages (all ranks, all calls)", showlegend=False)
    return base_layout(fig, None, height=320)


def chunk_figure(cells: pd.DataFrame, world_size: int) -> go.Figure:
    """Heatmap of rank × chunk with a slider over ring steps.

    `cells` columns: frame (str, in order), rank, chunk, count (how many ranks' data the rank's copy
    of the chunk contains, 1..N), text. A chunk is complete when count == N.
    """
    if cells is None or cells.empty:
        return empty_figure("No ring schedule for a world of one rank.")
    frames_order = list(dict.fromkeys(cells["frame"]))

    def z_text(label: str) -> tuple[np.ndarray, np.ndarray]:
        f = cells[cells["frame"] == label]
        z = f.pivot_table(index="rank", columns="chunk", values="count", aggfunc="first").reindex(
            index=range(world_size), columns=range(world_size))
        t = f.pivot_table(index="rank", columns="chunk", values="text", aggfunc="first").reindex(
            index=range(world_size), columns=range(world_size))
        return z.to_numpy(float), t.fillna("").to_numpy(str)

    def heat(label: str) -> go.Heatmap:
        z, t = z_text(label)
        return go.Heatmap(z=z, text=t, texttemplate="%{text}", zmin=1, zmax=world_size, colorscale="Blues",
                          x=[f"chunk {c}" for c in range(world_size)], y=[f"rank {r}" for r in range(world_size)],
                          colorbar=dict(title="ranks summed"),
                          hovertemplate="%{y}, %{x}: %{text}<extra></extra>")

    fig = go.Figure(data=[heat(frames_order[0])], frames=[go.Frame(data=[heat(f)], name=f) for f in frames_order])
    fig.update_layout(sliders=[dict(active=0, currentvalue=dict(prefix="after: "), pad=dict(t=40), steps=[
        dict(label=f, method="animate", args=[[f], dict(mode="immediate", frame=dict(duration=0, redraw=True),
                                                        transition=dict(duration=0))]) for f in frames_order])])
    fig.update_yaxes(autorange="reversed")
    return base_layout(fig, None, height=260 + 40 * world_size)
