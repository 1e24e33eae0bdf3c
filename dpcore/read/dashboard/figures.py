"""Cached figures: analysis result -> plotly builder -> figure, memoised per run and selection.

Why: building a plotly figure validates every property and costs 0.1–0.5 s on a busy 2-core box.
`st.cache_data` would pickle the figure, and unpickling (or handing `st.plotly_chart` a dict)
re-validates it; `st.cache_resource` hands back the very same Figure, which `st.plotly_chart` only
serialises. Nobody mutates these figures. The numbers still come from the `st.cache_data` loads
in `dpcore.read.dashboard.data`; the figures themselves from the pure `dpcore.read.plots`.
"""
from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from dpcore.read.dashboard import data
from dpcore.read.dashboard.chunks import chunk_cells
from dpcore.read.plots.bandwidth import bandwidth_figure
from dpcore.read.plots.buckets import bucket_figure
from dpcore.read.plots.overview import breakdown_figure
from dpcore.read.plots.ring import chunk_figure, message_count_figure, message_figure, wait_transfer_figure
from dpcore.read.plots.ring_circle import ring_circle_figure
from dpcore.read.plots.scaling import scaling_figure
from dpcore.read.plots.timeline import timeline_figure


@st.cache_resource(show_spinner=False, max_entries=16)
def overview(_run, run_key: tuple, y_max: float | None = None) -> go.Figure:
    return breakdown_figure(data.job_summary(_run, run_key), "Where a training step's time goes", y_max)


@st.cache_resource(show_spinner=False, max_entries=16)
def scaling(_run, run_key: tuple, mode: str, ranges: tuple = ()) -> go.Figure:
    return scaling_figure(data.scaling(_run, run_key, mode), mode, ranges=ranges)


@st.cache_resource(show_spinner=False, max_entries=16)
def buckets(_run, run_key: tuple) -> go.Figure:
    return bucket_figure(data.bucket_sweep(_run, run_key))


@st.cache_resource(show_spinner=False, max_entries=16)
def bandwidth(_run, run_key: tuple) -> go.Figure:
    return bandwidth_figure(data.bandwidth(_run, run_key))


@st.cache_resource(show_spinner=False, max_entries=32)
def timeline(_run, run_key: tuple, job_id: str, step: int) -> go.Figure:
    return timeline_figure(data.timeline(_run, run_key, job_id, step), f"{job_id} · step {step}")


@st.cache_resource(show_spinner=False, max_entries=32)
def messages(_run, run_key: tuple, job_id: str, step: int, call: int, title: str, show_pieces: bool = False,
             label_size: int = 0) -> go.Figure:
    m = _run.messages
    sel = m[(m["job_id"] == job_id) & (m["step"] == step) & (m["call"] == call)]
    return message_figure(sel, title, show_pieces, label_size)


@st.cache_resource(show_spinner=False, max_entries=16)
def ring_circle(_run, run_key: tuple, job_id: str, step: int, call: int, world_size: int, chunk_bytes: str | None,
                label_size: int) -> go.Figure:
    t = data.ring_step_times(_run, run_key)
    t = t[(t["job_id"] == job_id) & (t["call"] == call)]
    t = t[t["step"] == step] if "step" in t.columns else t
    return ring_circle_figure(world_size, t, data.chunk_matrix(world_size), chunk_bytes, label_size)


@st.cache_resource(show_spinner=False, max_entries=32)
def wait_transfer(_run, run_key: tuple, job_id: str, step: int, call: int) -> go.Figure:
    t = data.ring_step_times(_run, run_key)
    t = t[(t["job_id"] == job_id) & (t["call"] == call)]
    if "step" in t.columns:
        t = t[t["step"] == step]
    return wait_transfer_figure(t)


@st.cache_resource(show_spinner=False, max_entries=16)
def chunks(world_size: int) -> go.Figure:
    return chunk_figure(chunk_cells(data.chunk_matrix(world_size), world_size), world_size)


@st.cache_resource(show_spinner=False, max_entries=16)
def counts(_run, run_key: tuple) -> go.Figure:
    return message_count_figure(data.message_counts(_run, run_key))
