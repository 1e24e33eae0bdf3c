"""Bandwidth, Buckets and Traces views (the Ring messages view lives in views_ring.py).

Why the Traces view opens Perfetto itself: a trace is only useful once it is open in a trace
viewer; a download plus a drag-and-drop loses most readers on the way. Download names carry the
run id, so files from two runs never overwrite each other in a Downloads folder.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import streamlit as st
import streamlit.components.v1 as components

from dpcore.contract.units import EMPTY, binary_size
from dpcore.read.dashboard import data, figures
from dpcore.read.dashboard.formulas import FORMULAS
from dpcore.read.dashboard.perfetto import MAX_EMBED_BYTES, perfetto_html, too_big
from dpcore.read.dashboard.tables import bandwidth_rows, bucket_rows, table_height

def bandwidth_view(run) -> None:
    """algbw/busbw against message size, log axes, per algorithm and world size."""
    df = data.bandwidth(run, data.key(run))
    st.plotly_chart(figures.bandwidth(run, data.key(run)), key=f"bw-{run.path}")
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


def buckets_view(run) -> None:
    """Step time and exposed comm against bucket size, when the run swept bucket sizes."""
    st.plotly_chart(figures.buckets(run, data.key(run)), key=f"bk-{run.path}")
    df = data.bucket_sweep(run, data.key(run))
    if not df.empty:
        shown = bucket_rows(df)
        st.dataframe(shown, hide_index=True, width="stretch", height=table_height(len(shown)), placeholder=EMPTY,
                     column_config={
            "bucket_mb": st.column_config.TextColumn("bucket cap", help="Gradient bucket cap (MiB = 2^20 bytes)."),
            "comm_ops": st.column_config.NumberColumn("all-reduces per step", format="%d",
                                                      help="How many buckets the gradients made."),
            "step_ms": st.column_config.NumberColumn("step T (ms)", help=FORMULAS["step_ms"], format="%.2f"),
            "exposed_ms": st.column_config.NumberColumn("exposed E (ms)", help=FORMULAS["exposed_ms"], format="%.2f"),
            "overlap_pct": st.column_config.NumberColumn("overlap %", help=FORMULAS["overlap_pct"], format="%.0f%%")})
    st.caption("Small buckets start communicating early but pay a launch per bucket; one huge bucket can only "
               f"start after the whole backward and hides nothing. {FORMULAS['exposed_ms']} {FORMULAS['step_ms']}")


def download_name(run, job: str, file_name: str) -> str:
    """`<run_id>-<job_id>-rank0.json.gz`: the run id (from run.json, else the folder) keeps files of
    two runs apart; anything but letters, digits, '.', '_' and '-' becomes '_'."""
    meta = run.meta if isinstance(run.meta, dict) else {}
    run_id = meta.get("run_id") if isinstance(meta.get("run_id"), str) and meta.get("run_id") else run.path.name
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{run_id}-{job}-{file_name}")


def _perfetto_button(run, job: str, files: dict[str, Path], root: Path) -> None:
    """Pick one trace file and open it in Perfetto with one click (or say why it cannot be)."""
    names = sorted(files, key=lambda n: (n != "merged", n))
    c1, c2 = st.columns([1, 3])
    name = c1.selectbox("Trace to open", names, key=f"tr-open-{run.path}-{job}",
                        help="merged: every rank in one trace, messages drawn as flows")
    path = files[name]
    size = path.stat().st_size
    with c2:
        if too_big(size):
            st.info(f"{path.name} is {binary_size(size)}: above the {binary_size(MAX_EMBED_BYTES)} this page embeds "
                    "for Perfetto. Download it below and drag it onto https://ui.perfetto.dev.")
            return
        components.html(perfetto_html(data.file_reader(path, root)(), f"{run.path.name} · {job} · {name}",
                                      download_name(run, job, path.name)), height=72)


def traces_view(run, root: Path) -> None:
    """Open a trace in Perfetto with one click; download buttons for each rank's trace and the merged one."""
    st.caption("Each file is a torch.profiler Chrome trace (gzip JSON). **Open in Perfetto** opens "
               "https://ui.perfetto.dev in a new tab and hands it the trace from this page (nothing is uploaded; "
               f"traces up to {binary_size(MAX_EMBED_BYTES)}). Or download a file and drag it onto Perfetto, or load "
               "it in `chrome://tracing`. `merged` holds every rank in one trace, messages drawn as flows.")
    rows = []
    for job in run.jobs["job_id"]:
        files = data.trace_files(run, str(job), root)
        if files:
            rows.append((str(job), files))
    if not rows:
        st.info("This run has no traces (run the profiler with profiled steps to record them).")
        return
    job = st.selectbox("Job", [j for j, _ in rows], key=f"tr-job-{run.path}")
    files = dict(rows)[job]
    _perfetto_button(run, job, files, root)
    cols = st.columns(min(4, len(files)))
    for i, (name, path) in enumerate(sorted(files.items(), key=lambda kv: (kv[0] != "merged", kv[0]))):
        size = path.stat().st_size
        cols[i % len(cols)].download_button(
            f"{name} ({binary_size(size)})", data.file_reader(path, root), file_name=download_name(run, job, path.name),
            mime="application/gzip", key=f"tr-{run.path}-{job}-{name}", on_click="ignore")
    table = pd.DataFrame({"file": [str(p.relative_to(run.path)) for p in files.values()],
                          "size": [binary_size(p.stat().st_size) for p in files.values()],
                          "bytes": [p.stat().st_size for p in files.values()]})
    st.dataframe(table, hide_index=True, height=table_height(len(table)), placeholder=EMPTY)
