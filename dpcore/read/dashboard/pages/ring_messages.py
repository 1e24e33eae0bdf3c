"""Ring messages page: every point-to-point message of the from-scratch all-reduces, the
space-time diagram beside the classic ring picture.

Why two pictures side by side: the space-time diagram (one lane per rank, arrows from send to
receive) shows *when* bytes move and where ranks wait; the circle stepped through with a slider
shows *where* each chunk goes at each ring step. The chunk heatmap then shows what every rank
holds after each step; together they explain why every rank ends with the full sum after
2(N−1) steps while sending only 2(N−1)/N of the tensor.

For an all-reduce benchmark run a "step" is one message size (the benchmark's step k is its k-th
size), so the picker is labelled "Message size" and shows bytes in binary units. Numbers come
from `dpcore.read.analysis` (ring wait/transfer, chunk matrix, message counts), the figures from
`dpcore.read.plots.ring` and `dpcore.read.plots.ring_circle`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dpcore.contract.units import binary_size, exact_size
from dpcore.read import analysis
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.chunks import chunk_cells
from dpcore.read.dashboard.formulas import FORMULAS
from dpcore.read.plots.ring import (
    aggregate_pieces,
    chunk_figure,
    message_count_figure,
    message_figure,
    wait_transfer_figure,
)
from dpcore.read.plots.ring_circle import ring_circle_figure
from dpcore.read.plots.style import esc
from dpcore.read.rundir.load import Run

INTRO = "Every point-to-point message of the from-scratch all-reduce algorithms."

ALGO_NOTES = {
    "ring": "Ring: 2(N−1) steps, each rank sends one 1/N chunk per step to its right neighbour "
            "(reduce-scatter adds, all-gather copies): 2N(N−1) chunk messages in all (each split into sub-messages "
            "when a chunk is large, to pipeline), bandwidth-optimal.",
    "naive": "Naive: every rank sends its whole tensor to every other rank: N(N−1) full-size messages.",
    "central": "Central: everything is gathered to rank 0, reduced there and broadcast back: rank 0 is the "
               "bottleneck, its link carries 2(N−1) full tensors.",
}
LABEL_SIZES = [0, 8, 10, 12, 14, 16]


@st.cache_data(show_spinner=False, max_entries=16)
def ring_step_times(_run: Run, run_key: tuple) -> pd.DataFrame:
    """Wait and transfer per ring step of every ring all-reduce of the run."""
    return analysis.ring_step_times(_run.messages)


@st.cache_data(show_spinner=False, max_entries=16)
def message_counts(_run: Run, run_key: tuple) -> pd.DataFrame:
    """Messages and bytes per all-reduce call, per job."""
    return analysis.message_counts(_run.messages)


@st.cache_data(show_spinner=False, max_entries=16)
def chunk_matrix(world_size: int) -> pd.DataFrame:
    """What each rank holds after each ring step (depends on the world size only)."""
    return analysis.chunk_matrix(world_size)


@st.cache_data(show_spinner=False, max_entries=32)
def messages_chart(_run: Run, run_key: tuple, job_id: str, step: int, call: int, title: str,
                   show_pieces: bool = False, label_size: int = 0) -> go.Figure:
    """The space-time diagram of one all-reduce call."""
    m = _run.messages
    sel = m[(m["job_id"] == job_id) & (m["step"] == step) & (m["call"] == call)]
    return message_figure(sel, title, show_pieces, label_size)


def _call_times(run: Run, run_key: tuple, job_id: str, step: int, call: int) -> pd.DataFrame:
    """The ring step times of one call (of one step, for runs that record it)."""
    t = ring_step_times(run, run_key)
    t = t[(t["job_id"] == job_id) & (t["call"] == call)]
    return t[t["step"] == step] if "step" in t.columns else t


@st.cache_data(show_spinner=False, max_entries=16)
def circle_chart(_run: Run, run_key: tuple, job_id: str, step: int, call: int, world_size: int,
                 chunk_bytes: str | None, label_size: int) -> go.Figure:
    """The ring circle of one call, stepped through with a slider."""
    return ring_circle_figure(world_size, _call_times(_run, run_key, job_id, step, call), chunk_matrix(world_size),
                              chunk_bytes, label_size)


@st.cache_data(show_spinner=False, max_entries=32)
def wait_transfer_chart(_run: Run, run_key: tuple, job_id: str, step: int, call: int) -> go.Figure:
    """Wait against transfer per ring step of one call."""
    return wait_transfer_figure(_call_times(_run, run_key, job_id, step, call))


@st.cache_data(show_spinner=False, max_entries=16)
def chunks_chart(world_size: int) -> go.Figure:
    """The chunk heatmap with its step slider."""
    return chunk_figure(chunk_cells(chunk_matrix(world_size), world_size), world_size)


@st.cache_data(show_spinner=False, max_entries=16)
def counts_chart(_run: Run, run_key: tuple) -> go.Figure:
    """Messages per all-reduce call, per job."""
    return message_count_figure(message_counts(_run, run_key))


def _pick(label: str, options: list, key: str, default=None, **kw):
    index = options.index(default) if default in options else 0
    return st.selectbox(label, options, index=index, key=key, **kw)


def benchmark_sizes(run: Run, job: str) -> dict[int, int]:
    """{step: message bytes} of an all-reduce benchmark job (step k = its k-th size: run.json's
    config `sizes`, else the job's rows of allreduce.csv in size order); {} for a training job."""
    jobs = run.jobs
    kind = jobs.loc[jobs["job_id"] == job, "kind"]
    if kind.empty or kind.iloc[0] != "allreduce":
        return {}
    cfg = run.meta.get("config") if isinstance(run.meta, dict) else None
    sizes = cfg.get("sizes") if isinstance(cfg, dict) else None
    if isinstance(sizes, list) and all(isinstance(b, int) for b in sizes):
        return dict(enumerate(sizes))
    ar = run.allreduce
    rows = ar[ar["job_id"] == job] if ar is not None and not ar.empty else pd.DataFrame(columns=["bytes"])
    return dict(enumerate(sorted(int(b) for b in rows["bytes"].unique())))


def _chunk_bytes(sel: pd.DataFrame) -> str | None:
    """Size of one ring chunk (a reduce-scatter send with its sub-messages summed), as text."""
    agg = aggregate_pieces(sel)
    sends = agg[(agg["side"] == "send") & (agg["phase"] == "reduce_scatter")] if agg is not None else agg
    return binary_size(sends["bytes"].max()) if sends is not None and not sends.empty else None


def render(run: Run) -> None:
    """Message lanes for one job/step/call beside the ring circle, wait vs transfer per ring step,
    chunk slider, message counts."""
    msgs = run.messages
    if msgs.empty:
        st.info("This run recorded no point-to-point messages: run the `ring`, `central` variants or "
                "`python -m dpcore allreduce --algos ring,naive,central` to see them.")
        return
    key = data.key(run)
    counts = message_counts(run, key)
    jobs = list(dict.fromkeys(counts["job_id"])) if not counts.empty else sorted(msgs["job_id"].unique())
    ring_jobs = [j for j, a in zip(counts["job_id"], counts["algo"]) if a == "ring"] if not counts.empty else []
    c1, c2, c3 = st.columns([2, 1, 1])
    with c1:
        job = _pick("Job", jobs, f"rg-job-{run.path}", ring_jobs[-1] if ring_jobs else None)
    jm = msgs[msgs["job_id"] == job]
    sizes = benchmark_sizes(run, job)
    steps = sorted(int(s) for s in jm["step"].unique())
    if sizes:
        step = c2.selectbox("Message size", steps, index=len(steps) - 1, key=f"rg-step-{run.path}-{job}",
                            format_func=lambda s: binary_size(sizes.get(s)),
                            help="The all-reduce benchmark records one call per message size.")
    else:
        step = c2.selectbox("Step", steps, key=f"rg-step-{run.path}-{job}", help="The training step.")
    jm = jm[jm["step"] == step]
    call = c3.selectbox("All-reduce call", sorted(int(c) for c in jm["call"].unique()),
                        key=f"rg-call-{run.path}-{job}-{step}")
    sel = jm[jm["call"] == call]
    algo = str(sel["algo"].iloc[0]) if not sel.empty else "?"
    ws = int(max(sel["src"].max(), sel["dst"].max()) + 1) if not sel.empty else 1
    o1, o2 = st.columns([1, 2])
    pieces = o1.toggle("Show sub-messages", key=f"rg-pieces-{run.path}",
                       help="The pipelined ring sends a large chunk as several sub-messages; off: one arrow per "
                            "(chunk, ring step) with its sub-messages aggregated.")
    label_size = o2.select_slider("Label size", LABEL_SIZES, value=10, key=f"rg-label-{run.path}",
                                  format_func=lambda v: "off" if v == 0 else f"{v} px")
    logical = len(aggregate_pieces(sel)) // 2
    what = (f"message size {exact_size(sizes[step])}" if step in sizes
            else f"step {step} · call {call}")
    title = f"{esc(job)} · {esc(algo)} · {what}<br>{logical} messages" + (f" in {len(sel) // 2} sub-messages"
                                                               if len(sel) // 2 > logical else "")
    fig = messages_chart(run, key, job, step, call, title, pieces, label_size)
    if algo == "ring" and ws >= 2:
        left, right = st.columns([3, 2])
        left.plotly_chart(fig, key=f"rg-{run.path}-{job}")
        with right:
            st.plotly_chart(circle_chart(run, key, job, step, call, ws, _chunk_bytes(sel), label_size),
                            key=f"rg-circle-{run.path}-{job}-{ws}")
            st.caption("The ring: at each step every rank sends one chunk to its clockwise neighbour. Move the "
                       "slider through reduce-scatter (the receiver adds) and all-gather (the receiver copies).")
    else:
        st.plotly_chart(fig, key=f"rg-{run.path}-{job}")
    st.caption("Each rank is a lane. A message is a bar on the sender (orange, above the lane centre: isend posted → "
               "done) and on the receiver (teal, below: irecv posted → done), joined by an arrow coloured by phase. "
               + ALGO_NOTES.get(algo, ""))
    if algo == "ring":
        left, right = st.columns(2)
        with left:
            st.markdown("**Wait vs transfer per ring step**")
            st.plotly_chart(wait_transfer_chart(run, key, job, step, call), key=f"rg-wt-{run.path}-{job}")
            st.caption(FORMULAS["ring_wait"])
        with right:
            st.markdown(f"**Which chunk each rank holds (N = {ws})**")
            st.plotly_chart(chunks_chart(ws), key=f"rg-ch-{run.path}-{ws}")
            st.caption("Move the slider through the steps. A cell counts how many ranks' gradients the rank's copy "
                       "of that chunk already sums; after reduce-scatter each rank owns one complete chunk (N), "
                       "all-gather then copies the complete chunks around the ring.")
    st.markdown("**Messages per all-reduce call, per job**")
    st.plotly_chart(counts_chart(run, key), key=f"rg-cnt-{run.path}")
    st.caption(" ".join(ALGO_NOTES.values()))


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
