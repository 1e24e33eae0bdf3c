"""Hold what is not the page's content (the navigation, the run pickers, the Overview's summary
table) until the browser has drawn the page, once per browser session.

Why (issue 34: the first chart after a reload within 1 s): after a reload the browser does
everything on one main thread, and Plotly draws the chart only after the rest of what the same
script run sent: the sidebar's 16 navigation links, the select box's and toggle's bundles, the
data grid's bundle and its 52 rows. Measured on the samples
(``benchmarks/bench_dashboard_first_chart.py --b-tree --profile-main-thread``): holding the summary
table alone, the chart came in 0.80x the time; holding the navigation and the pickers too took the
main thread's CPU time from the commit to the chart from 676 to 569 ms (README, "First chart").

How: the first run of a browser session draws the page with the navigation hidden and without
the pickers and the held table, and ends with a tiny script (an ``st.components.v2`` component,
no iframe, :func:`release`). It reports once the page is drawn: no element is still waiting for
its lazily loaded bundle (Streamlit's skeleton) and every Plotly chart has its svg, then one frame
more (so that the chart is painted first). The report reruns the app with the session marked
(:data:`DRAWN`): that run draws everything, and so does every later run of the session. A page
that never draws (a chart that failed) is released after :data:`FALLBACK_MS` anyway.

Where no browser can report (``streamlit.testing``'s AppTest, bare mode: no HTTP headers), nothing
is held: every run draws everything.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

#: Session key: set once the browser has drawn a page of this session.
DRAWN = "dpcore_first_chart_drawn"
#: The most the held elements wait (ms) after the watcher is mounted when the page never draws.
FALLBACK_MS = 1500
#: Marks the watcher's element while it is in the page: from its mount until the rerun its report
#: asked for has ended (that run no longer draws it). Browser tests wait for it to go.
WAITING_ATTR = "data-dpcore-waiting-for-chart"
#: The watcher's key (one per session: it is drawn at the end of the app's script).
KEY = "dpcore-after-first-page"

_JS = """
export default function (component) {
  const { setStateValue, parentElement } = component;
  const host = parentElement.host || parentElement;
  host.setAttribute('WAITING', '');
  let done = false;
  // drawn: no element still waits for its bundle (Streamlit shows a skeleton in its place) and
  // every Plotly chart has its svg
  const drawn = () => {
    if (document.querySelector('[data-testid=stSkeleton]')) return false;
    for (const c of document.querySelectorAll('[data-testid=stPlotlyChart]')) {
      if (!c.querySelector('.main-svg')) return false;
    }
    return true;
  };
  const report = () => setStateValue('drawn', true);
  const fire = () => {
    if (done) return;
    done = true;
    observer.disconnect();
    clearTimeout(timer);
    // one frame later, so the page is painted before the held elements' work starts
    // (a hidden tab gets no frames: report at once there)
    if (document.hidden) report(); else requestAnimationFrame(() => setTimeout(report, 0));
  };
  const observer = new MutationObserver(() => { if (drawn()) fire(); });
  const timer = setTimeout(fire, FALLBACK);
  if (drawn()) fire(); else observer.observe(document.body, { childList: true, subtree: true });
  return () => { observer.disconnect(); clearTimeout(timer); };
}
""".replace("WAITING", WAITING_ATTR).replace("FALLBACK", str(FALLBACK_MS))

_component: Callable[..., Any] | None = None


def _watcher() -> Callable[..., Any]:
    """The component, registered once per process (registering it again only logs a warning)."""
    global _component
    if _component is None:
        _component = st.components.v2.component("dpcore_after_first_page", js=_JS)
    return _component


def has_browser() -> bool:
    """Whether this session is a browser's (it sent HTTP headers); AppTest and bare mode send none."""
    return bool(st.context.headers)


def holding() -> bool:
    """True while this run should leave out what is held: a browser session whose browser has not
    yet drawn a page. The same answer all through one run (only a report, which starts a new
    run, changes it)."""
    return has_browser() and not st.session_state.get(DRAWN)


def _drawn() -> None:
    """The watcher's report (a callback: it runs before the rerun it starts)."""
    st.session_state[DRAWN] = True


def release() -> None:
    """At the end of a holding run: mount the watcher, whose report reruns the app with the held
    elements. Draws nothing when not :func:`holding`."""
    if holding():
        _watcher()(key=KEY, default={"drawn": False}, on_drawn_change=_drawn, height=0)
