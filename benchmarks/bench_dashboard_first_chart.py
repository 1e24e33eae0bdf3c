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
the reloads in pairs, A B, B A, A B, ... (whatever the first or second reload of a pair pays, e.g.
the other page's leftover work, falls on both sides alike); it prints both medians and B/A of the
medians. On a loaded machine the ratio, not either time, is the number to trust: both sides see
the same load.

A/B of code: ``--b-tree DIR`` serves side B's app.py from another source tree (e.g. main, exported
with ``git archive main | tar -x -C DIR``), so a change to a page is measured against the code it
replaces, on the same runs, browser and load; it combines with ``--b-option``.

Which bundles a reload waits for: ``--chunks`` prints, for each side's last reload, when each of
Streamlit's lazily loaded frontend chunks that a page element pulls in (Plotly, the data grid, ...)
was requested, relative to the reload's start, and whether it came before the first chart. A
chunk requested before the chart is parsed and evaluated on the same main thread the chart waits
for.

Where the main thread's time goes: ``--profile-main-thread`` records a Chromium trace of every
reload (its timeline events and V8's sampling profiler) and prints, per side, the medians over the
reloads of the renderer main thread's CPU time from the new document's commit to the first chart
(the task that draws it included), split by what the browser did: compiling and running
JavaScript (the running split by the script whose code was on top of the stack, from the
profiler's samples: Streamlit's main bundle, the Plotly chunk, the data grid's, ...), style
recalculation and layout (with the elements and layout objects they touched, and how much of it
JavaScript forced by reading sizes), paint and compositing, HTML parsing, garbage collection, the
rest (task overhead, messages, loading); and the web fonts the page asked for before the chart.
Times are the thread's own clock (a loaded machine stretches the wall clock, much less this).
The profiler slows the page (its start alone takes ~0.3 s, before the commit and not counted), so
the milestones of a profiled run are not comparable with an unprofiled one; compare the table's
sides with each other.

    python -m benchmarks.bench_dashboard_first_chart [--repeat 5] [--page overview] [--b-option S.N=V]
        [--b-tree DIR] [--chunks] [--profile-main-thread]
"""
from __future__ import annotations

import argparse
import json
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


#: Put in every page before its scripts: marks the moment the first chart's svg is in the page
#: (``console.timeStamp``, a ``TimeStamp`` event in Chromium's trace), the end of what
#: ``--profile-main-thread`` counts.
CHART_MARK_NAME = "dpcore-first-chart"
CHART_MARK = """new MutationObserver((_, obs) => {
  if (document.querySelector('.js-plotly-plot .main-svg')) {
    console.timeStamp('MARK');
    obs.disconnect();
  }
}).observe(document, {childList: true, subtree: true});""".replace("MARK", CHART_MARK_NAME)
#: The trace categories of ``--profile-main-thread``: the main thread's tasks with their thread
#: time, V8's compile and run events, and the sampling profiler (which script's code ran).
PROFILE_CATEGORIES = ["devtools.timeline", "disabled-by-default-devtools.timeline", "v8.execute",
                      "disabled-by-default-v8.cpu_profiler"]
#: What the browser does in a main-thread trace event, by its name (a name not listed is counted
#: as its enclosing event's kind; at the top, as "other"). Names are Chromium's DevTools timeline's.
KINDS = {
    "compile JS": ("v8.compile", "v8.compileModule", "v8.produceCache", "v8.produceModuleCache", "V8.CompileCode",
                   "v8.parseOnBackground", "v8.deserializeOnBackground"),
    "run JS": ("EvaluateScript", "v8.evaluateModule", "FunctionCall", "v8.callFunction", "TimerFire",
               "FireAnimationFrame", "FireIdleCallback", "EventDispatch", "RunMicrotasks", "v8.run",
               "XHRReadyStateChange", "XHRLoad", "HandlePostMessage"),
    "style": ("UpdateLayoutTree", "RecalculateStyles", "ParseAuthorStyleSheet", "ScheduleStyleRecalculation"),
    "layout": ("Layout", "UpdateLayout", "HitTest"),
    "paint, composite": ("PrePaint", "Paint", "PaintImage", "Layerize", "UpdateLayer", "UpdateLayerTree", "Commit",
                         "CompositeLayers", "Decode Image", "Draw LazyPixelRef", "ImageDecodeTask", "RasterTask"),
    "parse HTML": ("ParseHTML",),
    "garbage collection": ("MinorGC", "MajorGC", "BlinkGC.AtomicPhase", "CppGC.AtomicPause"),
}
_KIND_OF = {name: kind for kind, names in KINDS.items() for name in names}
OTHER = "other (task overhead, messages, loading)"
#: Rows of the profile table that are not CPU times (printed as counts).
COUNT_ROWS = ("style: elements recalculated", "layout: most layout objects", "web fonts asked for")


def _kind(name: str) -> str | None:
    if name in _KIND_OF:
        return _KIND_OF[name]
    if name.startswith(("V8.GC_", "BlinkGC.", "CppGC.")):
        return "garbage collection"
    return None


def _script_name(url: str) -> str:
    """A script's file name without its content hash and extension ("PlotlyChart"), or a
    profiler's own node name ("(program)": native code, "(garbage collector)")."""
    if not url:
        return "(no script)"
    name = url.split("?", 1)[0].rsplit("/", 1)[-1]
    return name.split(".", 1)[0] or url


def _sampled_scripts(events: list[dict], pid: int, tid: int, start: float, end: float) -> dict[str, float]:
    """Microseconds of V8's profiler samples of thread ``(pid, tid)`` between ``start`` and ``end``,
    per script of the sampled stack's top frame (``(program)`` etc. for the profiler's own nodes)."""
    profiles = {e.get("id") for e in events if e.get("name") == "Profile" and e.get("pid") == pid
                and e.get("tid") == tid}
    starts = {e.get("id"): e["args"]["data"]["startTime"] for e in events if e.get("name") == "Profile"
              and e.get("id") in profiles}
    out: dict[str, float] = {}
    for profile in profiles:
        where: dict[int, str] = {}
        t = starts[profile]
        for e in events:
            if e.get("name") != "ProfileChunk" or e.get("pid") != pid or e.get("id") != profile:
                continue
            data = e["args"]["data"]
            for node in (data.get("cpuProfile") or {}).get("nodes") or []:
                frame = node.get("callFrame") or {}
                fn = frame.get("functionName", "")
                where[node["id"]] = _script_name(frame.get("url", "")) if frame.get("url") else (
                    fn if fn.startswith("(") else "(no script)")
            samples = (data.get("cpuProfile") or {}).get("samples") or []
            for node, delta in zip(samples, data.get("timeDeltas") or []):
                t += delta
                if start <= t <= end:
                    name = where.get(node, "(no script)")
                    out[name] = out.get(name, 0.0) + delta
    return out


def main_thread_profile(trace: Path | list[dict]) -> dict[str, float]:
    """Where the renderer main thread's time went between the new document's commit and the first
    chart (:data:`CHART_MARK`) in a Chromium trace recorded with :data:`PROFILE_CATEGORIES`.

    Returns ordered rows: "main thread CPU" (ms of the thread's own time in the tasks that began in
    that window, the one that drew the chart included), each kind of :data:`KINDS` and
    :data:`OTHER` (self time: an event's time less its children's, so the rows add up to the total),
    "run JS" split into "JS in <script>" by the profiler's samples, the style and layout forced by
    JavaScript, and :data:`COUNT_ROWS`. Empty when the trace has no chart mark or no commit."""
    got = json.loads(trace.read_text()) if isinstance(trace, Path) else trace
    events = got["traceEvents"] if isinstance(got, dict) else got
    marks = [e for e in events if e.get("name") == "TimeStamp"
             and ((e.get("args") or {}).get("data") or {}).get("message") == CHART_MARK_NAME]
    if not marks:
        return {}
    mark = min(marks, key=lambda e: e["ts"])
    pid, tid, end = mark["pid"], mark["tid"], mark["ts"]
    mine = sorted((e for e in events if e.get("pid") == pid and e.get("tid") == tid and e.get("ph") == "X"),
                  key=lambda e: (e["ts"], -e.get("dur", 0)))
    commits = [e["ts"] for e in mine if e["name"] == "CommitLoad" and e["ts"] < end]
    if not commits:
        return {}
    start = max(commits)
    rows: dict[str, float] = {"main thread CPU": 0.0, **{k: 0.0 for k in KINDS}, OTHER: 0.0}
    forced = elements = objects = 0.0
    stack: list[list] = []  # [end, kind, event, children's thread time]

    def close(item: list) -> None:
        _, kind, ev, children = item
        own = ev.get("tdur", ev.get("dur", 0)) - children
        rows[kind or OTHER] += max(own, 0) / 1e3
        if stack:
            stack[-1][3] += ev.get("tdur", ev.get("dur", 0))

    top_end = start
    for e in mine:
        while stack and stack[-1][0] <= e["ts"]:
            close(stack.pop())
        if not stack:  # a task of its own: counted when it begins in the window
            if e["ts"] < start or e["ts"] >= end:
                continue
            rows["main thread CPU"] += e.get("tdur", e.get("dur", 0)) / 1e3
            top_end = max(top_end, e["ts"] + e.get("dur", 0))
        kind = _kind(e["name"]) or (stack[-1][1] if stack else None)
        if e["name"] in KINDS["style"] + KINDS["layout"] and any(s[1] == "run JS" for s in stack):
            forced += e.get("tdur", e.get("dur", 0)) / 1e3
        args = e.get("args") or {}
        if e["name"] == "UpdateLayoutTree":
            elements += float(args.get("elementCount") or 0)
        if e["name"] == "Layout":
            objects = max(objects, float((args.get("beginData") or {}).get("totalObjects") or 0))
        stack.append([e["ts"] + e.get("dur", 0), kind, e, 0.0])
    while stack:
        close(stack.pop())
    sampled = _sampled_scripts(events, pid, tid, start, top_end)
    js = {k: v for k, v in sampled.items() if not k.startswith("(")}
    total_js = sum(js.values())
    out = dict(rows)
    for name, us in sorted(js.items(), key=lambda kv: -kv[1]):
        out[f"  JS in {name}"] = rows["run JS"] * us / total_js if total_js else float("nan")
    out["style + layout forced by JS"] = forced
    fonts = {e["args"]["data"]["url"] for e in events if e.get("name") == "ResourceSendRequest"
             and start <= e["ts"] <= end and str(((e.get("args") or {}).get("data") or {}).get("url", ""))
             .split("?")[0].endswith((".woff", ".woff2", ".ttf", ".otf"))}
    out.update(zip(COUNT_ROWS, (elements, objects, float(len(fonts)))))
    return out


def _print_profile(labels: list[str], profiles: list[list[dict[str, float]]], top: int = 8) -> None:
    """One table: each row's median over the reloads, a column per side (and B - A in an A/B).
    Only the ``top`` scripts with the most JS time on any side are named; the rest are summed."""
    med = []
    for got in profiles:
        names = {n for p in got for n in p}
        med.append({n: statistics.median(p.get(n, 0.0) for p in got) for n in names})
    scripts = sorted({n for m in med for n in m if n.startswith("  JS in ")}, key=lambda n: -max(m.get(n, 0)
                                                                                                  for m in med))
    order = ["main thread CPU", *KINDS]
    rows = [r for r in order if r != "run JS"] + ["run JS", *scripts[:top]]
    for m in med:
        m["  JS in other scripts"] = sum(m.get(n, 0.0) for n in scripts[top:])
    rows += ["  JS in other scripts", OTHER, "style + layout forced by JS", *COUNT_ROWS]
    head = "".join(f"{(label.strip() or 'ms'):>9}" for label in labels) + ("    B - A" if len(med) == 2 else "")
    print(f"main thread, commit to first chart (CPU ms, medians of {len(profiles[0])} traced reloads){head}")
    for r in rows:
        vals = [m.get(r, 0.0) for m in med]
        fmt = "{:9.0f}" if r in COUNT_ROWS else "{:9.1f}"
        diff = (fmt.format(vals[1] - vals[0]).replace(" -", "-") if len(vals) == 2 else "")
        print(f"  {r:<{max(len(x) for x in rows)}}" + "".join(fmt.format(v) for v in vals) + diff)


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
    ap.add_argument("--profile-main-thread", action="store_true",
                    help="trace every reload: where the browser's main thread spent its CPU up to the chart")
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
                page.add_init_script(CHART_MARK)
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
            profiles: list[list[dict[str, float]]] = [[] for _ in pages]
            for rep in range(max(1, a.repeat)):
                # A, B then B, A: whatever the first reload of a pair pays (the other page's
                # leftover work, the server's) falls on each side equally often
                for i in (range(len(pages)) if rep % 2 == 0 else reversed(range(len(pages)))):
                    page, cdp = pages[i], cdps[i]
                    page.bring_to_front()
                    if a.profile_main_thread:
                        browser.start_tracing(page=page, path=str(tmp / "trace.json"), categories=PROFILE_CATEGORIES)
                    times[i].append(_first_chart(page, lambda page=page: page.reload(wait_until="commit"), cdp,
                                                 requests[i] if a.chunks else None))
                    if a.profile_main_thread:
                        browser.stop_tracing()
                        got = main_thread_profile(tmp / "trace.json")
                        if got:
                            profiles[i].append(got)
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
    if a.profile_main_thread:
        if all(profiles):
            _print_profile(list(sides), profiles)
        else:
            print("no reload's trace had the chart's mark and the document's commit: no main-thread profile")
    if len(times) == 2:
        med = [statistics.median(t["first chart"] for t in got) for got in times]
        b = " ".join([*a.b_option, *([f"tree {a.b_tree}"] if a.b_tree else [])])
        pairs = [tb["first chart"] / ta["first chart"] for ta, tb in zip(*times)]
        print(f"B ({b}) / A, first chart medians: {med[1] / med[0]:.3f}; median of the per-pair ratios "
              f"{statistics.median(pairs):.3f} ({', '.join(f'{r:.2f}' for r in pairs)})")


if __name__ == "__main__":
    main()
