"""Buckets page: how the gradient bucket size trades launch overhead against overlap.

Why a sweep: small buckets start communicating early but pay a launch per bucket; one huge
bucket starts only after the whole backward and hides nothing. The best size sits between, and
only measuring several finds it. Numbers come from `dpcore.read.analysis.bucket_sweep` (on
`job_summary`), the figure from `dpcore.read.plots.buckets`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read.analysis import bucket_sweep, compression
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.formulas import FORMULAS
from dpcore.read.dashboard.table_cells import bucket_rows, compression_rows, table_height
from dpcore.read.plots.buckets import bucket_figure
from dpcore.read.plots.comm_hooks import compression_figure
from dpcore.read.rundir.load import Run

INTRO = "How the gradient bucket size trades launch overhead against overlap."


@st.cache_data(show_spinner=False, max_entries=16)
def sweep(_run: Run, run_key: tuple) -> pd.DataFrame:
    """The bucket-size sweep of the run's bucketed jobs (`bucket_sweep`)."""
    return bucket_sweep(data.cached_summary(_run, run_key), _run.jobs)


@st.cache_data(show_spinner=False, max_entries=16)
def sweep_chart(_run: Run, run_key: tuple) -> go.Figure:
    return bucket_figure(sweep(_run, run_key))


@st.cache_data(show_spinner=False, max_entries=16)
def compressed(_run: Run, run_key: tuple) -> pd.DataFrame:
    """The run's comm-hook jobs against their plain torch_ddp job (`compression`)."""
    return compression(_run.jobs, data.cached_summary(_run, run_key), _run.collectives)


def render_compression(run: Run) -> None:
    """Bytes saved against time added, when the run has comm-hook jobs."""
    df = compressed(run, data.key(run))
    if df.empty:
        return
    st.subheader("Compression (DDP comm hooks)")
    st.plotly_chart(compression_figure(df), key=f"ch-{run.path}")
    ms = lambda label: st.column_config.NumberColumn(label, format="%.2f")  # noqa: E731
    st.dataframe(compression_rows(df), hide_index=True, width="stretch", placeholder=EMPTY, column_config={
        "world_size": st.column_config.NumberColumn("world size", format="%d"),
        "bucket_mb": st.column_config.TextColumn("bucket cap"),
        "saved_pct": st.column_config.NumberColumn("saved %", format="%.1f%%"),
        "collectives": st.column_config.NumberColumn("collectives", format="%d"),
        "step_ms": ms("step_ms"), "plain_step_ms": ms("plain_step_ms"), "added_ms": ms("added_ms"),
        "compress_ms": st.column_config.NumberColumn("compress_ms", format="%.3f"),
        "decompress_ms": st.column_config.NumberColumn("decompress_ms", format="%.3f"),
        "loss_after_steps": st.column_config.NumberColumn("loss_after_steps", format="%d"),
        "loss": st.column_config.NumberColumn("loss", format="%.4f"),
        "plain_loss": st.column_config.NumberColumn("plain_loss", format="%.4f"),
        "loss_diff": st.column_config.NumberColumn("loss_diff", format="%.2e")})
    st.caption("bytes_in: the plain torch_ddp job's bytes per step (every gradient, handed to the hook); "
               "bytes_wire: what the hook's collectives sent per step; added_ms = step T - plain step T "
               "(below 0: compression pays on this network); compress_ms / decompress_ms: the hook's own "
               "compute per step (median over ranks and timed steps), apart from its collectives (run.json "
               "hook_compress_ms / hook_decompress_ms); loss_diff = loss - plain_loss after loss_after_steps "
               "optimizer steps (same seed and data: the compression's effect). Row none: the plain job.")


def render(run: Run) -> None:
    """Step time and exposed comm against bucket size, when the run swept bucket sizes."""
    key = data.key(run)
    df = sweep(run, key)
    if df.empty:
        # no sweep: one line saying so, and the compression panel (if any) takes the page
        st.info("This run has no bucket sweep (run with several --bucket-mb values, or --bucket-sweep).")
        render_compression(run)
        return
    st.plotly_chart(sweep_chart(run, key), key=f"bk-{run.path}")
    if not df.empty:
        shown = bucket_rows(df)
        st.dataframe(shown, hide_index=True, width="stretch", height=table_height(len(shown)), placeholder=EMPTY,
                     column_config={
            "bucket_mb": st.column_config.TextColumn("bucket cap", help="Gradient bucket cap (MiB = 2^20 bytes)."),
            "comm_ops": st.column_config.NumberColumn("all-reduces per step", format="%d",
                                                      help="How many buckets the gradients made."),
            "step_ms": st.column_config.NumberColumn("step T (ms)", help=FORMULAS["step_ms"], format="%.2f"),
            "exposed_ms": st.column_config.NumberColumn("exposed E (ms)", help=FORMULAS["exposed_ms"], format="%.2f"),
            "overlap_pct": st.column_config.NumberColumn("overlap %", help=FORMULAS["overlap_pct"], format="%.1f%%")})
    st.caption("Small buckets start communicating early but pay a launch per bucket; one huge bucket can only "
               f"start after the whole backward and hides nothing. {FORMULAS['exposed_ms']} {FORMULAS['step_ms']}")
    render_compression(run)


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
