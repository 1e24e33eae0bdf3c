"""Ring messages, Bandwidth, Buckets and Traces views.

Why the ring view puts the chunk slider next to the message lanes: the lanes show *when* bytes
move, the slider shows *what* each rank holds after each step; together they explain why every
rank ends with the full sum after 2(N−1) steps while sending only 2(N−1)/N of the tensor.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dpcore.read.dashboard import data, figures
from dpcore.read.dashboard.formulas import FORMULAS

ALGO_NOTES = {
    "ring": "Ring: 2(N−1) steps, each rank sends one 1/N chunk per step to its right neighbour "
            "(reduce-scatter adds, all-gather copies): 2N(N−1) chunk messages in all (each split into sub-messages when a chunk is large, to pipeline), bandwidth-optimal.",
    "naive": "Naive: every rank sends its whole tensor to every other rank: N(N−1) full-size messages.",
    "central": "Central: everything is gathered to rank 0, reduced there and broadcast back: rank 0 is the "
               "bottleneck, its link carries 2(N−1) full tensors.",
}


def _pick(label: str, options: list, key: str, default=None, **kw):
    index = options.index(default) if default in options else 0
    return st.selectbox(label, options, index=index, key=key, **kw)


def ring_view(run) -> None:
    """Message lanes for one job/step/call, wait vs transfer per ring step, chunk slider, message counts."""
    msgs = run.messages
    if msgs.empty:
        st.info("This run recorded no point-to-point messages: run the `ring`, `central` variants or "
                "`python -m dpcore allreduce --algos ring,naive,central` to see them.")
        return
    counts = data.message_counts(run, data.key(run))
    jobs = list(dict.fromkeys(counts["job_id"])) if not counts.empty else sorted(msgs["job_id"].unique())
    ring_jobs = [j for j, a in zip(counts["job_id"], counts["algo"]) if a == "ring"] if not counts.empty else []
    c1, c2, c3 = st.columns([2, 1, 1])
    with c1:
        job = _pick("Job", jobs, f"rg-job-{run.path}", ring_jobs[-1] if ring_jobs else None)
    jm = msgs[msgs["job_id"] == job]
    step = c2.selectbox("Step", sorted(int(s) for s in jm["step"].unique()), key=f"rg-step-{run.path}-{job}")
    jm = jm[jm["step"] == step]
    call = c3.selectbox("All-reduce call", sorted(int(c) for c in jm["call"].unique()),
                        key=f"rg-call-{run.path}-{job}-{step}")
    sel = jm[jm["call"] == call]
    algo = str(sel["algo"].iloc[0]) if not sel.empty else "?"
    ws = int(max(sel["src"].max(), sel["dst"].max()) + 1) if not sel.empty else 1
    st.plotly_chart(figures.messages(run, data.key(run), job, step, call, f"{job} · {algo} · {len(sel) // 2} messages"),
                    key=f"rg-{run.path}-{job}")
    st.caption("Each rank is a lane. A message is a bar on the sender (above the lane centre: isend posted → "
               "done) and on the receiver (below, faded: irecv posted → done), joined by an arrow. "
               + ALGO_NOTES.get(algo, ""))
    if algo == "ring":
        left, right = st.columns(2)
        with left:
            st.markdown("**Wait vs transfer per ring step**")
            st.plotly_chart(figures.wait_transfer(run, data.key(run), job, step, call), key=f"rg-wt-{run.path}-{job}")
            st.caption(FORMULAS["ring_wait"])
        with right:
            st.markdown(f"**Which chunk each rank holds (N = {ws})**")
            st.plotly_chart(figures.chunks(ws), key=f"rg-ch-{run.path}-{ws}")
            st.caption("Move the slider through the steps. A cell counts how many ranks' gradients the rank's copy "
                       "of that chunk already sums; after reduce-scatter each rank owns one complete chunk (N), "
                       "all-gather then copies the complete chunks around the ring.")
    st.markdown("**Messages per all-reduce call, per job**")
    st.plotly_chart(figures.counts(run, data.key(run)), key=f"rg-cnt-{run.path}")
    st.caption(" ".join(ALGO_NOTES.values()))


def bandwidth_view(run) -> None:
    """algbw/busbw against message size, log axes, per algorithm and world size."""
    df = data.bandwidth(run, data.key(run))
    st.plotly_chart(figures.bandwidth(run, data.key(run)), key=f"bw-{run.path}")
    st.caption(f"{FORMULAS['algbw']} {FORMULAS['busbw']} busbw makes different N comparable: for a "
               "bandwidth-optimal all-reduce it approaches the link speed. Small messages are latency-bound.")
    if not df.empty:
        st.dataframe(df, hide_index=True, width="stretch", column_config={
            "algbw_gbps": st.column_config.NumberColumn("algbw (GB/s)", help=FORMULAS["algbw"], format="%.3f"),
            "busbw_gbps": st.column_config.NumberColumn("busbw (GB/s)", help=FORMULAS["busbw"], format="%.3f"),
            "bytes": st.column_config.NumberColumn("bytes", format="compact")})


def buckets_view(run) -> None:
    """Step time and exposed comm against bucket size, when the run swept bucket sizes."""
    st.plotly_chart(figures.buckets(run, data.key(run)), key=f"bk-{run.path}")
    df = data.bucket_sweep(run, data.key(run))
    if not df.empty:
        st.dataframe(df, hide_index=True, width="stretch", column_config={
            "step_ms": st.column_config.NumberColumn("step T (ms)", help=FORMULAS["step_ms"], format="%.2f"),
            "exposed_ms": st.column_config.NumberColumn("exposed E (ms)", help=FORMULAS["exposed_ms"], format="%.2f"),
            "overlap_pct": st.column_config.NumberColumn("overlap %", help=FORMULAS["overlap_pct"], format="%.0f%%")})
    st.caption("Small buckets start communicating early but pay a launch per bucket; one huge bucket can only "
               f"start after the whole backward and hides nothing. {FORMULAS['exposed_ms']} {FORMULAS['step_ms']}")


def traces_view(run, root: Path) -> None:
    """Download buttons for each rank's Chrome trace and the merged one, with how to open them."""
    st.caption("Each file is a torch.profiler Chrome trace (gzip JSON). Open **https://ui.perfetto.dev** and drag the "
               "file onto the page (no upload: Perfetto runs in your browser), or open `chrome://tracing` in "
               "Chrome/Chromium and press *Load*. `merged` holds every rank in one trace, messages drawn as flows.")
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
    cols = st.columns(min(4, len(files)))
    for i, (name, path) in enumerate(sorted(files.items(), key=lambda kv: (kv[0] != "merged", kv[0]))):
        size = path.stat().st_size
        cols[i % len(cols)].download_button(
            f"{name} ({size / 1024:.0f} KB)", data.file_reader(path, root), file_name=f"{job}-{path.name}",
            mime="application/gzip", key=f"tr-{run.path}-{job}-{name}", on_click="ignore")
    st.dataframe(pd.DataFrame({"file": [str(p.relative_to(run.path)) for p in files.values()],
                               "bytes": [p.stat().st_size for p in files.values()]}), hide_index=True)
