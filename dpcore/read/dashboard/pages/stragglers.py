"""Stragglers page: which rank arrives last at the collectives, and what that costs the others.

Why beside the overview: a slow step can be slow because one rank is late (a noisy neighbour,
an uneven data loader) rather than because communication is slow; the wait/transfer split
tells the two apart. Numbers come from `dpcore.read.analysis.stragglers` (the same functions
as `python -m dpcore stragglers`), figures from `dpcore.read.plots.stragglers`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dpcore.read.analysis.rank_pick import MAX_RANK_LANES, default_ranks, rank_step_matrix
from dpcore.read.analysis.stragglers import (
    MIN_COLLECTIVES,
    MIN_WAIT_MS,
    collective_waits,
    rank_host_idle_pct,
    straggler_summary,
    straggler_threshold_pct,
    straggler_verdict,
)
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.text import md
from dpcore.read.plots.heat import rank_step_heat_figure
from dpcore.read.plots.stragglers import last_arrival_figure, wait_transfer_by_rank_figure
from dpcore.read.rundir.load import Run

INTRO = "Which rank arrives last at each collective, and how long the others wait for it."

FORMULA = ("For one collective matched across ranks (same job, step and sequence number): a rank's wait = "
           "latest arrival − its own arrival, at most its comm time; the rank with wait 0 arrived last "
           "(exact ties: each tied rank). "
           "Start skew = latest − earliest start; end skew = latest − earliest end. Comm = end − arrival "
           "= wait + transfer (the time after everyone arrived). Arrival = launch on the shared clock.")
NUM = st.column_config.NumberColumn
TABLE_CONFIG = {
    "rank": NUM("rank", format="%d"),
    "collectives": NUM("collectives", help="Collectives of this job seen on every rank (matched).", format="%d"),
    "last_arrival_pct": NUM("arrived last %", help="Share of the collectives where this rank had wait 0.",
                            format="%.1f%%"),
    "mean_wait_ms": NUM("mean wait (ms)", help="Mean of latest arrival − own arrival.", format="%.3f"),
    "p90_wait_ms": NUM("p90 wait (ms)", help="90th percentile of the wait.", format="%.3f"),
    "wait_ms": NUM("total wait (ms)", help="Sum of the waits over the matched collectives.", format="%.2f"),
    "transfer_ms": NUM("total transfer (ms)", help="Sum of (end − latest arrival), ≥ 0.", format="%.2f"),
    "comm_ms": NUM("total comm (ms)", help="Sum of (end − own arrival) = wait + transfer.", format="%.2f"),
    "wait_fraction": NUM("wait / comm", help="Total wait / total comm time, in percent.", format="%.1f%%"),
    "mean_start_skew_ms": NUM("start skew (ms)", help="Mean of latest − earliest start per collective.",
                              format="%.3f"),
    "mean_end_skew_ms": NUM("end skew (ms)", help="Mean of latest − earliest end per collective.", format="%.3f"),
}


@st.cache_data(show_spinner=False, max_entries=16)
def waits(_run: Run, run_key: tuple) -> pd.DataFrame:
    """collective_waits of the run's collectives.csv (cached per run and file stamp)."""
    return collective_waits(_run.collectives)


@st.cache_data(show_spinner=False, max_entries=16)
def summary(_run: Run, run_key: tuple) -> pd.DataFrame:
    """straggler_summary per (job, rank) of the run (cached per run and file stamp)."""
    return straggler_summary(waits(_run, run_key))


@st.cache_data(show_spinner=False, max_entries=16)
def charts(_run: Run, run_key: tuple, job_id: str, ranks: tuple[int, ...]) -> tuple[go.Figure, go.Figure]:
    """Last arrivals per rank, and wait against transfer per rank, of one job's drawn ranks."""
    s = summary(_run, run_key)
    s = s[(s["job_id"] == job_id) & s["rank"].isin(ranks)]
    return (last_arrival_figure(s, "Who arrived last"),
            wait_transfer_by_rank_figure(s, "Comm time per collective: waiting vs transfer"))


def render(run: Run) -> None:
    """Job picker, the per-rank table, last-arrival bars, wait/transfer bars and the formula;
    everything from the run's collectives.csv."""
    if run.collectives.empty:
        st.info("This run recorded no collectives (an all-reduce benchmark run, or training jobs that did not "
                "finish): stragglers are measured on the collectives of training jobs with 2 or more ranks.")
        return
    key = data.key(run)
    table = summary(run, key)
    if table.empty:
        st.info("No collective of this run was seen on 2 or more ranks of a job (world size 1 only, or every "
                "collective missing on some rank): there is nothing to match across ranks.")
        return
    jobs = list(dict.fromkeys(table["job_id"]))
    # default: the job with the clearest straggler, the one that teaches the most
    top = table.groupby("job_id", sort=False)["last_arrival_pct"].max()
    default = str(top.idxmax()) if not top.empty else jobs[0]
    job = st.selectbox("Job", jobs, index=jobs.index(default), key=f"sg-job-{run.path}")
    rows = table[table["job_id"] == job]
    ws = len(rows)
    all_waits = waits(run, key)
    ledger = data.cached_gpu(run, key)[0]
    idle = rank_host_idle_pct(ledger[ledger["job_id"] == job]) if len(ledger) else None
    st.markdown(f"**{md(job)}**: {md(straggler_verdict(rows, None, all_waits[all_waits['job_id'] == job], idle))}.")
    st.dataframe(rows.drop(columns="job_id").assign(wait_fraction=100 * rows["wait_fraction"]), hide_index=True,
                 width="stretch", column_config=TABLE_CONFIG)
    all_ranks = sorted(int(r) for r in rows["rank"])
    ranks = tuple(all_ranks)
    steps = run.steps[run.steps["job_id"] == job]
    if len(all_ranks) > MAX_RANK_LANES:
        default = default_ranks(all_ranks, steps, rows)
        picked = st.multiselect(f"Ranks drawn (of {ws}; at most {MAX_RANK_LANES})", all_ranks, default=default,
                                max_selections=MAX_RANK_LANES, key=f"sg-ranks-{run.path}-{job}",
                                help="By default rank 0, the slowest rank and the rank most often last. "
                                     "The table above and the heat strip below have every rank.")
        ranks = tuple(sorted(int(r) for r in picked)) or tuple(default)
    last_fig, split_fig = charts(run, key, job, ranks)
    left, right = st.columns(2)
    with left:
        st.plotly_chart(last_fig, key=f"sg-last-{run.path}-{job}")
    with right:
        st.plotly_chart(split_fig, key=f"sg-split-{run.path}-{job}")
    if len(all_ranks) > MAX_RANK_LANES and not steps.empty:
        st.plotly_chart(rank_step_heat_figure(rank_step_matrix(steps), f"{job}: step time of every rank"),
                        key=f"sg-heat-{run.path}-{job}")
    st.caption(f"{FORMULA} A rank is named the straggler when it arrived last in at least "
               f"{straggler_threshold_pct(ws):.0f}% of the collectives (halfway between chance, 100/N, and "
               f"always), of at least {MIN_COLLECTIVES} collectives, and the others waited at least "
               f"{MIN_WAIT_MS:g} ms on average (less is a busy host's launch skew). For asynchronous "
               "collectives (overlap, bucketed, DDP) a wait may have been spent computing: it measures skew, "
               "not idle time. When no one rank is named, the smallest set of ranks (at most half of them) that "
               "were the last to arrive together in at least halfway between chance and always of the "
               "collectives, and each waited less than every other rank, is named instead; their GPUs' host "
               "idle says whether a slow host made them late.")


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
