"""The sidebar's run picker in Chromium shows long run labels whole (cut in the middle by the app,
never clipped by the browser): an interrupted run with a timestamped id, and a run id of wide
glyphs (capitals, m, w), which 30 characters did not fit (256 px drawn in 190).
Skipped when /usr/bin/chromium is absent. Every wait is bounded.
"""
from __future__ import annotations

import json
import os

import pytest

from tests.fixtures_run import make_run
from tests.read.dashboard.browser_checks import cut_labels, serving
from tests.read.dashboard.test_browser_samples import ARGS, CHROMIUM, _idle

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not found")
IDS = {"20261201-185634-mi300-cc4b": "interrupted", "20261201-185635-WWWWMMMMwwwwmmmm-x": "complete",
       "imported-MMMMWWWW-verylongname-of-run": "failed"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("profiles")
    for k, (run_id, status) in enumerate(IDS.items()):
        run = make_run(root, run_id, steps=2, profiled=0, seed=k)
        meta = json.loads((run / "run.json").read_text())
        meta.update(status=status, created=f"2026-12-0{k + 1}T00:00:00+00:00")
        (run / "run.json").write_text(json.dumps(meta))
    yield from serving(root, tmp_path_factory.mktemp("log"))


def test_every_run_label_is_shown_whole(server) -> None:
    from playwright.sync_api import sync_playwright

    url, _ = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(f"{url}/runs", wait_until="domcontentloaded")
            picker = page.get_by_role("combobox", name="Run")
            picker.wait_for()
            _idle(page)
            for run_id in IDS:  # each label in turn in the picker
                picker.click()
                option = page.locator("[role=option]").filter(has_text=run_id[-4:]).first
                option.click()
                _idle(page)
                assert cut_labels(page) == [], run_id
        finally:
            browser.close()
