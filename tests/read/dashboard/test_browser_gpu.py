"""The GPU page in Chromium on every GPU run (gpu_runs.py: the committed profiles/sample-gpu, and
the H200 recordings in ``../shared/gpu/runs`` where present): it renders without an
exception, its ledger bars sum to each window's span as the browser draws them, and no two labels
overlap.

Why a browser pass beside the AppTests: plotly draws the figures in the browser; a trace that
plotly refuses, or labels printed over each other, only show there. Skipped when /usr/bin/chromium
is absent. The dashboard reads copies of the runs (the `gpu_runs` fixture; its trace cache goes to
the suite's temporary cache folder). Every wait is bounded.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.read.dashboard.browser_checks import figure, overlapping_labels, serving
from tests.read.dashboard.gpu_runs import RUNS, SAMPLE_GPU
from tests.read.dashboard.test_browser_samples import ARGS, CHROMIUM, _idle

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not found"),
    pytest.mark.skipif(not RUNS, reason=f"no GPU run ({SAMPLE_GPU} is absent)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gpu_runs: Path):
    yield from serving(gpu_runs, tmp_path_factory.mktemp("log"))


def test_gpu_page_renders_for_every_gpu_run(server, gpu_runs: Path) -> None:
    from playwright.sync_api import sync_playwright

    url, log = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.set_default_timeout(90_000)
            page.goto(f"{url}/gpu", wait_until="domcontentloaded")
            page.locator("h1").filter(has_text="GPU").first.wait_for(timeout=90_000)
            _idle(page)
            for run in RUNS:
                run_id = json.loads((gpu_runs / run / "run.json").read_text())["run_id"]
                picker = page.get_by_role("combobox", name="Run")
                if picker.input_value() != run_id:
                    picker.click()
                    picker.fill(run_id)
                    picker.press("Enter")
                    page.wait_for_function(
                        "id => Array.from(document.querySelectorAll('[data-testid=stSidebar] input'))"
                        ".some(e => e.value === id)", arg=run_id, timeout=60_000)
                _idle(page)
                assert page.locator("[data-testid=stException]").count() == 0, run
                assert page.locator("[data-testid=stAlertContentError]").count() == 0, run
                ledger = figure(page, "GPU time ledger of rank")
                bars = [t for t in ledger["data"] if t["type"] == "bar"]
                assert [t["name"] for t in bars][0] == "compute" and len(bars) == 4, run
                sums = [sum(float(t["x"][i]) for t in bars) for i in range(len(bars[0]["y"]))]
                assert all(s > 0 for s in sums), (run, sums)
                text = page.locator("[data-testid=stMain]").inner_text()
                spans = [float(m) for m in re.findall(r"span\s+([\d.]+) ms", text)]
                assert spans and sums[0] == pytest.approx(spans[0], abs=0.006), (run, sums[0], spans)
                assert figure(page, "Host idle by CPU op")["data"], run
                assert overlapping_labels(page) == [], run
        finally:
            browser.close()
    log.seek(0)
    assert "Traceback" not in log.read()
