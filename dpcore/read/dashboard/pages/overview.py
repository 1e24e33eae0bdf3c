"""Overview page: where a training step's time goes, per (variant, world size), and the summary
table behind it; in compare mode first what differs between the two runs.

Why every table column carries a help text: engineers want the number, students want to know
what it means; the formula (docs/DESIGN.md) is one hover away from the value. Numbers come from
`dpcore.read.analysis.job_summary` (what `python -m dpcore summarize` prints), the figure from
`dpcore.read.plots.overview`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read.analysis.rank_pick import MAX_RANK_LANES, rank_step_matrix
from dpcore.read.analysis.summary import shared_gpu_line
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.columns import SUMMARY_CONFIG, SUMMARY_STATUS_HELP
from dpcore.read.dashboard.compare import compare_overview, shared_y_max
from dpcore.read.dashboard.formulas import BREAKDOWN_CAPTION, FORMULAS
from dpcore.read.dashboard.table_cells import overview_rows, short_status, table_height
from dpcore.read.dashboard.text import md
from dpcore.read.plots.heat import rank_step_heat_figure
from dpcore.read.plots.overview import breakdown_figure
from dpcore.read.plots.style import label_jobs, variant_rank
from dpcore.read.rundir.load import Run

INTRO = "How long one training step takes per variant and world size, and how much of it is communication."
#: The step's numbers first (T, comm fraction, overlap, exposed E): they must be on screen at
#: 1,400 px; the spread, the method check and the parts follow.
SUMMARY_COLS = ["variant", "world_size", "bucket_mb", "status", "step_ms", "comm_fraction", "overlap_pct",
                "exposed_ms", "step_ms_p10", "step_ms_p90", "noisy", "throughput", "comm_source", "overlap_gap",
                "sources_disagree", "comm_ops", "comm_bytes", "compute_ms", "overlapped_ms", "other_ms", "gpus_shared"]
GPU_SHARED = st.column_config.CheckboxColumn(
    "GPU shared", help="More ranks than GPUs (run.json gpus_shared): the ranks took turns on one GPU, so this "
    "job's step time against other world sizes measures the sharing, not data parallelism.")


@st.cache_resource(show_spinner=False, max_entries=16)
def breakdown(_run: Run, run_key: tuple, y_max: float | None = None) -> go.Figure:
    """The stacked step breakdown of every job (y-axis top ``y_max`` in compare mode).

    Why ``cache_resource`` (the one shared object, not a copy): this is the chart a reload waits
    for first, and ``cache_data`` unpickles its figure on every rerun, which rebuilds and
    re-validates every property (about 50 ms on the sample run, a third of the script's run).
    ``st.plotly_chart`` only reads the figure (it serialises a copy), and nothing else gets it."""
    return breakdown_figure(data.cached_summary(_run, run_key), "Where a training step's time goes", y_max)


GPU_HOST = st.column_config.NumberColumn(
    "GPU idle: host", format="%.1f%%", help="Share of the GPU's time (its whole trace, first GPU event to last, "
    "summed over ranks) that no stream ran anything and the CPU had not yet launched the next kernel: the GPU "
    "waiting for the CPU. The GPU page splits it by cause. Shown instead of 'other' when every job with "
    "numbers ran on a GPU.")


def _gpu_host_idle(run: Run, key: tuple) -> pd.Series:
    """Host idle % of the whole-trace GPU ledger per job (the GPU page's and the ``gpu`` command's
    numbers); empty for a run without GPU traces."""
    ledger = data.cached_gpu(run, key)[0]
    whole = ledger[ledger["window"] == "trace"]
    if whole.empty:
        return pd.Series(dtype=float)
    per = whole.groupby("job_id")[["idle_host_ms", "span_ms"]].sum()
    return 100 * per["idle_host_ms"] / per["span_ms"].where(per["span_ms"] > 0)


def render(run: Run, peers: list[Run] | None = None) -> None:
    """Stacked step breakdown per (variant, world size), then the summary table (every row
    shown). ``peers``: the runs shown together in compare mode; their charts then share one y-axis."""
    key = data.key(run)
    summary = data.cached_summary(run, key)
    y_max = shared_y_max([data.cached_summary(r, data.key(r)) for r in peers]) if peers and len(peers) > 1 else None
    st.plotly_chart(breakdown(run, key, y_max), key=f"ov-{run.path}")
    st.caption(BREAKDOWN_CAPTION)
    if summary.empty:
        return
    shared = shared_gpu_line(summary)
    if shared:
        st.warning(md(shared[0].upper() + shared[1:]) + ".")
    # inside frame.safely itself, so that a failing table leaves the chart above it
    frame.safely(lambda: _table(run, key), f"The summary table of run {md(run.path.name)}")


def _table(run: Run, key: tuple) -> None:
    """The summary table (every row shown), the whole text of long statuses, the heat strip."""
    summary = data.cached_summary(run, key)
    cols = [c for c in SUMMARY_COLS if c in summary.columns and (c != "gpus_shared" or bool(summary[c].any()))]
    ordered = summary.assign(_o=variant_rank(summary["variant"])).sort_values(["_o", "world_size", "bucket_mb"])
    shown = overview_rows(ordered, run.jobs)
    host = _gpu_host_idle(run, key)
    if len(host):  # GPU jobs: the GPU waiting for the CPU, where "other" would only say "not comm"
        shown = shown.assign(gpu_idle_host_pct=shown["job_id"].map(host))
        at = cols.index("other_ms") if "other_ms" in cols else len(cols)
        every = (shown["gpu_idle_host_pct"].notna() | shown.get("other_ms", shown["gpu_idle_host_pct"]).isna()).all()
        cols = cols[:at] + ["gpu_idle_host_pct"] + cols[at + int(bool(every) and at < len(cols)):]
    shown = shown[cols]
    # a long skip or failure reason: cut in the cell, whole in the header's help and below
    whole = [(label, status) for label, status in zip(label_jobs(ordered), shown["status"])
             if isinstance(status, str) and short_status(status) != status]
    config = {**SUMMARY_CONFIG, "gpu_idle_host_pct": GPU_HOST, "gpus_shared": GPU_SHARED}
    if whole:
        reasons = "; ".join(f"{label}: {status}" for label, status in whole)
        config["status"] = st.column_config.TextColumn("status", width="medium",
                                                       help=f"{SUMMARY_STATUS_HELP} {reasons}")
        shown = shown.assign(status=[short_status(x) if isinstance(x, str) else x for x in shown["status"]])
    st.dataframe(shown, hide_index=True, column_config=config, width="stretch",
                 height=table_height(len(shown)), placeholder=EMPTY)
    for label, status in whole:
        st.caption(f"{md(label)} {md(status)}")
    _heat_strip(run)
    st.caption(f"Step time T: median over the timed (untraced) steps and ranks, whiskers p10–p90; noisy = "
               f"p90/p10 > 1.5. Comm, exposed comm and overlap: per traced step, from the trace where it shows "
               f"communication, else from the recorded collectives (column 'measured from'); 'gap' is the trace's "
               f"overlap minus the intervals' on the same steps, and ⚠ marks a gap above 5 points. "
               f"{FORMULAS['comm_fraction']} {FORMULAS['overlap_pct']} Hover a column header for its formula.")


def _heat_strip(run: Run) -> None:
    """For jobs of more ranks than a lane view draws: every rank's step time, rank x step."""
    sizes = run.steps.groupby("job_id")["rank"].nunique() if not run.steps.empty else None
    many = [str(j) for j, n in sizes.items() if n > MAX_RANK_LANES] if sizes is not None else []
    if not many:
        return
    job = st.selectbox("Rank × step heat strip of job", many, key=f"ov-heat-job-{run.path}")
    steps = run.steps[run.steps["job_id"] == job]
    st.plotly_chart(rank_step_heat_figure(rank_step_matrix(steps), f"{job}: step time of every rank"),
                    key=f"ov-heat-{run.path}-{job}")


def page() -> None:
    """The page as Streamlit runs it: the comparison first in compare mode, then each run."""
    ctx = frame.context()
    st.caption(INTRO)
    if len(ctx.loaded) > 1:
        frame.safely(lambda: compare_overview(ctx.loaded), "The comparison")
    frame.each_run(lambda run: render(run, peers=ctx.loaded))


if __name__ == "__main__":
    page()
