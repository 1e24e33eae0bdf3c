"""Bandwidth page: all-reduce bandwidth against message size, measured like nccl-tests.

Why algbw and busbw side by side: algbw (bytes / time) is what one call achieves, busbw scales it
by the algorithm's traffic so different world sizes compare, and for a bandwidth-optimal
all-reduce it approaches the link speed. Numbers come from `dpcore.read.analysis`
(`allreduce_bandwidth`, what `summarize` prints for an all-reduce run), the figure from
`dpcore.read.plots.bandwidth`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read.analysis import allreduce_bandwidth
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.formulas import FORMULAS
from dpcore.read.dashboard.picker import run_with
from dpcore.read.dashboard.table_cells import bandwidth_rows, table_height
from dpcore.read.plots.bandwidth import bandwidth_figure
from dpcore.read.rundir.load import Run

INTRO = "All-reduce bandwidth against message size, measured like nccl-tests."


@st.cache_data(show_spinner=False, max_entries=16)
def bandwidth(_run: Run, run_key: tuple) -> pd.DataFrame:
    """algbw/busbw per (algorithm, world size, message size) of the run's allreduce.csv."""
    return allreduce_bandwidth(_run.allreduce)


@st.cache_data(show_spinner=False, max_entries=16)
def bandwidth_chart(_run: Run, run_key: tuple) -> go.Figure:
    return bandwidth_figure(bandwidth(_run, run_key))


def render(run: Run) -> None:
    """algbw/busbw against message size, log axes, per algorithm and world size, and the table."""
    key = data.key(run)
    df = bandwidth(run, key)
    if df.empty:  # said once: the offer of a run that has one (frame.each_run), else how to make one
        ctx = frame.context()
        if run_with(ctx.runs, "allreduce", run.path.name) is None:
            st.info("This run has no all-reduce benchmark: `python -m dpcore allreduce` measures one.")
        return
    st.plotly_chart(bandwidth_chart(run, key), key=f"bw-{run.path}")
    st.caption(f"{FORMULAS['algbw']} {FORMULAS['busbw']} busbw makes different N comparable: for a "
               "bandwidth-optimal all-reduce it approaches the link speed. Small messages are latency-bound.")
    if not df.empty:
        shown = bandwidth_rows(df)
        st.dataframe(shown, hide_index=True, width="stretch", height=table_height(len(shown)), placeholder=EMPTY,
                     column_config={
            "algbw_gbps": st.column_config.NumberColumn("algbw (GB/s)", help=FORMULAS["algbw"], format="%.3f"),
            "busbw_gbps": st.column_config.NumberColumn("busbw (GB/s)", help=FORMULAS["busbw"], format="%.3f"),
            "size": st.column_config.TextColumn("size", help="Message size in binary units (MiB = 2^20 bytes)."),
            "bytes": st.column_config.NumberColumn("bytes", format="%d")})


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
