"""What a newcomer sees (issue 24), in Chromium, on the committed sample runs a fresh clone has.

Why a second browser pass: the synthetic run of test_browser.py draws every page, but the
issue's items are about what the real samples show: a removed Streamlit API under "Open in
Perfetto", MB beside MiB, labels printed over each other (from the drawn figures: no two label
boxes intersect), an mlp named by a size that does not apply, noisy flags that disagree between
pages, ring steps counted from 0 and 1, 6 messages where the ring sends 4, a training run paired
with a benchmark, "NaN"/"None" on screen, Timeline and Traces opening on different jobs and a
straggler named from launch jitter. Each check below fails on the behaviour the issue reported.
The samples are copied to a temporary folder (the dashboard never writes into the checkout).
Skipped only when /usr/bin/chromium or the samples are absent. Every wait is bounded.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dpcore.contract.units import mib_size
from dpcore.read.analysis.stragglers import (
    MIN_WAIT_MS,
    collective_waits,
    straggler_summary,
    straggler_verdict,
)
from dpcore.read.rundir import load_run
from tests.conftest import samples_in_checkout
from tests.read.dashboard.browser_checks import (
    columns_out_of_view,
    cut_labels,
    figure,
    figures,
    overlapping_labels,
    serving,
    wider_than_the_page,
)

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not found"),
    pytest.mark.skipif(not samples_in_checkout("sample-train"), reason="sample runs not present"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, samples: Path):
    yield from serving(samples, tmp_path_factory.mktemp("log"))


#: How long a page may take to settle (ms). The first visit to a run reads its traces (cold cache);
#: a page opened meanwhile waits behind that read. With two busy loops beside the suite on a 2-core
#: machine the Overview's cold read took 50-62 s (load 10-12), and at load 15-20 the Runs page opened
#: after it missed a 90 s bound; the checks are of what the page shows, not of how fast.
SETTLE_MS = 300_000

#: The page has settled: the script is not running, no element waits for its bundle and every
#: chart in the page as it is now is drawn.
_SETTLED = """() => !!document.querySelector('[data-testid=stApp][data-test-script-state=notRunning]')
  && !document.querySelector('[data-testid=stSkeleton]')
  && Array.from(document.querySelectorAll('.js-plotly-plot')).every(p => {
       const svg = p.querySelector('.main-svg');
       return svg && svg.getBoundingClientRect().width > 0; })"""


def _idle(page) -> None:
    """The script has finished and every figure is drawn. The checks are of the page as it is (a
    cold first visit first shows steps.csv's table, which the page then replaces), and they must
    hold twice, 300 ms apart."""
    page.wait_for_timeout(500)
    for _ in range(2):
        page.wait_for_function(_SETTLED, timeout=SETTLE_MS)
        page.wait_for_timeout(300)
    page.wait_for_timeout(500)  # plotly's layout pass


def _open(page, url: str, path: str, heading: str) -> str:
    page.goto(f"{url}/{path}", wait_until="domcontentloaded")
    page.locator("h1").filter(has_text=heading).first.wait_for(timeout=SETTLE_MS)
    _idle(page)
    assert page.locator("[data-testid=stException]").count() == 0, f"exception on {heading}"
    assert overlapping_labels(page) == [], heading
    assert cut_labels(page) == [], heading
    assert wider_than_the_page(page) == [], heading
    return page.locator("[data-testid=stMain]").inner_text()


def _nav(page, title: str) -> str:
    """Open a page from the sidebar's navigation (the session, and so the picked run, stays)."""
    page.locator("[data-testid=stSidebarNav] a").filter(has_text=title).first.click()
    page.locator("h1").filter(has_text=title).first.wait_for(timeout=SETTLE_MS)
    _idle(page)
    assert page.locator("[data-testid=stException]").count() == 0, f"exception on {title}"
    assert overlapping_labels(page) == [] and cut_labels(page) == [] and wider_than_the_page(page) == [], title
    return page.locator("[data-testid=stMain]").inner_text()


def _job_picked(page) -> str:
    """The value the page's Job picker opened on (Streamlit's select box is a combobox input)."""
    return page.get_by_role("combobox", name="Job").first.input_value()


def test_what_a_newcomer_sees_on_the_samples(server, samples: Path) -> None:
    from playwright.sync_api import sync_playwright

    url, log = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.set_default_timeout(60_000)

            # 3. Overview: every bar above the cap has its "↑" label (from the figure's data)
            text = _open(page, url, "", "Overview")
            # at 1400 px the numbers a newcomer reads first are in view, beside the status (a long
            # skip reason is cut in its cell); the detector does see columns past the edge
            key = ["variant", "status", "step T (ms)", "comm fraction E/T", "overlap %", "exposed E (ms)"]
            assert columns_out_of_view(page, key) == []
            assert columns_out_of_view(page, ["other (ms)"]) == ["other (ms)"]  # the 20th column
            ov = figure(page, "Where a training step")
            bars = [t for t in ov["data"] if t["type"] == "bar"]
            stack = [sum(float(t["y"][i] or 0) for t in bars) for i in range(len(bars[0]["x"]))]
            cut = {x for x, h in zip(bars[0]["x"], stack) if ov["yrange"] and h > ov["yrange"][1]}
            arrows = {a["x"] for a in ov["annotations"] if a["text"].startswith("↑")}
            assert cut <= arrows, f"cut bars without a ↑ label: {sorted(cut - arrows)}"
            # the 52 upright labels had their room before Plotly measured them (laid out once, no
            # margin pushed past the estimate) and the plot keeps its height (it was 136 px, its
            # y-axis title cut)
            assert ov["size"]["b"] <= ov["margin"]["b"] and ov["size"]["l"] <= ov["margin"]["l"], ov["size"]
            assert ov["size"]["h"] >= 250, ov["size"]
            spread = next(t for t in ov["data"] if (t["name"] or "").startswith("spread"))
            # Scaling draws the swept variants at the run's own bucket size (Overview: "bucketed ×2 · 25 MiB")
            config = json.loads((samples / "sample-train" / "run.json").read_text())["config"]
            own = " · " + mib_size(config["bucket_mb"])
            noisy_overview = {x.removesuffix(own) for x, s in zip(spread["x"], spread["symbol"] or [])
                              if s == "x" and ("·" not in x or x.endswith(own))}
            assert not re.search(r"\bNaN\b|\bNone\b", text)

            # 5. Runs: the mlp is named by its width, and the caption names the run picked
            text = _open(page, url, "runs", "Runs")
            assert "mlp width 256" in text and "mlp tiny" not in text
            assert "newest complete run with training jobs" in text

            # 6. Scaling: noisy means what Overview's marker means
            text = _open(page, url, "scaling", "Scaling")
            listed = re.search(r"Noisy measurements: ([^:]*):", text)
            noisy_scaling = {c.strip() for c in listed.group(1).split(",")} if listed else set()
            assert noisy_scaling == noisy_overview, (noisy_scaling, noisy_overview)

            # 11. the straggler verdict is the analysis' sentence on the job's data, and names a rank
            # only where the others really waited (MIN_WAIT_MS), never for launch jitter; the samples
            # injected no delay, but a loaded machine can make one rank late for real
            text = _open(page, url, "stragglers", "Stragglers")
            job = _job_picked(page)
            rows = straggler_summary(collective_waits(load_run(samples / "sample-train").collectives))
            rows = rows[rows["job_id"] == job]
            verdict = straggler_verdict(rows)
            assert f"{job}: {verdict}." in text, (verdict, text[:400])
            named = re.search(r"others waited ([\d.]+) ms on average$", verdict)
            assert named is None or float(named.group(1)) >= MIN_WAIT_MS

            # 4. Memory: the breakdown is one row per job (names cannot overlap); labels checked in _open
            _open(page, url, "memory", "Memory")
            held = figure(page, "What each rank holds")
            assert held["data"][0]["orientation"] == "h"

            # 7. Ring messages: ring steps from 1 in every chart, 2N(N−1) = 4 messages per ring call
            text = _open(page, url, "ring-messages", "Ring messages")
            ticks = [t for f in figures(page) for t in f["xticks"]]
            assert "RS 1" in ticks and "RS 0" not in ticks
            counts = next(f for f in figures(page) if any(t["name"] == "messages" for t in f["data"]))
            per_call = dict(zip(counts["data"][0]["x"], counts["data"][0]["y"]))
            assert per_call["ring-ws2"] == 4, per_call

            # 2 and 10. What-if: MiB, µs, "1 rank", no nested parentheses in the fitted-from list
            text = _open(page, url, "what-if", "What-if")
            assert not re.search(r"\d MB\b|\d us\b|\b1 ranks\b|network run", text)
            assert "MiB" in text and "µs" in text

            # 11. Timeline and Traces open on the same job; 1. Open in Perfetto is drawn (components v2)
            _open(page, url, "timeline", "Timeline")
            timeline_job = _job_picked(page)
            _open(page, url, "traces", "Traces")
            assert _job_picked(page) == timeline_job == "torch_ddp-ws2-b25"
            page.get_by_role("button", name="Open in Perfetto ↗").wait_for(timeout=30_000)

            # 10. Bandwidth on a training run: said once, in words (no raw backticks, no empty chart)
            text = _open(page, url, "bandwidth", "Bandwidth")
            assert text.count("no all-reduce benchmark") == 1 and "`" not in text
            page.get_by_role("button", name="Open sample-allreduce").click()
            _idle(page)
            ticks = figures(page)[0]["xticks"]
            assert "16 MiB" in ticks and not [t for t in ticks if re.fullmatch(r"[\d.]+[kMG]", t)], ticks
            assert overlapping_labels(page) == []

            # 9. Compare: the training sample is paired with the other training run (the hang), never
            # with the benchmark
            _open(page, url, "", "Overview")
            page.locator("[data-testid=stSidebar]").get_by_text("Compare with a second run").click()
            _idle(page)
            side = page.locator("[data-testid=stSidebar]").inner_text()
            second = page.get_by_role("combobox", name="Second run").first.input_value()
            assert "Second run" in side and "sample-hang" in second, second
            assert cut_labels(page) == []

            # issue 34: every page has something on the samples; nothing cut or wider than the page
            text = _open(page, url, "live", "Live")
            assert "No live rows" not in text and "step(s) seen" in text
            text = _open(page, url, "buckets", "Buckets")
            assert "Compression (DDP comm hooks)" in text and "MiB" in text
            comp = figure(page, "compression")
            assert [t for f in comp["data"] for t in (f["text"] or []) if t] == ["no hook"]
            page.locator("[data-testid=stSidebar] [data-testid=stSelectbox]").first.click()
            page.keyboard.type("sample-hang")
            page.keyboard.press("Enter")
            _idle(page)
            assert cut_labels(page) == []  # the failed run's name in the sidebar's picker
            text = _nav(page, "Hang")
            assert "never entered collective seq" in text and "KiB =" in text
            text = _nav(page, "Live")
            assert "hung" in text and "Open Hang" in text
        finally:
            browser.close()
    log.seek(0)
    server_log = log.read()
    # 1. nothing past its removal date runs under any button
    assert "will be removed" not in server_log and "components.v1" not in server_log, server_log[-3000:]
    assert "already registered" not in server_log, server_log[-3000:]  # the component registered once
