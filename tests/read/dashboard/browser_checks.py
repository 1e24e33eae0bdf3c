"""What the browser tests check on every drawn page: no two labels of a figure overlap.

Why from the drawn page: plotly places the labels; only the browser knows where they land. The
boxes are the labels' rendered boxes (``getBoundingClientRect``): two labels whose boxes intersect
by more than ``SLACK_PX`` in both directions are "closer than their size" (issue 24: the Memory
trade's labels piled up, Overview's "↑ 87 ms" over "↑ 102 ms", the ring's chunk labels). Labels
are compared within one figure and one kind: annotations and text markers together, then each
axis's tick labels among themselves. Rotated tick labels are compared by their centres along the
axis (their boxes are slanted), closer than one line height is an overlap.
"""
from __future__ import annotations

#: Pixels two label boxes may share (anti-aliasing, glyph padding) before they count as overlapping.
SLACK_PX = 2.0

_JS = """(slack) => {
  const out = [];
  const boxes = (root, sel) => Array.from(root.querySelectorAll(sel))
      .filter(e => (e.textContent || '').trim() && getComputedStyle(e).display !== 'none'
                   && getComputedStyle(e).visibility !== 'hidden' && e.getAttribute('opacity') !== '0')
      .map(e => ({t: e.textContent.trim(), r: e.getBoundingClientRect(), rot: (e.getAttribute('transform') || '')
                  .includes('rotate') || (e.parentElement && (e.parentElement.getAttribute('transform') || '')
                  .includes('rotate'))}))
      .filter(b => b.r.width > 0 && b.r.height > 0);
  const hit = (a, b) => Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left) > slack
                     && Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top) > slack;
  document.querySelectorAll('.js-plotly-plot').forEach((plot, k) => {
    const title = (plot.querySelector('.gtitle') || {}).textContent || `figure ${k}`;
    const groups = [boxes(plot, 'g.annotation text, .textpoint text')];
    plot.querySelectorAll('g.xaxislayer-above, g.yaxislayer-above').forEach(ax => {
      groups.push(boxes(ax, '.xtick text, .ytick text'));
    });
    for (const g of groups) {
      for (let i = 0; i < g.length; i++) for (let j = i + 1; j < g.length; j++) {
        const a = g[i], b = g[j];
        let bad;
        if (a.rot && b.rot) {  // slanted tick labels: their centres along the axis, a line apart
          const ca = (a.r.left + a.r.right) / 2, cb = (b.r.left + b.r.right) / 2;
          bad = Math.abs(ca - cb) < 11 && hit(a, b);
        } else {
          bad = hit(a, b);
        }
        if (bad) out.push(`${title}: "${a.t}" overlaps "${b.t}"`);
      }
    }
  });
  return out;
}"""


def overlapping_labels(page) -> list[str]:
    """Every pair of overlapping labels in the figures drawn on ``page`` (empty: none)."""
    return page.evaluate(_JS, SLACK_PX)


_FIGURES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
          title: (((gd.layout || {}).title || {}).text || '').replace(/<[^>]+>/g, ''),
          data: (gd._fullData || gd.data).map(t => ({name: t.name, type: t.type, x: Array.from(t.x || []),
                                   y: Array.from(t.y || []),
                                   text: t.text === undefined ? null : [].concat(t.text),
                                   symbol: t.marker && Array.isArray(t.marker.symbol) ? t.marker.symbol : null,
                                   orientation: t.orientation || null})),
          annotations: ((gd.layout || {}).annotations || []).map(a => ({text: a.text, x: a.x, y: a.y})),
          yrange: ((gd.layout || {}).yaxis || {}).range || null,
          xticks: Array.from(gd.querySelectorAll('.xtick text')).map(e => e.textContent)}))"""


def figures(page) -> list[dict]:
    """Every drawn figure: its title, traces' data, annotations, y range and x tick labels as the
    browser holds them (plotly keeps its decoded traces, ``_fullData``, on its div)."""
    return page.evaluate(_FIGURES_JS)


def figure(page, title: str) -> dict:
    """The drawn figure whose title starts with ``title`` (AssertionError naming the titles there are)."""
    found = figures(page)
    for f in found:
        if f["title"].startswith(title):
            return f
    raise AssertionError(f"no figure titled {title!r}; titles: {[f['title'] for f in found]}")


def start_server(root, log, port: int):
    """`streamlit run app.py` on ``root`` (DPCORE_PROFILES) at ``port``, output to ``log``;
    returns the process once /_stcore/health answers (bounded: 60 s), else fails the test."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    import pytest

    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"], cwd=repo,
                            env={**os.environ, "DPCORE_PROFILES": str(root)}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status == 200:
                return proc
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    log.seek(0)
    pytest.fail("streamlit did not start within 60 s:\n" + log.read())


def serving(root, log_dir):
    """A generator for a module fixture: `streamlit run app.py` on ``root`` at a free port, its
    output in ``log_dir``/streamlit.log; yields (url, log) and stops the server afterwards."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(log_dir / "streamlit.log", "w+")
    proc = start_server(root, log, port)
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - a server that will not stop is killed
            proc.kill()
        log.close()
