"""Hang page: why a job of this run hung. Every rank's last collectives (PyTorch's flight
recorder, collected by dpcore's watchdog into ``hang/<job_id>/``) on one axis of sequence
numbers with the divergence marked, the verdict, and each rank's stack beside it.

The verdict is :func:`dpcore.contract.flightrec.verdict`'s, the one the watchdog wrote into the
job's error and ``python -m dpcore hang`` prints.
"""
from __future__ import annotations

import streamlit as st

from dpcore.contract.units import EMPTY, exact_size
from dpcore.read.analysis.hang import hang_collectives, hang_verdict, rank_table
from dpcore.read.dashboard import frame
from dpcore.read.dashboard.text import md
from dpcore.read.plots.hang import hang_figure
from dpcore.read.rundir.hang import load_hangs
from dpcore.read.rundir.load import Run

INTRO = ("Why a job hung: each rank's last collectives from PyTorch's flight recorder, the "
         "collective they diverge at, and every rank's stack.")


def render(run: Run) -> None:
    """The run's hung jobs, one at a time."""
    if not (run.path / "hang").is_dir():
        st.info("No job of this run hung (dpcore's watchdog writes hang/<job_id>/ when one "
                "does; try `profile --inject-hang 1:3:sleep` to see one).")
        return
    try:
        sets = load_hangs(run.path, run.root)
    except ValueError as exc:  # DumpError too: one line naming the file
        st.error(f"Cannot show this run's hang: {md(str(exc))}")
        return
    if not sets:
        st.info("This run's hang/ folder holds no job's dumps inside the profiles folder.")
        return
    names = [s.job_id for s in sets]
    pick = st.selectbox("Hung job", names, key=f"hang-job-{run.path.name}")
    hs = sets[names.index(pick)]
    v = hang_verdict(hs.dumps, hs.world_size)
    for line in hs.skipped:
        st.caption(f"skipped: {md(line)}")
    (st.warning if v["kind"] in ("missing", "desync") else st.info)(
        f"**{v['kind']}**: {md(v['message'])}")
    st.plotly_chart(hang_figure(hang_collectives(hs.dumps), v), key=f"hang-fig-{run.path.name}")
    table = rank_table(hs.dumps, hs.stacks)
    table["bytes"] = [exact_size(b) for b in table["bytes"]]  # "294 KiB = 301,352 B", not 301352
    st.dataframe(table, hide_index=True, width="stretch", placeholder=EMPTY)
    for r in sorted(hs.stacks):
        with st.expander(f"rank {r} stack" + (" (lagging)" if r in v["lagging_ranks"] else "")):
            st.code(hs.stacks[r], language=None)


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
