"""One real-browser pass: `streamlit run app.py` on a free port, driven by Playwright + system Chromium.

Why: AppTest never runs plotly.js; only a browser shows that the figures are actually drawn, that
no exception box appears, that the sidebar navigation reaches every page at its URL path, and how
long the first render and page switches take. Screenshots go to a tmp folder (the README's
screenshots come from the sample runs: scripts/screenshots.py), and no two labels of a drawn
figure overlap (`browser_checks`; the issue-24 items on the samples: test_browser_samples.py).
Skipped only when /usr/bin/chromium is absent. Every wait is bounded.
"""
from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dpcore.read.dashboard.pages import PAGES
from tests.fixtures_run import make_run
from tests.read.dashboard.browser_checks import overlapping_labels, start_server
from tests.read.dashboard.test_live_hang_pages import add_live_and_hang

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[3]
#: Pages that draw no chart; every other page must show a drawn plotly figure. GPU: this run was
#: traced on CPUs (test_browser_gpu.py draws the GPU page on GPU runs).
NO_CHART = {"Runs", "Traces", "New run", "Import", "GPU"}
CHART_PAGES = [p.title for p in PAGES if p.title not in NO_CHART]

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"{CHROMIUM} not found: install Debian's chromium to run the browser test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("profiles")
    add_live_and_hang(make_run(root, "20250101-120000-mlp", big_trace_events=250_000))
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "streamlit.log", "w+")
    proc = start_server(root, log, port)
    url = f"http://127.0.0.1:{port}"
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _nav(page, title: str):
    """The sidebar navigation's link to a page."""
    return page.locator("[data-testid=stSidebarNav]").get_by_role("link", name=title, exact=True)


def test_every_page_draws_in_chromium(server: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    # a fixed folder outside pytest's basetemp rotation, overwritten on every run ($DPCORE_SCREENSHOTS overrides)
    shots = Path(os.environ.get("DPCORE_SCREENSHOTS") or Path(tempfile.gettempdir()) / "dpcore-dashboard-screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(30_000)
            t0 = time.perf_counter()
            page.goto(server, wait_until="domcontentloaded")
            # a bound, not a speed claim: a cold first visit reads the traces first (minutes on a loaded box)
            expect(page.locator(".js-plotly-plot .main-svg").first).to_be_visible(timeout=180_000)
            page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for(timeout=20_000)
            timings["first render (Overview)"] = time.perf_counter() - t0
            for spec in PAGES:
                title = spec.title
                t0 = time.perf_counter()
                _nav(page, title).click()
                expect(page.locator("h1").filter(has_text=title).first).to_be_visible(timeout=20_000)
                if title not in NO_CHART:
                    expect(page.locator(".js-plotly-plot .main-svg").first).to_be_visible(timeout=20_000)
                page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for(timeout=20_000)
                timings[title] = time.perf_counter() - t0
                page.wait_for_timeout(400)  # let plotly finish layout before the screenshot
                assert page.locator("[data-testid=stException]").count() == 0, f"exception shown on {title}"
                assert page.get_by_text("could not be drawn").count() == 0, f"a part failed on {title}"
                at_root = spec.default and page.url.rstrip("/") == server  # the default page lives at "/"
                assert page.url.rstrip("/").endswith("/" + spec.url_path) or at_root, (title, page.url)
                if title not in NO_CHART:
                    assert page.locator(".js-plotly-plot").count() >= 1
                    # no two labels of a drawn figure closer than their size (issue 24)
                    assert overlapping_labels(page) == [], title
                page.screenshot(path=str(shots / f"{spec.url_path}.png"), full_page=True)
            for title in CHART_PAGES:  # second visit: caches warm, what a user feels when switching pages
                t0 = time.perf_counter()
                _nav(page, title).click()
                expect(page.locator("h1").filter(has_text=title).first).to_be_visible(timeout=20_000)
                page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for(timeout=20_000)
                expect(page.locator(".js-plotly-plot .main-svg").first).to_be_visible(timeout=20_000)
                timings[f"{title} (again)"] = time.perf_counter() - t0
            _nav(page, "Timeline").click()
            page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for(timeout=20_000)
            expect(page.locator(".js-plotly-plot .main-svg").first).to_be_visible(timeout=20_000)
            page.wait_for_timeout(800)
            page.screenshot(path=str(shots / "readme.png"))
            # the job whose rank-0 trace holds 250,000 events: must draw, reduced, without freezing
            t0 = time.perf_counter()
            page.locator("[data-testid=stSelectbox]").filter(has_text="Job").first.click()
            page.keyboard.type("ring-ws2")
            page.keyboard.press("Enter")
            ring = page.locator(".js-plotly-plot").filter(has_text="ring-ws2 · step").first
            expect(ring).to_be_visible(timeout=60_000)
            page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for(timeout=60_000)
            timings["Timeline, 250k-event trace"] = time.perf_counter() - t0
            assert page.locator("[data-testid=stException]").count() == 0
            assert page.locator(".js-plotly-plot .bars path").count() < 10_000
            page.screenshot(path=str(shots / "timeline_250k.png"), full_page=True)
            # a second browser session on the warm server: the "first render" a user normally sees
            fresh = browser.new_page(viewport={"width": 1500, "height": 1000})
            t0 = time.perf_counter()
            fresh.goto(server, wait_until="domcontentloaded")
            expect(fresh.locator(".js-plotly-plot .main-svg").first).to_be_visible(timeout=30_000)
            timings["new session, Overview"] = time.perf_counter() - t0
            # a page's address opens that page (what a bookmark or a shared link does)
            fresh.goto(f"{server}/stragglers", wait_until="domcontentloaded")
            expect(fresh.locator("h1").filter(has_text="Stragglers").first).to_be_visible(timeout=30_000)
            expect(fresh.locator(".js-plotly-plot .main-svg").first).to_be_visible(timeout=30_000)
        finally:
            browser.close()
    print("\nscreenshots in", shots)
    for name, secs in timings.items():
        print(f"  {name:>26}: {secs:.2f} s")
