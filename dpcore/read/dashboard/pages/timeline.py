"""Timeline page: what every rank does during one step, compute above communication, on one clock.

Why a job and a step picker with the step's own numbers beside the picture: a timeline shows
*where* a step's time goes; the cards say how far that step is from the job's median, so an
outlier step is not mistaken for the job. Lanes come from `dpcore.read.analysis.timeline` (the
trace of a profiled step, else steps.csv and collectives.csv), the figure from
`dpcore.read.plots.timeline`. The traces reach it as the drawn ranks' lane events from the rank
cache (`dpcore.read.tables.job_lane_events`): a cache hit parses no trace, and only the step drawn
is reduced to lanes (a trace may hold 30,000 steps).
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read import analysis
from dpcore.read.analysis.lanes import trace_lanes
from dpcore.read.analysis.rank_pick import MAX_RANK_LANES, default_ranks, rank_step_matrix
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.columns import SUMMARY_CONFIG
from dpcore.read.dashboard.formulas import FORMULAS
from dpcore.read.dashboard.picker import featured_job
from dpcore.read.plots.heat import rank_step_heat_figure
from dpcore.read.plots.style import esc
from dpcore.read.plots.timeline import timeline_figure
from dpcore.read.rundir.load import Run
from dpcore.read.tables import job_lane_events

INTRO = "What every rank does during one step: compute above, communication below, on one clock."


@st.cache_data(show_spinner=False, max_entries=16)
def step_metrics(_run: Run, run_key: tuple) -> pd.DataFrame:
    """Per (job, rank, step) numbers of the run (`step_metrics`): the step cards' source."""
    return analysis.step_metrics(_run.steps, _run.collectives, data.cached_trace_steps(_run, run_key), _run.comm_calls)


@st.cache_resource(show_spinner=False, max_entries=4)
def cached_lane_events(_run: Run, run_key: tuple, job_id: str, ranks: tuple[int, ...]) -> list[pd.DataFrame] | None:
    """The drawn ranks' ``lane_events`` tables of one job, read once per job and rank set (not
    once per step) from the rank cache (`dpcore.read.tables.job_lane_events`): each step's lanes
    are reduced from them, so another step reads no trace and no cache file. A resource (held,
    not copied per rerun): a 30,000-step trace's table is ten columns of all its events, and
    nothing here changes it."""
    return job_lane_events(_run, job_id, ranks=ranks)


@st.cache_data(show_spinner=False, max_entries=32)
def lanes(_run: Run, run_key: tuple, job_id: str, step: int, ranks: tuple[int, ...]) -> pd.DataFrame:
    """The step's lanes of the drawn ranks (`timeline`); for a traced step reduced from their
    lane events for this step only (`trace_lanes`), never for the trace's other steps."""
    trace = None
    if step in _run.traced_steps(job_id):
        events = cached_lane_events(_run, run_key, job_id, ranks)
        trace = None if events is None else pd.concat([trace_lanes(ev, [step]) for ev in events], ignore_index=True)
    df = analysis.timeline(_run, job_id, step, lanes=trace)
    df = df[df["rank"].isin(ranks)]
    if world_size(_run, job_id) == 1:  # no peer: comm is 0 on every card and table, and so here
        df = df[df["lane"] != "comm"]
    return df.reset_index(drop=True)


def world_size(run: Run, job_id: str) -> int | None:
    """The job's world size from run.json (None when not recorded)."""
    ws = pd.to_numeric(run.jobs.loc[run.jobs["job_id"] == job_id, "world_size"], errors="coerce").dropna()
    return int(ws.iloc[0]) if len(ws) else None


@st.cache_data(show_spinner=False, max_entries=32)
def lanes_figure(_run: Run, run_key: tuple, job_id: str, step: int, ranks: tuple[int, ...]) -> go.Figure:
    """The lanes drawn, with the job and step as the title."""
    return timeline_figure(lanes(_run, run_key, job_id, step, ranks), f"{esc(job_id)} · step {step}")


@st.cache_data(show_spinner=False, max_entries=16)
def job_stragglers(_run: Run, run_key: tuple, job_id: str) -> pd.DataFrame:
    """straggler_summary of one job's collectives (the most-often-last rank of the default picks)."""
    return analysis.straggler_summary(analysis.collective_waits(_run.collectives[_run.collectives["job_id"] == job_id]))


def pick_ranks(run: Run, job: str, steps: pd.DataFrame) -> tuple[int, ...]:
    """Every rank of a job of at most MAX_RANK_LANES ranks; else a picker whose default is rank 0,
    the slowest and the most-often-last rank (`default_ranks`)."""
    ranks = sorted(int(r) for r in steps["rank"].unique())
    if len(ranks) <= MAX_RANK_LANES:
        return tuple(ranks)
    default = default_ranks(ranks, steps, job_stragglers(run, data.key(run), job))
    picked = st.multiselect(f"Ranks (of {len(ranks)}; at most {MAX_RANK_LANES} drawn)", ranks, default=default,
                            max_selections=MAX_RANK_LANES, key=f"tl-ranks-{run.path}-{job}",
                            help="By default rank 0, the slowest rank (largest median step time) and the rank "
                                 "most often last at the collectives. The heat strip below shows every rank.")
    return tuple(sorted(int(r) for r in picked)) or tuple(default)


def _step_cards(run: Run, job: str, step: int, job_row: pd.Series) -> None:
    """The drawn step's numbers per rank (they change with the step picker), beside the job's."""
    source = job_row.get("comm_source") if isinstance(job_row.get("comm_source"), str) else None
    ranks = analysis.step_ranks(step_metrics(run, data.key(run)), job, step, source)
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


def _default_job(run: Run, jobs: pd.DataFrame) -> int:
    """The job the picker opens on: `featured_job`, the same as the Traces page."""
    ids = list(jobs["job_id"])
    job = featured_job(jobs, (run.meta.get("config") or {}).get("bucket_mb"))
    return ids.index(job) if job in ids else 0


CPU_LANES = ("Each rank has two lanes on the shared clock: **compute** (forward, backward, optimizer) above, "
             "**comm** (all-reduce in flight) below. Where orange sits under blue, communication is hidden by "
             "compute (overlap); orange under an empty compute lane is exposed comm the step waits for.")
GPU_LANES = ("Each GPU rank has one lane per thread that launches GPU work (**CPU op**, grey: the outermost "
             "operator it was running) and one per **CUDA stream** (compute kernels blue, NCCL kernels in their "
             "collective's colour, memory copies and sets teal, sync kernels red); a **comm** lane, where "
             "present, is collectives.csv's calls. A gap in every stream under a busy grey bar is the GPU "
             "waiting for the CPU to launch the next kernel (host-bound).")


def render(run: Run) -> None:
    """Lane pair per rank for one job and step, from the trace when there is one, and the
    drawn step's numbers per rank."""
    jobs = run.jobs[(run.jobs["kind"] == "train") & (run.jobs["status"] == "complete")].reset_index(drop=True)
    if jobs.empty:
        st.info("This run has no completed training job to draw.")
        return
    c1, c2 = st.columns([2, 1])
    summary = data.cached_summary(run, data.key(run))
    job = c1.selectbox("Job", list(jobs["job_id"]), index=_default_job(run, jobs), key=f"tl-job-{run.path}",
                       help="One (variant, world size, bucket size) cell of the sweep.")
    steps = run.steps[run.steps["job_id"] == job]
    traced_steps = run.traced_steps(job)
    all_steps = sorted(int(s) for s in steps["step"].unique()) or [0]
    default = traced_steps[0] if traced_steps else all_steps[0]
    step = c2.selectbox("Step", all_steps, index=all_steps.index(default), key=f"tl-step-{run.path}-{job}",
                        format_func=lambda s: f"{s} (profiled, traced)" if s in traced_steps else str(s))
    ranks = pick_ranks(run, job, steps)
    with st.spinner("Reading the traces of this job…"):
        fig = lanes_figure(run, data.key(run), job, int(step), ranks)
    st.plotly_chart(fig, key=f"tl-{run.path}-{job}-{step}")
    if steps["rank"].nunique() > MAX_RANK_LANES:
        st.plotly_chart(rank_step_heat_figure(rank_step_matrix(steps), f"{job}: step time of every rank"),
                        key=f"tl-heat-{run.path}-{job}")
    row = summary[summary["job_id"] == job] if "job_id" in summary else summary.iloc[:0]
    if len(row):
        _step_cards(run, job, int(step), row.iloc[0])
    traced = step in traced_steps
    source = ("each rank's torch.profiler trace (placed on the shared clock by its clock-sync markers; "
              "if they are missing, from steps.csv and collectives.csv)" if traced else
              "steps.csv phases (compute) and collectives.csv intervals (comm): this step was not traced")
    on_gpu = bool((lanes(run, data.key(run), job, int(step), ranks)["kind"] == "cpu").any())
    alone = (" At 1 rank a collective has no peer: its calls move nothing, so no comm lane is drawn and comm "
             "is 0 (the kernels it still launches stay in the stream lanes)." if world_size(run, job) == 1 else "")
    st.caption((GPU_LANES if on_gpu else CPU_LANES) + alone +
               f" Drawn from {source}. Drag to zoom, double-click to reset; dense regions are merged into single "
               f"bars (hover shows how many ops). {FORMULAS['overlap_pct']}")


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
