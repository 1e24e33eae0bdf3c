"""dpcore dashboard: `streamlit run app.py`.

Renders only: every number comes from `dpcore.read.analysis` (the same functions the CLI uses) and
every figure from `dpcore.read.plots`; loads are cached with `st.cache_data` (dpcore.read.dashboard.data).
Runs are read from `profiles/` next to this file, or from $DPCORE_PROFILES.
"""
from __future__ import annotations

import traceback
from collections.abc import Callable

import streamlit as st

from dpcore.read.dashboard import data, launcher
from dpcore.read.dashboard.runs import folders, offer_other_run, pick_runs, runs_view
from dpcore.read.dashboard.text import md
from dpcore.read.dashboard.compare import compare_overview
from dpcore.read.dashboard.views import overview_view, scaling_view, timeline_view
from dpcore.read.dashboard.views_comm import bandwidth_view, buckets_view, traces_view
from dpcore.read.dashboard.views_ring import ring_view
from dpcore.read.dashboard.import_view import import_view
from dpcore.read.dashboard.views_stragglers import stragglers_view
from dpcore.read.dashboard.views_memory import memory_view
from dpcore.read.dashboard.views_whatif import whatif_view

VIEWS = ["Runs", "Overview", "Timeline", "Scaling", "Stragglers", "Memory", "Ring messages", "Bandwidth", "Buckets", "What-if",
         "Traces", "New run", "Import"]
INTRO = {
    "Overview": "How long one training step takes per variant and world size, and how much of it is communication.",
    "Timeline": "What every rank does during one step: compute above, communication below, on one clock.",
    "Scaling": "What adding ranks buys: step time, throughput, speedup and efficiency against world size.",
    "Ring messages": "Every point-to-point message of the from-scratch all-reduce algorithms.",
    "Bandwidth": "All-reduce bandwidth against message size, measured like nccl-tests.",
    "Buckets": "How the gradient bucket size trades launch overhead against overlap.",
    "Traces": "The raw torch.profiler traces, for Perfetto or chrome://tracing.",
    "Stragglers": "Which rank arrives last at each collective, and how long the others wait for it.",
    "Memory": "Memory per rank against step time for every variant, and the bytes each one moves per step.",
    "What-if": "A measured bucketed/DDP job replayed at other bucket sizes, world sizes and networks.",
    "Import": "Traces you already have (torch.profiler, tensorboard_trace_handler, torchtitan) as a run.",
}

st.set_page_config(page_title="dpcore · data-parallel profiler", page_icon="⚡", layout="wide")
root = data.profiles_root()
APP_DIR = data.APP_DIR


def safely(fn: Callable[[], None], where: str) -> None:
    """Run one view; a bad run shows a readable error instead of taking the whole page down."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - hostile data must not crash the app
        st.error(f"{where} could not be drawn: {type(exc).__name__}: {md(exc)}")
        with st.expander("Details"):
            st.code(traceback.format_exc(), language=None)


st.sidebar.title("⚡ dpcore")
st.sidebar.caption("Profiler and dashboard for data-parallel training.")
if "open_run" in st.session_state:  # a profile started from this page has finished: open it
    st.session_state["run_a"] = st.session_state.pop("open_run")
    st.session_state["view"] = "Overview"
if "open_run_keep_view" in st.session_state:  # "Open <run>" from a view the run had no data for
    st.session_state["run_a"] = st.session_state.pop("open_run_keep_view")
st.session_state.setdefault("view", "Overview")
view = st.sidebar.radio("View", VIEWS, key="view")

if st.session_state.get("launch") is not None:
    launcher.follow()
launcher.show_result()

runs, warnings = data.list_runs(root)
for w in warnings:
    st.warning(f"Skipped an unreadable run: {md(w)}")

if runs.empty:
    st.title("No profiling runs yet")
    st.markdown(
        f"dpcore looks for runs in `{root}` (set `DPCORE_PROFILES` to use another folder). A run is what "
        "`python -m dpcore profile` writes: per-step timings, every collective and message, and Chrome traces.\n\n"
        "Start with a quick CPU profile: a tiny MLP trained by `single`, `flat`, `ring`, `overlap` and `bucketed` "
        "data parallelism on 1 and 2 processes (gloo). It takes about a minute.")
    busy = st.session_state.get("launch") is not None
    if st.button("Run a quick CPU profile", type="primary", disabled=busy, key="quick"):
        launcher.quick_start(root, APP_DIR)
        st.rerun()
    if view == "New run":
        launcher.new_run_form(root, APP_DIR)
    if view == "Import":
        import_view(root)
    st.stop()

chosen = pick_runs(runs)  # folder names: unique, unlike run ids (a copied run keeps its id)
paths = dict(zip(folders(runs), runs["path"]))
loaded = []
for folder in chosen:
    try:
        loaded.append(data.load_run(paths[folder], root))
    except Exception as exc:  # noqa: BLE001 - RunLoadError names the file; anything else is still a bad run
        st.warning(f"Run {md(folder)} could not be loaded: {md(exc)}")
if not loaded and view not in ("Runs", "New run", "Import"):
    st.info("Pick another run in the sidebar.")
    st.stop()

st.title(view)
if view in INTRO:
    st.caption(INTRO[view])
if view == "Runs":
    safely(lambda: runs_view(runs, loaded), "The run list")
elif view == "New run":
    st.caption(f"Starts `python -m dpcore profile … --progress json` in the background; the run is written to `{root}`.")
    launcher.new_run_form(root, APP_DIR)
elif view == "Import":
    safely(lambda: import_view(root), "The import")
else:
    if view == "Overview" and len(loaded) > 1:
        safely(lambda: compare_overview(loaded), "The comparison")
    render = {
        "Overview": lambda r: overview_view(r, peers=loaded), "Scaling": lambda r: scaling_view(r, peers=loaded), "Bandwidth": bandwidth_view, "Buckets": buckets_view,
        "Ring messages": ring_view, "Timeline": lambda r: timeline_view(r, root),
        "Traces": lambda r: traces_view(r, root),
        "Stragglers": lambda r: stragglers_view(r, root),
        "Memory": lambda r: memory_view(r, root),
        "What-if": whatif_view,
    }[view]
    for run in loaded:
        if len(loaded) > 1:
            st.subheader(f"Run {md(run.path.name)}")
        offer_other_run(runs, view, run.path.name)
        for w in run.warnings:  # rows the loader could not read and skipped
            st.warning(md(w))
        safely(lambda: render(run), f"{view} of run {md(run.path.name)}")
