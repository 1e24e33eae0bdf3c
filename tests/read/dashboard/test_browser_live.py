"""The Live page in Chromium on a run that is still running: rows appended to live.csv appear
without a reload (the page's fragment redraws every 1.5 s), then the run ends and the page
stops with its links.

Why no timing can flake here: each check waits (up to 60 s) for a text that only the new rows
or the new status can produce; a slow machine only makes the wait longer."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from dpcore.contract import runformat as rf
from tests.fixtures_run import make_run
from tests.read.dashboard.browser_checks import start_server
from tests.read.dashboard.test_browser import CHROMIUM, free_port
from tests.read.dashboard.test_live_hang_pages import add_live_and_hang

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not found")


def test_live_page_follows_a_running_run_in_chromium(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    run = make_run(tmp_path, "20250101-120000-mlp")
    add_live_and_hang(run)
    meta = json.loads((run / rf.RUN_JSON).read_text())
    meta.update(status="running", pid=os.getpid(), host=socket.gethostname())
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    port = free_port()
    log = open(tmp_path / "streamlit.log", "w+")
    proc = start_server(tmp_path, log, port)
    url = f"http://127.0.0.1:{port}"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{url}/live", wait_until="domcontentloaded")
                expect(page.get_by_text("20 step(s) seen")).to_be_visible(timeout=60_000)
                expect(page.locator(".js-plotly-plot .main-svg").first).to_be_visible(timeout=60_000)
                with open(run / rf.LIVE_FILE, "a") as f:  # the next step arrives
                    f.write("flat-ws2,0,20,False,2000,1700000002.0,21.0,5.0,\n"
                            "flat-ws2,1,20,False,2000,1700000002.0,21.0,5.0,\n")
                expect(page.get_by_text("21 step(s) seen")).to_be_visible(timeout=60_000)
                meta["status"] = "complete"
                (run / rf.RUN_JSON).write_text(json.dumps(meta))
                expect(page.get_by_text("The run has ended")).to_be_visible(timeout=60_000)
                assert page.locator("[data-testid=stException]").count() == 0
            finally:
                browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
