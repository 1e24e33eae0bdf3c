"""Overview, Timeline and Scaling views: numbers from `dpcore.read.analysis`, pictures from `dpcore.read.plots`.

Why every table column carries a help text: engineers want the number, students want to know
what it means; the formula (DESIGN.md) is one hover away from the value.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read import analysis as A
from dpcore.read.dashboard import data, figures
from dpcore.read.plots.scaling import shared_ranges
from dpcore.read.dashboard.compare import shared_y_max
from dpcore.read.dashboard.formulas import BREAKDOWN_CAPTION, FORMULAS, scaling_caption
from dpcore.read.dashboard.tables import bucket_text, overview_rows, table_height
from dpcore.read.dashboard.text import md
from dpcore.read.plots.style import variant_rank

NUM = st.column_config.NumberColumn
SUMMARY_CONFIG = {
    "step_ms": NUM("step T (ms)", help=FORMULAS["step_ms"], format="%.2f"),
    "compute_ms": NUM("compute (ms)", help=FORMULAS["compute_ms"], format="%.2f"),
    "comm_ms": NUM("comm C (ms)", help=FORMULAS["comm_ms"], format="%.2f"),
    "overlapped_ms": NUM("overlapped (ms)", help=FORMULAS["overlapped_ms"], format="%.2f"),
    "exposed_ms": NUM("exposed E (ms)", help=FORMULAS["exposed_ms"], format="%.2f"),
    "other_ms": NUM("other (ms)", help=FORMULAS["other_ms"], format="%.2f"),
    "comm_fraction": NUM("comm fraction E/T", help=FORMULAS["comm_fraction"], format="percent"),
    "overlap_pct": NUM("overlap %", help=FORMULAS["overlap_pct"], format="%.0f%%"),
    "comm_ops": NUM("comm ops", help=FORMULAS["comm_ops"], format="%d"),
    "comm_bytes": st.column_config.TextColumn("comm bytes", help=FORMULAS["comm_bytes"] + " Binary units (MiB = 2^20 B)."),
    "bucket_mb": st.column_config.TextColumn("bucket", help="Gradient bucket cap (MiB) of bucketed variants; blank where "
                                             "a variant does not bucket its gradients."),
    "status": st.column_config.TextColumn("status", help="complete, or why the job has no numbers (skipped, failed)."),
    "throughput": NUM("throughput (samples/s)", help=FORMULAS["throughput"], format="%.0f"),
    "step_ms_p10": NUM("T p10", help="10th percentile of step time over the timed steps and ranks", format="%.2f"),
    "step_ms_p90": NUM("T p90", help="90th percentile of step time over the timed steps and ranks", format="%.2f"),
    "noisy": st.column_config.CheckboxColumn("noisy", help="p90/p10 of step time > 1.5: the median is unreliable"),
    "comm_source": st.column_config.TextColumn("measured from", help="trace: torch.profiler spans/kernels of the "
                                               "traced steps; intervals: recorded collectives (collectives.csv)"),
    "overlap_gap": NUM("gap (pts)", help="overlap from the trace minus overlap from the intervals, same steps",
                       format="%+.1f"),
    "sources_disagree": st.column_config.CheckboxColumn("⚠", help="the two methods differ by more than 5 points"),
}
SUMMARY_COLS = ["variant", "world_size", "bucket_mb", "status", "step_ms", "step_ms_p10", "step_ms_p90", "noisy",
                "comm_fraction", "overlap_pct", "comm_source", "overlap_gap", "sources_disagree", "comm_ops",
                "comm_bytes", "compute_ms", "overlapped_ms", "exposed_ms", "other_ms", "throughput"]


def overview_view(run, peers: list | None = None) -> None:
    """Stacked step breakdown per (variant, world size) and the summary table (every row shown).
    ``peers``: the runs shown together in compare mode; their charts then share one y-axis."""
    summary = data.job_summary(run, data.key(run))
    y_max = shared_y_max([data.job_summary(r, data.key(r)) for r in peers]) if peers and len(peers) > 1 else None
    st.plotly_chart(figures.overview(run, data.key(run), y_max), key=f"ov-{run.path}")
    st.caption(BREAKDOWN_CAPTION)
    if summary.empty:
        return
    cols = [c for c in SUMMARY_COLS if c in summary.columns]
    ordered = summary.assign(_o=variant_rank(summary["variant"])).sort_values(["_o", "world_size", "bucket_mb"])
    shown = overview_rows(ordered, run.jobs)[cols]
    st.dataframe(shown, hide_index=True, column_config=SUMMARY_CONFIG, width="stretch",
                 height=table_height(len(shown)), placeholder=EMPTY)
    st.caption(f"Step time T: median over the timed (untraced) steps and ranks, whiskers p10–p90; noisy = "
               f"p90/p10 > 1.5. Comm, exposed comm and overlap: per traced step, from the trace where it shows "
               f"communication, else from the recorded collectives (column 'measured from'); 'gap' is the trace's "
               f"overlap minus the intervals' on the same steps, and ⚠ marks a gap above 5 points. "
               f"{FORMULAS['comm_fraction']} {FORMULAS['overlap_pct']} Hover a column header for its formula.")


def _step_cards(run, job: str, step: int, job_row: pd.Series) -> None:
    """The drawn step's numbers per rank (they change with the step picker), beside the job's."""
    source = job_row.get("comm_source") if isinstance(job_row.get("comm_source"), str) else None
    ranks = A.step_ranks(data.step_metrics(run, data.key(run)), job, step, source)
    if ranks.empty:
        return
    m = st.columns(4)
    t_max = float(ranks["step_ms"].max())
    m[0].metric(f"step {step}: T (slowest rank)", f"{t_max:.2f} ms",
                delta=f"{t_max - job_row['step_ms']:+.2f} ms vs job median", delta_color="inverse",
                help=FORMULAS["step_ms"])
    m[1].metric("comm C (mean over ranks)", f"{ranks['comm_ms'].mean():.2f} ms", help=FORMULAS["comm_ms"])
    m[2].metric("exposed E (mean over ranks)", f"{ranks['exposed_ms'].mean():.2f} ms", help=FORMULAS["exposed_ms"])
    ov = ranks["overlap_pct"].mean()
    m[3].metric("overlap (mean over ranks)", "n/a" if pd.isna(ov) else f"{ov:.0f} %", help=FORMULAS["overlap_pct"])
    job_line = pd.DataFrame([{"rank": "job (T: median)", "step_ms": job_row["step_ms"], "comm_ms": job_row["comm_ms"],
                              "exposed_ms": job_row["exposed_ms"], "overlap_pct": job_row["overlap_pct"],
                              "source": f"{job_row.get('comm_source', '')} (all traced steps)"}])
    table = pd.concat([ranks.assign(rank=ranks["rank"].map(lambda r: f"rank {r}")), job_line], ignore_index=True)
    st.dataframe(table, hide_index=True, width="stretch", placeholder=EMPTY, column_config={
        "rank": st.column_config.TextColumn(f"step {step}"),
        **{k: SUMMARY_CONFIG[k] for k in ("step_ms", "comm_ms", "exposed_ms", "overlap_pct")},
        "source": st.column_config.TextColumn("measured from", help=FORMULAS.get("comm_source", ""))})


def _default_job(jobs: pd.DataFrame, summary: pd.DataFrame) -> int:
    """The multi-rank job with the highest overlap %: its timeline teaches the most."""
    ids = list(jobs["job_id"])
    if summary.empty or "overlap_pct" not in summary:
        return 0
    multi = summary[(summary["world_size"] > 1) & summary["job_id"].isin(ids)]
    best = multi.sort_values("overlap_pct", ascending=False, na_position="last")["job_id"]
    return ids.index(best.iloc[0]) if len(best) else 0


def timeline_view(run, root) -> None:
    """Lane pair per rank for one job and step, from the trace when there is one."""
    jobs = run.jobs[(run.jobs["kind"] == "train") & (run.jobs["status"] == "complete")].reset_index(drop=True)
    if jobs.empty:
        st.info("This run has no completed training job to draw.")
        return
    c1, c2 = st.columns([2, 1])
    summary = data.job_summary(run, data.key(run))
    job = c1.selectbox("Job", list(jobs["job_id"]), index=_default_job(jobs, summary), key=f"tl-job-{run.path}",
                       help="One (variant, world size, bucket size) cell of the sweep.")
    steps = run.steps[run.steps["job_id"] == job]
    traced_steps = run.traced_steps(job)
    all_steps = sorted(int(s) for s in steps["step"].unique()) or [0]
    default = traced_steps[0] if traced_steps else all_steps[0]
    step = c2.selectbox("Step", all_steps, index=all_steps.index(default), key=f"tl-step-{run.path}-{job}",
                        format_func=lambda s: f"{s} (profiled, traced)" if s in traced_steps else str(s))
    with st.spinner("Reading the traces of this job…"):
        fig = figures.timeline(run, data.key(run), job, int(step))
    st.plotly_chart(fig, key=f"tl-{run.path}-{job}-{step}")
    row = summary[summary["job_id"] == job] if "job_id" in summary else summary.iloc[:0]
    if len(row):
        _step_cards(run, job, int(step), row.iloc[0])
    traced = step in traced_steps
    source = ("each rank's torch.profiler trace (placed on the shared clock by its clock-sync markers; "
              "if they are missing, from steps.csv and collectives.csv)" if traced else
              "steps.csv phases (compute) and collectives.csv intervals (comm): this step was not traced")
    st.caption(
        f"Each rank has two lanes on the shared clock: **compute** (forward, backward, optimizer) above, "
        f"**comm** (all-reduce in flight) below. Where orange sits under blue, communication is hidden by "
        f"compute (overlap); orange under an empty compute lane is exposed comm the step waits for. "
        f"Drawn from {source}. Drag to zoom, double-click to reset; dense regions are merged into single bars "
        f"(hover shows how many ops). {FORMULAS['overlap_pct']}")


def measured_how(meta: dict) -> str:
    """One sentence on the resources behind T(1) and T(N): threads per rank and core pinning."""
    env = meta.get("environment") if isinstance(meta, dict) else None
    env = env if isinstance(env, dict) else {}
    tpr = env.get("threads_per_rank")
    if isinstance(tpr, dict):  # runs written before the equal-threads policy: one value per world size
        vals = sorted({str(v) for v in tpr.values()})
        if len(vals) > 1:
            return ("Caution: this run gave ranks of different world sizes different thread counts "
                    f"({md(', '.join(f'N={k}: {v}' for k, v in tpr.items()))}), so efficiency mixes the cost of "
                    "communication with the loss of threads.")
        tpr = vals[0] if vals else None
    if tpr is None:
        return ""
    pin = env.get("pinning")
    pinned = (" each rank pinned to its own cores" if pin == "per-rank"
              else " ranks not pinned to cores" if pin else "")
    return f"Every job ran with {md(tpr)} thread(s) per rank{',' if pinned else ''}{pinned}, so T(1) and T(N) differ only by what data parallelism adds."


def _scaling_mode(run) -> str:
    cfg = run.meta.get("config") or {} if isinstance(run.meta, dict) else {}
    mode = str(cfg.get("scaling") or "weak").lower()
    return mode if mode in ("weak", "strong") else "weak"


def scaling_view(run, peers: list | None = None) -> None:
    """Step time, throughput, speedup and efficiency against world size, in the run's scaling mode.
    ``peers``: the runs shown together in compare mode; their panels then share y-axes."""
    mode = _scaling_mode(run)
    df = data.scaling(run, data.key(run), mode)
    ranges = shared_ranges([data.scaling(r, data.key(r), _scaling_mode(r)) for r in peers]) \
        if peers and len(peers) > 1 else ()
    st.plotly_chart(figures.scaling(run, data.key(run), mode, ranges), key=f"sc-{run.path}")
    st.caption(scaling_caption(mode) + " " + measured_how(run.meta))
    if not df.empty and df["noisy"].any():
        cells = ", ".join(f"{v} ×{n}" for v, n in zip(df.loc[df["noisy"], "variant"],
                                                      df.loc[df["noisy"], "world_size"]))
        st.warning(f"Noisy measurements: {md(cells)}. Their step times spread more than "
                   "1.5× between p10 and p90, or efficiency came out above 100%, so another process "
                   "probably competed for the cores. Re-run on an idle machine before trusting them.")
    if not df.empty:
        cfg_cols = {"step_ms": SUMMARY_CONFIG["step_ms"], "throughput": SUMMARY_CONFIG["throughput"],
                    "speedup": NUM("speedup S(N)", help=FORMULAS["speedup_" + mode], format="%.2f"),
                    "efficiency": NUM("efficiency", help=FORMULAS["efficiency_" + mode], format="percent"),
                    "ideal_speedup": NUM("ideal S(N)", format="%.0f")}
        shown = df.assign(bucket_mb=[bucket_text(v, b) for v, b in zip(df["variant"], df["bucket_mb"])]) \
            if {"variant", "bucket_mb"} <= set(df.columns) else df
        cfg_cols["bucket_mb"] = SUMMARY_CONFIG["bucket_mb"]
        st.dataframe(shown, hide_index=True, column_config=cfg_cols, width="stretch", placeholder=EMPTY,
                     height=table_height(len(shown)))
