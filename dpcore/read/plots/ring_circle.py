"""The classic ring all-reduce picture: ranks on a circle, one frame per ring step.

Why next to the space-time diagram: the diagram shows *when* bytes move, but the idea of the
ring is *where*: at every step each rank sends one chunk to its right neighbour and receives one
from its left (Patarasuk & Yuan 2009), so every link is busy and none carries more than 1/N of
the tensor per step. The frames come from :func:`dpcore.contract.ringplan.ring_schedule` (the
plan the ring executes); measured transfer/wait per step and the chunks each rank holds complete
(`chunk_matrix`) are added when given. Pure: DataFrames in, a plotly figure with a slider out.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dpcore.contract.ringplan import ring_schedule
from dpcore.read.plots.style import PHASE_COLORS, base_layout, color_for, empty_figure

PHASE_LABEL = {"reduce_scatter": "reduce-scatter", "all_gather": "all-gather"}
PHASE_OP = {"reduce_scatter": "adds it to its copy", "all_gather": "replaces its copy"}
NODE_COLOR = "#4c78a8"


def _angle(rank: int, n: int) -> float:
    """Rank 0 at the top, the ring running clockwise."""
    return math.pi / 2 - 2 * math.pi * rank / n


def _arc(src: int, n: int, radius: float = 1.0, points: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """Points of the arc from rank src to src+1 along the circle, trimmed clear of both nodes."""
    a0, span = _angle(src, n), -2 * math.pi / n
    trim = min(0.35, abs(span) * 0.22)
    t = np.linspace(a0 - trim, a0 + span + trim, points)
    return radius * np.cos(t), radius * np.sin(t)


def _frame_name(phase: str, k: int) -> str:
    return f"{PHASE_LABEL.get(phase, phase)} step {k + 1}"


def _short(phase: str, k: int) -> str:
    """Slider tick label: 'RS 1', 'AG 2' (the full name is the figure's title)."""
    return f"{ {'reduce_scatter': 'RS', 'all_gather': 'AG'}.get(phase, phase)} {k + 1}"


def _outward(angle: float) -> str:
    """Text position that puts a label outside the circle at this angle (clear of the arc)."""
    x, y = math.cos(angle), math.sin(angle)
    vert = "top" if y > 0.5 else "bottom" if y < -0.5 else "middle"
    horiz = "right" if x > 0.3 else "left" if x < -0.3 else "center"
    return f"{vert} {horiz}"


def _step_note(times: pd.DataFrame | None, phase: str, k: int) -> str:
    if times is None or times.empty:
        return ""
    t = times[(times["phase"] == phase) & (times["ring_step"] == k)]
    if t.empty:
        return ""
    return f"<br><sup>measured: transfer {t['transfer_ms'].mean():.3f} ms, wait {t['wait_ms'].mean():.3f} ms</sup>"


def _frame_traces(n: int, phase: str, k: int, label_size: int, chunk_text: str,
                  complete: dict[int, str]) -> list[go.Scatter]:
    """Arcs (one line trace, None breaks), arrowheads, chunk labels, and the rank nodes."""
    plan = [s for s in ring_schedule(n) if s.phase == phase and s.ring_step == k]
    color = color_for(phase, PHASE_COLORS)
    xs, ys, hx, hy, hang, lx, ly, lt, lpos = [], [], [], [], [], [], [], [], []
    for s in plan:
        x, y = _arc(s.rank, n)
        xs += [*x, None]
        ys += [*y, None]
        hx.append(x[-1])
        hy.append(y[-1])
        hang.append(math.degrees(math.atan2(x[-1] - x[-2], y[-1] - y[-2])))  # plotly: clockwise from north
        mid = _angle(s.rank, n) - math.pi / n
        lx.append(1.08 * math.cos(mid))
        ly.append(1.08 * math.sin(mid))
        lt.append(f"chunk {s.send_chunk}{chunk_text}")
        lpos.append(_outward(mid))
    arcs = go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=color, width=3), hoverinfo="skip", showlegend=False)
    heads = go.Scatter(x=hx, y=hy, mode="markers", marker=dict(symbol="arrow", size=16, angle=hang, color=color),
                       hoverinfo="skip", showlegend=False)
    labels = go.Scatter(x=lx, y=ly, mode="text", text=lt if label_size > 0 else [""] * len(lt), textposition=lpos,
                        textfont=dict(size=max(label_size, 1), color=color),
                        hovertext=[f"rank {s.rank} → rank {s.dst}: chunk {s.send_chunk} "
                                   f"({PHASE_LABEL.get(phase, phase)}; "
                                   f"rank {s.dst} {PHASE_OP.get(phase, 'receives it')})" for s in plan],
                        hoverinfo="text", showlegend=False)
    ang = [_angle(r, n) for r in range(n)]
    nodes = go.Scatter(
        x=[math.cos(a) for a in ang], y=[math.sin(a) for a in ang], mode="markers+text",
        marker=dict(size=46, color=NODE_COLOR, line=dict(color="white", width=2)),
        text=[f"rank {r}" for r in range(n)], textfont=dict(color="white", size=max(label_size - 1, 9)),
        hovertext=[f"rank {r}: complete chunks {complete.get(r) or 'none yet'}" for r in range(n)],
        hoverinfo="text", showlegend=False)
    return [arcs, heads, labels, nodes]


def ring_circle_figure(world_size: int, times: pd.DataFrame | None = None, matrix: pd.DataFrame | None = None,
                       chunk_bytes: str | None = None, label_size: int = 12) -> go.Figure:
    """Ranks on a circle; a slider steps through the 2(N−1) ring steps, each drawing the N chunk
    transfers (rank r → r+1) of that step. ``times``: `ring_step_times` rows of one call (adds the
    measured transfer/wait to each step's title); ``matrix``: `chunk_matrix(N)` (which chunks
    each rank holds complete, in the node's hover); ``chunk_bytes``: the size of one chunk, as text."""
    n = int(world_size)
    if n < 2:
        return empty_figure("A ring needs at least 2 ranks.")
    steps = [(p, k) for p in ("reduce_scatter", "all_gather") for k in range(n - 1)]
    chunk_text = f" ({chunk_bytes})" if chunk_bytes else ""
    frames = []
    for phase, k in steps:
        done: dict[int, str] = {}
        if matrix is not None and not matrix.empty and "complete" in matrix:
            m = matrix[(matrix["phase"] == phase) & (matrix["ring_step"] == k)]
            done = {int(r): str(c) for r, c in zip(m["rank"], m["complete"])}
        name = _frame_name(phase, k)
        frames.append(go.Frame(data=_frame_traces(n, phase, k, label_size, chunk_text, done), name=name,
                               layout=dict(title_text=name + _step_note(times, phase, k))))
    fig = go.Figure(data=frames[0].data, frames=frames)
    prefix = "ring step (RS = reduce-scatter, AG = all-gather): "
    animate = dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))
    fig.update_layout(sliders=[dict(active=0, currentvalue=dict(prefix=prefix), pad=dict(t=10), steps=[
        dict(label=_short(*st), method="animate", args=[[f.name], animate])
        for st, f in zip(steps, frames)])])
    fig.update_xaxes(visible=False, range=[-2.1, 2.1], scaleanchor="y")
    fig.update_yaxes(visible=False, range=[-1.5, 1.5])
    base_layout(fig, frames[0].layout.title.text, height=460)
    # two-line titles (step name + measured times): anchored a little lower so the first line
    # is not clipped at the top of the chart's container
    fig.update_layout(margin=dict(l=10, r=10, t=95, b=10), title_y=0.95)
    return fig
