"""dpcore dashboard: `streamlit run app.py`.

Renders only: the navigation and the sidebar every page shares. Each page is one file in
`dpcore/read/dashboard/pages/` (listed, with its title and URL path, in `pages.PAGES`);
`st.navigation` picks the one the user chose and this script runs it last. A page takes its
numbers from the analysis (`dpcore.read.analysis`, `dpcore.read.whatif`), its figures from
`dpcore.read.plots`, and caches what it computes with `st.cache_data` keyed by the run's path
and file stamp (`dpcore.read.dashboard.data`).

Shared by every page: the run picker in the sidebar (one run, or two in compare mode; drawn
after the page, into its place under the title, from the runs `picker.planned_runs` gave it), which
also opens the run that a finished profile or import (on the Overview) or a page's "Open <run>"
button (on that page) asks for; the progress of a profile started from the app; and, with no run
in the profiles folder, the landing on every page (New run and Import still work below it). On a cold first visit (the
server has not read the picked run's traces yet: seconds) a page that uses traces is preceded by
each job's step time from steps.csv while they are read (`frame.steps_while_traces_are_read`).
Runs are read from `profiles/` next to this file, or from $DPCORE_PROFILES.
"""
from __future__ import annotations

import streamlit as st

from dpcore.read.dashboard import data, frame, launcher, server_gc
from dpcore.read.dashboard.pages import PAGES
from dpcore.read.dashboard.picker import OPEN_HERE, OPEN_ON_OVERVIEW, load_picked, pick_runs, planned_runs

if server_gc.served():  # a served app (not AppTest): short garbage collections
    server_gc.freeze_long_lived()
st.set_page_config(page_icon="⚡", layout="wide")
root = data.profiles_root()
pages = {spec.title: st.Page(spec.path, title=spec.title, url_path=spec.url_path, icon=spec.icon,
                             default=spec.default) for spec in PAGES}
current = st.navigation(list(pages.values()), expanded=True)
spec = next(s for s in PAGES if s.title == current.title)

st.sidebar.title("⚡ dpcore")
st.sidebar.caption("Profiler and dashboard for data-parallel training.")
if OPEN_ON_OVERVIEW in st.session_state:  # a profile or an import started from the app has finished
    if current.title != "Overview":
        st.switch_page(pages["Overview"])  # reruns on the Overview; the request stays until then
    st.session_state["run_a"] = st.session_state.pop(OPEN_ON_OVERVIEW)
if OPEN_HERE in st.session_state:  # "Open <run>" on a page the picked run had no data for
    st.session_state["run_a"] = st.session_state.pop(OPEN_HERE)

if st.session_state.get("launch") is not None:
    launcher.follow()
launcher.show_result()

runs, warnings = data.cached_runs(root)
frame.problem_list(warnings, "unreadable run(s) skipped")

if runs.empty:
    frame.landing(root, data.APP_DIR)
    if spec.title in ("New run", "Import"):
        frame.hand_over(frame.Context(root, runs, [], spec))
        current.run()
    st.stop()

# The run pickers' place in the sidebar, filled after the page: the page's first chart comes
# before the pickers' bundles.
picker_slot = st.sidebar.container()
loaded = load_picked(runs, planned_runs(runs), root)  # by folder name: unique, unlike run ids
ctx = frame.Context(root, runs, loaded, spec)
frame.hand_over(ctx)
st.title(spec.title)
try:
    frame.steps_while_traces_are_read(ctx)
    current.run()
finally:  # also after a page's st.stop(): a run without its pickers would forget their values
    pick_runs(runs, picker_slot)
