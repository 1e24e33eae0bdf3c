"""Live page: a running job's steps per rank, redrawn every :data:`REFRESH_S` seconds while the
run is ``running``; once it ends, the last state and links to the full views.

Why a fragment: ``st.fragment(run_every=...)`` redraws only this part, so a person watching does
not lose the sidebar's state; when run.json says the run ended, one full rerun reloads the run
and the page draws without a timer. Rows come from live.csv (rank 0 appends a row per rank and
step within ~0.5 s of the step's end), read fresh each time
(:func:`dpcore.read.rundir.live.read_live`); the numbers are :mod:`dpcore.read.analysis.live`'s.
"""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read.analysis.live import (
    MIN_STEPS,
    PERSISTENT_SHARE,
    WINDOW,
    job_rows,
    latest_job,
    rank_stats,
    slowest_counts,
)
from dpcore.read.analysis.rank_pick import rank_step_matrix
from dpcore.read.dashboard import frame
from dpcore.read.dashboard.pages import spec
from dpcore.read.dashboard.text import md
from dpcore.read.plots.heat import rank_step_heat_figure
from dpcore.read.rundir.hang import hung_jobs
from dpcore.read.rundir.live import read_live, run_status
from dpcore.read.rundir.load import Run

INTRO = ("Step time of every rank as the run runs (live.csv), refreshed every "
         "second or two while the run is running.")
REFRESH_S = 1.5


def timed_rows(live: pd.DataFrame) -> pd.DataFrame:
    """live.csv's rows without the profiled steps (run under torch.profiler, which slows them: on
    the sample they put the p90 at 104 ms where the timed steps' is 71 ms)."""
    if "profiled" not in live:
        return live
    return live[~live["profiled"].astype("boolean").fillna(False).astype(bool)]


def body(run: Run, was_running: bool) -> None:
    """What the page shows of the run's live rows."""
    status = run_status(run.path, str(run.meta.get("status", "?")))
    if was_running and status != "running":
        st.rerun()  # the run ended: reload it, and draw without the timer
    live = read_live(run.path)
    if live.empty:
        st.info("No live rows in this run: live.csv fills as soon as a job's first timed step ends. "
                "A run recorded before dpcore wrote live.csv, or whose jobs ended before a timed step, "
                "has none; its finished numbers are on the other pages.")
        _hang_link(run)
        return
    jobs = list(dict.fromkeys(live["job_id"]))
    latest = latest_job(live)
    job = st.selectbox("Job", jobs, index=jobs.index(latest) if latest in jobs else 0,
                       key=f"live-job-{run.path.name}")
    rows = job_rows(live, job, last=None)
    recent = job_rows(timed_rows(live), job)  # the stats: timed steps only
    last = rows["wall_time"].max()
    when = (f"last row {max(0.0, time.time() - last):.1f} s ago" if status == "running"
            else f"run {status}")
    st.markdown(f"**{md(job)}** · {'running' if status == 'running' else 'ended'} · "
                f"{rows['step'].nunique()} step(s) seen · {when}")
    # the last 400 steps of every rank, one row per rank: the same heat strip as Overview and
    # Stragglers (at most ~600 px tall, so a 1,024-rank job stays one screen)
    recent_steps = rows[rows["step"] > rows["step"].max() - 400]
    st.plotly_chart(rank_step_heat_figure(rank_step_matrix(recent_steps), f"{job}: step time of every rank"),
                    key=f"live-strip-{run.path.name}")
    left, right = st.columns(2)
    with left:
        st.markdown(f"**Per rank, last {WINDOW} timed steps**")
        st.caption("Steps run under torch.profiler (profiled) are left out: the profiler slows them.")
        st.dataframe(rank_stats(recent), hide_index=True, width="stretch", placeholder=EMPTY,
                     column_config={
            "step_ms_p50": st.column_config.NumberColumn("median step (ms)", format="%.2f"),
            "step_ms_p90": st.column_config.NumberColumn("p90 step (ms)", format="%.2f"),
            "comm_ms": st.column_config.NumberColumn("comm (ms)", format="%.2f",
                                                     help="union of the rank's collectives in the step"),
            "exposed_comm_ms": st.column_config.NumberColumn(
                "exposed comm (ms)", format="%.2f", help="known once the job's traces are read")})
    with right:
        slow = slowest_counts(recent)
        st.markdown(f"**Slowest rank, last {WINDOW} timed steps**")
        if rows["rank"].nunique() < 2:
            # one rank is the slowest of one in every step: no straggler to look for
            st.caption("One rank: no other rank to wait for, so no slowest rank.")
            slow = slow.iloc[0:0]
        if not slow.empty:
            st.dataframe(slow, hide_index=True, width="stretch", placeholder=EMPTY, column_config={
                "slowest": st.column_config.NumberColumn(
                    "slowest in", help="steps in which this rank had the most work outside "
                                       "communication (step − comm): the one the others waited for"),
                "persistent": st.column_config.CheckboxColumn(
                    "persistent straggler", help=f"slowest in at least {PERSISTENT_SHARE:.0%} of the "
                                                 f"steps (and {MIN_STEPS}+): a one-off stall is not")})
        flagged = slow[slow["persistent"]]
        for r in flagged["rank"]:
            st.warning(f"rank {int(r)} is a persistent straggler in {md(job)}")
    _hang_link(run)
    if status != "running":
        st.caption("The run has ended: the full views have every number.")
        for title in ("Overview", "Timeline", "Stragglers"):
            try:
                st.page_link(spec(title).path, label=f"Open {title}")
            except Exception:  # noqa: BLE001 - outside app.py's navigation (a test): no link
                st.markdown(f"See the {title} page.")


def _hang_link(run: Run) -> None:
    """A link to the Hang page for each job of the run that hung (its hang/<job_id>/ folder holds
    what the watchdog collected): the Live rows stop at the hang, the Hang page says why."""
    for job in hung_jobs(run.path):
        st.warning(f"{md(job)} hung: its ranks' last collectives and stacks are on the Hang page.")
        try:
            st.page_link(spec("Hang").path, label=f"Open Hang ({md(job)})")  # labels are Markdown
        except Exception:  # noqa: BLE001 - outside app.py's navigation (a test): no link
            st.markdown("See the Hang page.")


def render(run: Run) -> None:
    """Refresh while running, draw once otherwise."""
    if run_status(run.path, str(run.meta.get("status", "?"))) == "running":
        st.fragment(run_every=REFRESH_S)(lambda: body(run, True))()
    else:
        body(run, False)


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
