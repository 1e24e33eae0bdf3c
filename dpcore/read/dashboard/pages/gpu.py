"""GPU page: why the GPU is idle, and how much of it did model work. Per rank, the GPU time ledger of
the whole trace and of each traced step (compute, non-compute, idle split by whether the CPU or the
device was late), step MFU, GEMM efficiency and the FLOPs coverage they stand on, what the CPU was
doing while the GPU waited, and a recommendation where one is clear.

Why its own page: on a GPU the first question is not how long a step takes but how much of it the
GPU worked; Overview's "other" hides a GPU waiting for its launching thread. The numbers are the
``gpu`` command's (`dpcore.read.tables.run_gpu` over `dpcore.read.analysis.gpu_time.gpu_ledger`,
read once per run through `dpcore.read.dashboard.data.cached_gpu`); the figures come from
`dpcore.read.plots.gpu`; the recommendation is `dpcore.read.analysis.advice.advice`, the CLI's.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read.analysis.advice import advice
from dpcore.read.analysis.gpu_flops import efficiency_text, rank_efficiency, run_tf32, with_efficiency
from dpcore.read.analysis.gpu_kernels import fp32_matmul_note, kernel_rows
from dpcore.read.analysis.gpu_time import HOST_BOUND_SHARE, TRACE_STEP
from dpcore.read.analysis.metrics import INFLATION_LIMIT
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.table_cells import table_height
from dpcore.read.dashboard.text import md
from dpcore.read.plots.gpu import causes_figure, kernel_figure, ledger_figure, window_label
from dpcore.read.rundir.load import Run

INTRO = "Why the GPU is idle: its time per rank split into compute, other GPU work and idle, and who was late."
NUM = st.column_config.NumberColumn
LEDGER_CONFIG = {
    "window": st.column_config.TextColumn("window", help="The whole trace (first GPU event start to last GPU "
                                          "event end), or a traced step (the GPU events launched inside "
                                          "ProfilerStep#k, first start to last end)."),
    "span_ms": NUM("span (ms)", help="Length of the window: compute + non-compute + idle.", format="%.3f"),
    "compute_ms": NUM("compute (ms)", help="Time any compute kernel runs (the union over streams).", format="%.3f"),
    "non_compute_ms": NUM("non-compute (ms)", help="The rest of the busy time: communication kernels, memory "
                          "copies and sets while no compute kernel runs.", format="%.3f"),
    "exposed_comm_ms": NUM("exposed comm (ms)", help="Communication kernels while no compute kernel runs.",
                           format="%.3f"),
    "idle_ms": NUM("idle (ms)", help="No GPU event on any stream.", format="%.3f"),
    "idle_host_ms": NUM("idle: host (ms)", help="Idle gaps whose next GPU event was launched by the CPU after "
                        "the gap began: the CPU was late.", format="%.3f"),
    "idle_device_ms": NUM("idle: device (ms)", help="Idle gaps whose next GPU event was already launched: a "
                          "stream wait, a dependency, launch latency.", format="%.3f"),
    "compute_pct": NUM("compute %", format="%.1f%%"),
    "idle_pct": NUM("idle %", format="%.1f%%"),
    "host_bound": st.column_config.CheckboxColumn("host-bound", help="Host idle over half the span."),
    "top_idle_cause": st.column_config.TextColumn("top host cause", help="The outermost CPU op on the launching "
                                                  "thread over the most host idle ('python': no op)."),
    "top_idle_cause_ms": NUM("its idle (ms)", format="%.3f"),
    "step_mfu_pct": NUM("step MFU %", help="The window's model FLOPs / (its span × the GPU's dense peak for each "
                        "dtype): how much of the GPU's time did model work.", format="%.1f%%"),
    "flops_coverage_pct": NUM("FLOPs coverage %", help="Share of the window's compute-kernel time whose FLOPs are "
                              "known (matrix products, attention, convolutions with recorded shapes): MFU counts "
                              "only that part. Attention is counted unmasked where the trace records no "
                              "is_causal (Concrete Inputs): an upper bound for a causal model.", format="%.0f%%"),
    "set_aside_events": NUM("set aside", help="GPU events with a negative duration, left out of every number.",
                            format="%d"),
}
KERNEL_CONFIG = {
    "kernel_class": st.column_config.TextColumn("class"),
    "dtype": st.column_config.TextColumn("dtype", help="The data type a GEMM or attention kernel's name states, "
                                         "else a GEMM's inputs' (recorded shapes)."),
    "calls": NUM("calls", format="%d"),
    "flops_calls": NUM("calls with FLOPs", help="The calls the TFLOP/s covers: those launched under a matrix "
                       "product, attention or convolution whose shapes the trace records.", format="%d"),
    "total_ms": NUM("total (ms)", help="Sum of the events' durations over the whole trace.", format="%.3f"),
    "share_pct": NUM("share %", help="Of all GPU event time of the rank.", format="%.1f%%"),
    "tflops": NUM("TFLOP/s", help="Achieved over the calls with FLOPs: their FLOPs (from the recorded shapes) / "
                  "the time of their kernels.", format="%.2f"),
    "eff_pct": NUM("efficiency %", help="Achieved TFLOP/s / the GPU's dense peak for the dtype (datasheet, no "
                   "sparsity; dpcore/read/analysis/peaks.csv): how well these kernels ran, not MFU.",
                   format="%.1f%%"),
}
MEANING = (
    "**span**: the window, from its first GPU event's start to its last GPU event's end (the whole trace, "
    "or the GPU events launched inside one ProfilerStep). **compute**: time at least one compute kernel "
    "runs on any stream. **non-compute**: the rest of the GPU's busy time (NCCL kernels, memory copies and "
    "sets not under a compute kernel). **idle**: no kernel, copy or set on any stream; **host** idle is a "
    "gap whose next GPU event the CPU launched after the gap began (the GPU waited for the CPU), **device** "
    "idle one whose next event was already queued (a stream or event wait, launch latency). compute + "
    "non-compute + idle = span, so each bar is as long as its window. **Host-bound**: host idle over "
    f"{100 * HOST_BOUND_SHARE:.0f} % of the span. **Causes**: for each host gap, the outermost CPU op on "
    "the launching thread at the gap's start ('python' where no op covers it). These are HTA's temporal-"
    "breakdown definitions on exact timestamps; HTA itself rounds to whole µs and leaves out the last "
    "profiler step, so its shares can read a few points apart. **Step MFU**: the window's model FLOPs "
    "(matrix products, attention forward and backward, convolutions, from the recorded shapes) / (its span × "
    "the GPU's dense peak for each dtype); **GEMM efficiency**: the GEMM kernels' FLOPs / their own time × peak "
    "(how well the matrix kernels ran, not how busy the GPU was); **FLOPs coverage**: the share of compute-"
    "kernel time whose FLOPs are known, which both numbers stand on. A causal attention call counts half "
    "where the trace records its is_causal (Concrete Inputs), else it is counted unmasked (for a causal "
    "model an upper bound, at most 2×)."
)


def _job_rows(ledger: pd.DataFrame, job_id: str, rank: int) -> pd.DataFrame:
    return ledger[(ledger["job_id"] == job_id) & (ledger["rank"] == rank)].sort_values("step")


@st.cache_data(show_spinner=False, max_entries=32)
def charts(_run: Run, run_key: tuple, job_id: str, rank: int) -> tuple[go.Figure, go.Figure]:
    """The ledger bars (whole trace and each traced step) and the whole trace's host causes of one rank."""
    ledger, causes, _ = data.cached_gpu(_run, run_key)
    mine = causes[(causes["job_id"] == job_id) & (causes["rank"] == rank) & (causes["step"] == TRACE_STEP)]
    return (ledger_figure(_job_rows(ledger, job_id, rank), f"GPU time ledger of rank {rank}"),
            causes_figure(mine, "Host idle by CPU op (whole trace)"))


def _pct_text(x: float) -> str:
    return EMPTY if pd.isna(x) else f"{x:.1f} %"


def _cards(row: pd.Series, eff: pd.Series | None) -> None:
    """The whole trace's headline numbers of one rank: the ledger's three parts (they sum to the
    span), then the host's share of idle and the efficiency numbers; each card's value short, so
    none is cut, its detail in the help and the line below."""
    span = float(row["span_ms"])
    c = st.columns(4)
    c[0].metric("span", f"{span:.2f} ms", help="First GPU event start to last GPU event end of the trace.")
    c[1].metric("compute", f"{float(row['compute_pct']):.1f} %", help=f"{float(row['compute_ms']):.3f} ms")
    c[2].metric("non-compute", f"{float(row['non_compute_pct']):.1f} %",
                help=f"{float(row['non_compute_ms']):.3f} ms of communication, copies and sets while no compute "
                     "kernel runs")
    c[3].metric("idle", f"{float(row['idle_pct']):.1f} %", help=f"{float(row['idle_ms']):.3f} ms")
    host = float(row["idle_host_ms"])
    c = st.columns(4)
    c[0].metric("GPU idle: host", f"{100 * host / span if span > 0 else 0:.1f} %",
                help=f"{host:.3f} ms the GPU waited for the CPU to launch work")
    if eff is not None:
        c[1].metric("step MFU", _pct_text(float(eff["step_mfu_pct"])),
                    help="Model FLOPs / (step time × the GPU's dense peak), over the traced steps, "
                         "else the whole trace.")
        c[2].metric("GEMM efficiency", _pct_text(float(eff["gemm_eff_pct"])),
                    help="The GEMM kernels' FLOPs / their own time × peak: not how busy the GPU was.")
        c[3].metric("FLOPs coverage", _pct_text(float(eff["flops_coverage_pct"])),
                    help="Share of compute-kernel time whose FLOPs are known: what MFU counts.")
    cause = str(row["top_idle_cause"] or "")
    if cause:
        st.markdown(f"**Top host cause**: `{cause}`, {float(row['top_idle_cause_ms']):.3f} ms of host idle")


def render(run: Run) -> None:
    """Job and rank pickers, the whole trace's numbers and recommendation, the ledger bars, the
    host causes and the ledger table."""
    key = data.key(run)
    ledger, _, kernels = data.cached_gpu(run, key)
    tf32 = run_tf32(run.meta)
    if ledger.empty:
        where = ("in this run's traces (no kernels, memory copies or sets)" if data.may_have_gpu(run)
                 else "here: this run was recorded on a machine without a GPU (run.json)")
        st.info(f"No GPU events {where}: the GPU page reads traces recorded on a GPU. Overview splits a CPU "
                "run's step time.")
        return
    jobs = list(dict.fromkeys(ledger["job_id"].astype(str)))
    c1, c2 = st.columns([2, 1])
    job = c1.selectbox("Job", jobs, key=f"gpu-job-{run.path}")
    ranks = sorted(int(r) for r in ledger.loc[ledger["job_id"] == job, "rank"].unique())
    rank = int(c2.selectbox("Rank", ranks, key=f"gpu-rank-{run.path}-{job}"))
    rows = with_efficiency(_job_rows(ledger, job, rank), tf32)
    eff = rank_efficiency(rows, tf32)
    whole = rows[rows["step"] == TRACE_STEP]
    if len(whole):
        row = whole.iloc[0]
        _cards(row, eff.iloc[0] if len(eff) else None)
        if len(eff):
            st.caption(md(f"Efficiency ({job}, rank {rank}): {efficiency_text(eff.iloc[0], tf32)}."))
        tip = advice(row)
        if tip:
            st.info(f"**Recommendation** ({md(job)}, rank {rank}, whole trace): {md(tip)}")
    _inflation(run, key, job)
    bars, causes = charts(run, key, job, rank)
    left, right = st.columns([3, 2])
    with left:
        st.plotly_chart(bars, key=f"gpu-ledger-{run.path}-{job}-{rank}")
    with right:
        st.plotly_chart(causes, key=f"gpu-causes-{run.path}-{job}-{rank}")
    shown = rows.assign(window=[window_label(s) for s in rows["step"]])
    st.dataframe(shown[list(LEDGER_CONFIG)], hide_index=True, width="stretch", column_config=LEDGER_CONFIG,
                 placeholder=EMPTY, height=table_height(len(shown)))
    st.caption(MEANING)
    _kernels(kernel_rows(kernels[(kernels["job_id"] == job) & (kernels["rank"] == rank)], tf32), rank,
             f"{run.path}-{job}-{rank}")


def _inflation(run: Run, key: tuple, job: str) -> None:
    """Say so where the profiler inflated the job's traced steps (summarize's flag, the same
    ``trace_inflation``): the ledger describes the traced steps, not the timed ones."""
    summary = data.cached_summary(run, key)
    if "trace_inflation" not in summary:
        return
    mine = summary[summary["job_id"] == job]
    if len(mine) and float(mine["trace_inflation"].fillna(0).iloc[0]) > INFLATION_LIMIT:
        r = mine.iloc[0]
        st.warning(f"**The profiler inflated this job's steps**: its traced steps take {r['trace_inflation']:.2f}× "
                   f"its timed ones ({r['trace_inflation'] * r['step_ms']:.1f} ms against {r['step_ms']:.1f} ms, "
                   f"over {INFLATION_LIMIT:g}×). The ledger here describes the traced steps, slowed by the profiler "
                   "itself; trust the timed step time (Overview), which splits T by the timed phases.")


def _kernels(mine: pd.DataFrame, rank: int, chart_key: str) -> None:
    """GPU time by kernel class (the ``gpu --kernels`` rows of the rank) and the fp32 note."""
    if mine.empty:
        return
    st.subheader("Kernel classes")
    st.plotly_chart(kernel_figure(mine, f"GPU event time by kernel class, rank {rank}"),
                    key=f"gpu-kernels-{chart_key}")
    st.dataframe(mine[list(KERNEL_CONFIG)], hide_index=True, width="stretch", column_config=KERNEL_CONFIG,
                 placeholder=EMPTY, height=table_height(len(mine)))
    note = fp32_matmul_note(mine)
    if note:
        st.warning(md(note))
    shapes = "" if mine["tflops"].notna().any() else (
        " This trace records no shapes (profile with record_shapes=True), so no TFLOP/s or efficiency.")
    st.caption("Each kernel, copy and set counted by its own duration (overlapping streams both count), "
               "classed by its name: GEMM, attention, elementwise, reduction, communication (NCCL), memory "
               "(copies and sets), other. dtype is what a kernel's name states, else its op's inputs'. TFLOP/s "
               "= the FLOPs of the row's calls with FLOPs (from the recorded shapes) / their kernel time, for "
               "GEMM, attention and convolution rows; efficiency % = TFLOP/s / the GPU's dense peak for that "
               "dtype (vendor datasheet, no sparsity; fp32 GEMMs rated as TF32 where the run records tf32), "
               "empty for a GPU not in the table. Efficiency is the kernels', not the step's: step MFU is above."
               + shapes)


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
