"""Hold what follows a page's first chart until the browser has drawn that chart.

Why (issue 34: the first chart after a reload within 1 s): Streamlit sends the Overview's chart
and its summary table in one burst, and the browser then loads, evaluates and lays out the data
grid's bundle (its chunk, Arrow, the grid's 52 rows) on the same main thread Plotly needs to
draw. Measured on the samples (``benchmarks/bench_dashboard_first_chart.py --b-tree``): the page
without its table draws the chart in 0.80x the time. So, once per browser session, the table
waits: a tiny script (an ``st.components.v2`` component, no iframe) watches the page, and one
frame after a Plotly chart is in it (so that it is painted first) it reports "drawn"; the
fragment holding the table then reruns, alone, and draws it. After that the session has drawn a
chart, and every later run draws the table at once.

Where no browser can report (``streamlit.testing``'s AppTest, bare mode: no HTTP headers), nothing
waits: the table is drawn in the same run. Where the page draws no chart (it failed), the watcher
reports anyway after :data:`FALLBACK_MS`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

#: Session key: set once a chart has been drawn in this browser session.
DRAWN = "dpcore_first_chart_drawn"
#: The most a held element waits (ms) when no chart appears (a page whose chart failed).
FALLBACK_MS = 1500
#: Marks the component's element in the page while it is waiting (browser tests wait on it).
WAITING_ATTR = "data-dpcore-waiting-for-chart"

_JS = """
export default function (component) {
  const { setStateValue, parentElement } = component;
  const host = parentElement.host || parentElement;
  host.setAttribute('WAITING', '');
  let done = false;
  const chart = () => document.querySelector('.js-plotly-plot .main-svg');
  const report = () => { host.removeAttribute('WAITING'); setStateValue('drawn', true); };
  const fire = () => {
    if (done) return;
    done = true;
    observer.disconnect();
    clearTimeout(timer);
    // one frame later, so the chart is painted before the held element's work starts
    // (a hidden tab gets no frames: report at once there)
    if (document.hidden) report(); else requestAnimationFrame(() => setTimeout(report, 0));
  };
  const observer = new MutationObserver(() => { if (chart()) fire(); });
  const timer = setTimeout(fire, FALLBACK);
  if (chart()) fire(); else observer.observe(document.body, { childList: true, subtree: true });
  return () => { observer.disconnect(); clearTimeout(timer); };
}
""".replace("WAITING", WAITING_ATTR).replace("FALLBACK", str(FALLBACK_MS))

_component: Callable[..., Any] | None = None


def _watcher() -> Callable[..., Any]:
    """The component, registered once per process (registering it again only logs a warning)."""
    global _component
    if _component is None:
        _component = st.components.v2.component("dpcore_after_first_chart", js=_JS)
    return _component


def has_browser() -> bool:
    """Whether this session is a browser's (it sent HTTP headers); AppTest and bare mode send none."""
    return bool(st.context.headers)


def first_chart_drawn(key: str) -> bool:
    """True when what follows the first chart may be drawn now: a chart was already drawn in this
    session, no browser can report one, or the browser has just reported it. Otherwise mounts the
    watcher (keyed ``key``) and returns False; its report reruns the enclosing fragment."""
    if st.session_state.get(DRAWN) or not has_browser():
        return True
    got = _watcher()(key=key, default={"drawn": False}, on_drawn_change=lambda: None, height=0)
    if getattr(got, "drawn", False):
        st.session_state[DRAWN] = True
        return True
    return False
