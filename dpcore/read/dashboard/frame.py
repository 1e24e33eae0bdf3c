"""What every dashboard page shares: the runs app.py picked, the per-run frame, the error wrapper.

Why a hand-over through session state: Streamlit runs app.py (navigation and the shared sidebar)
and then the chosen page's file in the same script run, and a page file takes no arguments. So
app.py leaves the profiles folder, the run listing, the loaded runs and the current page in
``st.session_state[CONTEXT]`` right before it runs the page, on every run (so it is never
stale); the page reads them back with :func:`context`.

Why :func:`safely`: run data is hostile input; a run that breaks one page must show a readable
error (and its traceback on demand), never take the whole app down.
"""
from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from dpcore.read.dashboard import data, launcher
from dpcore.read.dashboard.pages import PageSpec
from dpcore.read.dashboard.picker import offer_other_run
from dpcore.read.dashboard.text import md
from dpcore.read.rundir.load import Run

CONTEXT = "dpcore_context"


@dataclass(frozen=True)
class Context:
    """What app.py hands to the page it runs."""
    root: Path  #: the profiles folder (every file the app reads lies inside it)
    runs: pd.DataFrame  #: every run under root (`data.cached_runs`), newest first
    loaded: list[Run]  #: the runs picked in the sidebar (two in compare mode), loaded
    page: PageSpec  #: the page being run


def hand_over(ctx: Context) -> None:
    """app.py: leave the context for the page about to run."""
    st.session_state[CONTEXT] = ctx


def context() -> Context:
    """A page: what app.py picked for this run (stops with a note when the page was started
    on its own, without app.py)."""
    ctx = st.session_state.get(CONTEXT)
    if not isinstance(ctx, Context):
        st.error("This page is part of the dpcore dashboard: start it with `streamlit run app.py`.")
        st.stop()
    return ctx


def safely(fn: Callable[[], None], where: str) -> None:
    """Run one part of a page; a bad run shows a readable error instead of taking the page down."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - hostile data must not crash the app
        st.error(f"{where} could not be drawn: {type(exc).__name__}: {md(exc)}")
        with st.expander("Details"):
            st.code(traceback.format_exc(), language=None)


def each_run(render: Callable[[Run], None]) -> None:
    """The body of a page drawn once per picked run: a subheader per run in compare mode, the
    offer of a run that has data for this page, the loader's warnings, and ``render`` inside
    :func:`safely`."""
    ctx = context()
    if not ctx.loaded:
        st.info("Pick another run in the sidebar.")
        return
    for run in ctx.loaded:
        if len(ctx.loaded) > 1:
            st.subheader(f"Run {md(run.path.name)}")
        offer_other_run(ctx.runs, ctx.page, run.path.name)
        problem_list([*run.warnings, *_trace_problems(run, ctx.page)], "problem(s) with this run's data")
        safely(functools.partial(render, run), f"{ctx.page.title} of run {md(run.path.name)}")


def _trace_problems(run: Run, page: PageSpec) -> list[str]:
    """The jobs whose traces this page's numbers could not use (only on pages that use traces)."""
    if not page.traces:
        return []
    try:
        return data.trace_problems(run)
    except Exception as exc:  # noqa: BLE001 - the page itself reports a failed read
        return [f"traces not read: {type(exc).__name__}: {exc}"]


def steps_while_traces_are_read(ctx: Context) -> None:
    """Before a page that uses traces, on a picked run whose traces this server has not read yet
    (a cold first visit: the read takes seconds): each job's step time from steps.csv at once,
    under a line saying what is being read, then the read (its spinner); all of it is cleared
    when the read is done and the page draws. Nothing on a warm run (the read is a cache hit).
    A failed read is left to the page, which reports it."""
    if not ctx.page.traces:
        return
    cold = [run for run in ctx.loaded if len(run.steps) and not data.traces_read(run)]
    if not cold:
        return
    box = st.empty()
    with box.container():
        for run in cold:
            steps = data.cached_timed_steps(run, data.key(run))
            st.info(f"Reading the traces of run {md(run.path.name)} once (the rank cache makes later visits fast); "
                    "the page follows. Meanwhile, each job's step time from steps.csv (ms, median and p10-p90 "
                    "of the timed steps):")
            if len(steps):
                st.dataframe(steps, hide_index=True)
            try:
                data.cached_trace_steps(run, data.key(run))
            except Exception:  # noqa: BLE001 - the page reads the traces again and shows the error
                pass
    box.empty()


def problem_list(lines: list[str], what: str) -> None:
    """Problems with the data, one collapsed box for all of them, one line each inside.

    Why collapsed: with 31 bad runs in a folder, one warning box per run pushed every page
    below the fold; the count is what a reader needs first, the lines on demand."""
    if not lines:
        return
    with st.expander(f"{len(lines)} {what}", icon=":material/warning:"):
        st.markdown("\n".join(f"- {md(w)}" for w in lines))


def landing(root: Path, app_dir: Path) -> None:
    """What every page shows while the profiles folder holds no run: where runs come from, and
    a one-click quick profile."""
    st.title("No profiling runs yet")
    st.markdown(
        f"dpcore looks for runs in `{root}` (set `DPCORE_PROFILES` to use another folder). A run is what "
        "`python -m dpcore profile` writes: per-step timings, every collective and message, and Chrome traces.\n\n"
        "Start with a quick CPU profile: a tiny MLP trained by `single`, `flat`, `ring`, `overlap` and `bucketed` "
        "data parallelism on 1 and 2 processes (gloo). It takes about a minute.")
    busy = st.session_state.get("launch") is not None
    if st.session_state.get("launch_busy"):  # another dashboard's profile holds the machine
        st.warning(md(st.session_state.pop("launch_busy")))
    if st.button("Run a quick CPU profile", type="primary", disabled=busy, key="quick"):
        launcher.quick_start(root, app_dir)
        st.rerun()
