"""What the browser tests check on every drawn page: no two labels of a figure overlap, no label
is cut, nothing is wider than the page.

Why from the drawn page: plotly places the labels; only the browser knows where they land. The
boxes are the labels' rendered boxes (``getBoundingClientRect``): two labels whose boxes intersect
by more than ``SLACK_PX`` in both directions are "closer than their size" (issue 24: the Memory
trade's labels piled up, Overview's "↑ 87 ms" over "↑ 102 ms", the ring's chunk labels). Labels
are compared within one figure and one kind: annotations and text markers together, then each
axis's tick labels among themselves. Rotated tick labels are compared by their centres along the
axis (their boxes are slanted), closer than one line height is an overlap.

A cut label is one drawn only in part: plotly clips a text marker at its plot area and the rest
at the figure (the Compression panel showed "e ×2" of "none ×2"); Streamlit ends a label that
does not fit with "…" (a failed run's name in the sidebar). A table or figure past the window's
right edge, or a page that scrolls sideways, is wider than the page; a table's key columns
pushed past its own right edge (it scrolls sideways inside) are out of view.
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
          xticks: Array.from(gd.querySelectorAll('.xtick text')).map(e => e.textContent),
          // the margins asked for and the ones drawn (Plotly's automargin grows them for labels)
          margin: (gd.layout || {}).margin || null,
          size: gd._fullLayout ? gd._fullLayout._size : null}))"""


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


_CUT_JS = """(slack) => {
  const out = [];
  // a text box includes the line's leading above and below the glyphs: a fifth of its height
  // outside the frame cuts nothing
  const inside = (r, box) => {
    const v = Math.max(slack, 0.2 * r.height);
    return r.left >= box.left - slack && r.right <= box.right + slack
           && r.top >= box.top - v && r.bottom <= box.bottom + v;
  };
  const shown = e => (e.textContent || '').trim() && getComputedStyle(e).display !== 'none'
                     && getComputedStyle(e).visibility !== 'hidden' && e.getAttribute('opacity') !== '0';
  document.querySelectorAll('.js-plotly-plot').forEach((plot, k) => {
    const title = (plot.querySelector('.gtitle') || {}).textContent || `figure ${k}`;
    const svg = plot.querySelector('.main-svg');
    if (!svg) return;
    const page = svg.getBoundingClientRect();
    const areas = Array.from(plot.querySelectorAll('.nsewdrag')).map(d => d.getBoundingClientRect());
    // text markers are clipped at their subplot's plot area; every other label at the figure
    plot.querySelectorAll('.textpoint text').forEach(e => {
      if (!shown(e)) return;
      const r = e.getBoundingClientRect();
      if (r.width > 0 && !areas.some(a => inside(r, a))) out.push(`${title}: "${e.textContent.trim()}" is cut`);
    });
    plot.querySelectorAll('g.annotation text, .xtick text, .ytick text, .gtitle, .legendtext, .cbtitle text')
        .forEach(e => {
      if (!shown(e)) return;
      const r = e.getBoundingClientRect();
      if (r.width > 0 && !inside(r, page)) out.push(`${title}: "${e.textContent.trim()}" is cut`);
    });
  });
  // HTML labels Streamlit cuts with an ellipsis: the sidebar's pickers, widget labels, metrics
  document.querySelectorAll('[data-baseweb=select] [value], [data-baseweb=select] div, label p, '
                            + '[data-testid=stMetricValue] div, [data-testid=stMetricLabel] p').forEach(e => {
    if (e.children.length || !(e.textContent || '').trim()) return;
    if (e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflow !== 'visible')
      out.push(`label "${e.textContent.trim()}" is cut (${e.scrollWidth} px in ${e.clientWidth} px)`);
  });
  // a select box's value is an input's text: measured against the input's inner width
  const ctx = document.createElement('canvas').getContext('2d');
  document.querySelectorAll('input[role=combobox]').forEach(e => {
    if (!e.value || !e.getBoundingClientRect().width) return;
    const cs = getComputedStyle(e);
    ctx.font = cs.font;
    const room = e.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    const need = ctx.measureText(e.value).width;
    if (need > room + 1) out.push(`label "${e.value}" is cut (${Math.round(need)} px in ${Math.round(room)} px)`);
  });
  return out;
}"""


def cut_labels(page) -> list[str]:
    """Every label drawn only in part (empty: none): a figure's text marker outside its plot area
    (plotly clips it there: "e ×2" of "none ×2"), a tick, legend or annotation outside the figure,
    or an HTML label Streamlit ends with "…" (a run's name in the sidebar's picker)."""
    return page.evaluate(_CUT_JS, SLACK_PX)


_WIDE_JS = """() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  document.querySelectorAll('[data-testid=stDataFrame], [data-testid=stTable], .js-plotly-plot').forEach((e, k) => {
    const r = e.getBoundingClientRect();
    if (r.width > 0 && r.right > width + 1) out.push(`element ${k} (${e.dataset.testid || 'figure'}) ends at `
                                                     + `${Math.round(r.right)} px of ${width}`);
  });
  const main = document.querySelector('[data-testid=stMain]');
  if (main && main.scrollWidth > main.clientWidth + 1)
    out.push(`the page scrolls sideways: ${main.scrollWidth} px in ${main.clientWidth} px`);
  return out;
}"""


def wider_than_the_page(page) -> list[str]:
    """Tables and figures that reach past the window's right edge, and a page that scrolls
    sideways (empty: none)."""
    return page.evaluate(_WIDE_JS)


_SHOWN_COLUMNS_JS = """() => Array.from(document.querySelectorAll('[data-testid=stDataFrame]'), e =>
  Array.from(e.querySelectorAll('[role=columnheader]'), h => (h.textContent || '').trim()))"""


def columns_out_of_view(page, wanted: list[str], table: int = 0) -> list[str]:
    """The columns of ``wanted`` (header labels) that the ``table``-th dataframe on the page does
    not show without scrolling it sideways (empty: all in view). Why from the grid's accessible
    headers: the table draws on a canvas and lists as column headers only the columns that
    intersect its visible area, so a wide cell that widens a column (a long skip reason) and
    pushes the numbers past the table's right edge removes them from that list, while the
    table's own box stays inside the page (``wider_than_the_page`` cannot see it)."""
    shown = page.evaluate(_SHOWN_COLUMNS_JS)
    have = set(shown[table]) if table < len(shown) else set()
    return [c for c in wanted if c not in have]


def start_server(root, log, port: int, options: tuple[str, ...] = (), repo=None):
    """`streamlit run app.py` on ``root`` (DPCORE_PROFILES) at ``port``, output to ``log``;
    returns the process once /_stcore/health answers (bounded: 60 s), else fails the test.
    ``options``: extra ``section.name=value`` server options (the benchmark's A/B of settings);
    ``repo``: the source tree whose app.py runs (default: this one; the benchmark's A/B of code)."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    import pytest

    repo = Path(repo) if repo is not None else Path(__file__).resolve().parents[3]
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true",
                             "--browser.gatherUsageStats", "false",
                             *(f"--{o}" for o in options)], cwd=repo,
                            env={**os.environ, "DPCORE_PROFILES": str(root)}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180  # a process start: generous on a loaded 2-core machine
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status == 200:
                return proc
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    log.seek(0)
    pytest.fail("streamlit did not start within 180 s:\n" + log.read())


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
