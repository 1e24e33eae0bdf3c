"""Benchmark: the dashboard's first chart after a reload, in a real browser (issue 23's target: ≤ 1 s
on the sample run).

Why a browser: "first chart" is what a user waits for: the page's script run, the websocket
round trip and plotly's drawing. The server runs ``streamlit run app.py`` on a copy of the
committed samples; Chromium opens the Overview page once (the cold open, which fills
``st.cache_data`` and the rank cache) and then reloads it ``--repeat`` times. Each time is from
the reload's start to the first ``.js-plotly-plot .main-svg`` in the page (plotly has drawn
it). Medians (of 5 reloads by default) are printed with every run's number; the cold open is
printed apart.

Where the time goes: "chart element" is when the chart's element is in the page (the server's
script sent it and Streamlit's lazily loaded Plotly component mounted); "first chart" is when
plotly has drawn it. Beside them, the browser's main-thread time for the reload (Chromium's
``Performance.getMetrics``: all tasks, and the JavaScript part of them): when it is close to the
reload's wall time, the browser (parsing Streamlit's and plotly's bundles, drawing), not the
server's script run, is what a reload waits for.

A/B of server settings: ``--b-option server.fileWatcherType=none`` (repeatable) starts a second
server with those options beside the first (same copy of the runs, same browser) and alternates
the reloads A, B, A, B, ...; it prints both medians and B/A of the medians. On a loaded machine
the ratio, not either time, is the number to trust: both sides see the same load.

A/B of code: ``--b-tree DIR`` serves side B's app.py from another source tree (e.g. main, exported
with ``git archive main | tar -x -C DIR``), so a change to a page is measured against the code it
replaces, on the same runs, browser and load; it combines with ``--b-option``.

Which bundles a reload waits for: ``--chunks`` prints, for each side's last reload, when each of
Streamlit's lazily loaded frontend chunks that a page element pulls in (Plotly, the data grid, ...)
was requested, relative to the reload's start, and whether it came before the first chart. A
chunk requested before the chart is parsed and evaluated on the same main thread the chart waits
for.

    python -m benchmarks.bench_dashboard_first_chart [--repeat 5] [--page overview] [--b-option S.N=V]
        [--b-tree DIR] [--chunks]
"""
from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.read.dashboard.browser_checks import start_server  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]


#: What the user sees appear, in order: the page's shell (Streamlit's frontend running), the
#: script's first element (the page's caption: the server ran the script up to there and the
#: websocket delivered it), the first drawn chart.
MILESTONES = {"shell": "[data-testid=stApp]", "first element": "[data-testid=stCaptionContainer]",
              "chart element": "[data-testid=stPlotlyChart]", "first chart": ".js-plotly-plot .main-svg"}
#: Chromium's main-thread metrics (seconds since the document started) printed per reload.
BROWSER_METRICS = {"main thread busy": "TaskDuration", "of it JavaScript": "ScriptDuration"}
#: Streamlit's element chunks worth naming in ``--chunks`` (file name prefixes; the rest is its
#: shell and small helpers).
ELEMENT_CHUNKS = ("PlotlyChart", "DataFrame", "arrowFormatUtils", "Quiver", "Table", "StreamlitMarkdown",
                  "Selectbox", "Checkbox", "Expander", "Tabs")


def _first_chart(page, go, cdp=None, requests: list | None = None) -> dict[str, float]:
    """Seconds from ``go()`` (a navigation or a reload) to each of :data:`MILESTONES`, and, with
    a CDP session, the new document's :data:`BROWSER_METRICS` once the chart is drawn.
    ``requests``: the list the page's request listener appends (seconds, URL) to; emptied here
    so it holds this reload's requests, timed from its start."""
    t = time.perf_counter()
    if requests is not None:
        requests.clear()
        requests.append((t, ""))  # the origin of this reload's request times
    go()
    out = {}
    for name, sel in MILESTONES.items():
        page.locator(sel).first.wait_for(timeout=120_000)
        out[name] = time.perf_counter() - t
    if cdp is not None:
        got = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        out.update({name: float(got.get(metric, float("nan"))) for name, metric in BROWSER_METRICS.items()})
    return out


def _print(label: str, times: list[dict[str, float]]) -> None:
    """Median and every reload's value of each milestone and browser metric."""
    for name in [*MILESTONES, *BROWSER_METRICS]:
        got = [t[name] for t in times]
        print(f"{label}after a reload, {name}: median {statistics.median(got):.2f} s over {len(got)} "
              f"({', '.join(f'{t:.2f}' for t in got)})")


def _print_chunks(label: str, requests: list, chart_at: float) -> None:
    """The element chunks of one reload, by request time, marked before/after the first chart."""
    t0 = requests[0][0]
    got = [(t - t0, url.rsplit("/", 1)[-1]) for t, url in requests[1:]]
    named = [(t, name) for t, name in got if name.startswith(ELEMENT_CHUNKS) and name.endswith(".js")]
    print(f"{label}chunks of the last reload (first chart at {chart_at:.2f} s): " + (", ".join(
        f"{name.split('.')[0]} {t:.2f} s{' (before the chart)' if t < chart_at else ''}"
        for t, name in named) or "none named"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="reloads to time (default 5; per side in an A/B)")
    ap.add_argument("--page", default="", help="URL path of the page (default: the first page, Overview)")
    ap.add_argument("--samples", default=str(ROOT / "profiles"), help="folder of runs to serve")
    ap.add_argument("--b-option", action="append", default=[], metavar="SECTION.NAME=VALUE",
                    help="A/B: a second server with this streamlit option (repeatable); reloads alternate")
    ap.add_argument("--b-tree", default="", metavar="DIR",
                    help="A/B: a second server running app.py of this source tree (e.g. an export of main)")
    ap.add_argument("--chunks", action="store_true",
                    help="print when each element chunk (Plotly, the data grid, ...) was requested")
    a = ap.parse_args()
    if a.b_tree and not (Path(a.b_tree) / "app.py").is_file():
        print(f"--b-tree {a.b_tree!r}: no app.py there; expected a dpcore source tree, e.g. "
              f"git archive main | tar -x -C DIR", file=sys.stderr)
        sys.exit(2)
    bad = [o for o in a.b_option if "=" not in o or "." not in o.split("=", 1)[0]]
    if bad:
        print(f"--b-option {bad[0]!r}: expected SECTION.NAME=VALUE, e.g. server.fileWatcherType=none",
              file=sys.stderr)
        sys.exit(2)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("this benchmark needs playwright: pip install playwright (and Chromium at /usr/bin/chromium)")
    if not Path(CHROMIUM).exists():
        sys.exit(f"this benchmark needs Chromium at {CHROMIUM}: apt-get install -y chromium")
    tmp = Path(tempfile.mkdtemp(prefix="dpcore_bench_dash_"))
    for run in Path(a.samples).iterdir():
        if (run / "run.json").exists():
            shutil.copytree(run, tmp / run.name, ignore=shutil.ignore_patterns("cache"))
    ab = bool(a.b_option or a.b_tree)
    sides = {"": ((), None)} if not ab else {"A ": ((), None), "B ": (tuple(a.b_option), a.b_tree or None)}
    logs, procs, ports = [], [], []
    try:
        for i, (options, tree) in enumerate(sides.values()):
            logs.append(open(tmp / f"streamlit{i}.log", "w+"))
            ports.append(_free_port())
            procs.append(start_server(tmp, logs[-1], ports[-1], options, tree))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            pages, cdps, colds, requests = [], [], [], []
            for port in ports:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                requests.append([])
                if a.chunks:
                    page.on("request", lambda r, got=requests[-1]: got.append((time.perf_counter(), r.url)))
                cdp = page.context.new_cdp_session(page)
                cdp.send("Performance.enable")
                url = f"http://127.0.0.1:{port}/{a.page}"
                colds.append(_first_chart(page, lambda page=page, url=url: page.goto(url, wait_until="commit")))
                page.wait_for_timeout(1500)  # let the rest of the page finish before the first reload
                pages.append(page)
                cdps.append(cdp)
            times: list[list[dict[str, float]]] = [[] for _ in pages]
            for _ in range(max(1, a.repeat)):
                for i, (page, cdp) in enumerate(zip(pages, cdps)):
                    page.bring_to_front()
                    times[i].append(_first_chart(page, lambda page=page: page.reload(wait_until="commit"), cdp,
                                                 requests[i] if a.chunks else None))
                    page.wait_for_timeout(1500)
            browser.close()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        for log in logs:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    for label, cold, got, reqs in zip(sides, colds, times, requests):
        print(f"{label}cold open (empty caches): first chart {cold['first chart']:.2f} s")
        _print(label, got)
        if a.chunks:
            _print_chunks(label, reqs, got[-1]["first chart"])
    if len(times) == 2:
        med = [statistics.median(t["first chart"] for t in got) for got in times]
        b = " ".join([*a.b_option, *([f"tree {a.b_tree}"] if a.b_tree else [])])
        pairs = [tb["first chart"] / ta["first chart"] for ta, tb in zip(*times)]
        print(f"B ({b}) / A, first chart medians: {med[1] / med[0]:.3f}; median of the per-pair ratios "
              f"{statistics.median(pairs):.3f} ({', '.join(f'{r:.2f}' for r in pairs)})")


if __name__ == "__main__":
    main()
