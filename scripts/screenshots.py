"""Regenerate the README's screenshots (docs/*.png) from the committed sample runs.

Why a script: the pictures must show what the current code draws on the samples a fresh clone
has, so they are taken the way a user sees them: `streamlit run app.py` on a copy of profiles/, driven by
Playwright with the system Chromium (never `playwright install`). Usage::

    python scripts/screenshots.py [--out docs] [--only memory,ring]

Each shot: (file name, page URL path, optional action that picks what the README shows).
The GPU page's picture (docs/gpu.png) is taken on a GPU run the samples do not hold: a copy of
``../shared/gpu/runs/h200_rec-gpu`` beside the checkout (recorded on an H200), skipped when absent.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The GPU run docs/gpu.png shows (an MLP on one H200, recorded through dpcore.record).
GPU_RUN = REPO.parent / "shared" / "gpu" / "runs" / "h200_rec-gpu"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]


def _pick(page, label: str, option: str) -> None:
    """Choose ``option`` in the select box labelled ``label`` (typed, then Enter)."""
    page.locator("[data-testid=stSelectbox]").filter(has_text=label).first.click()
    page.keyboard.type(option)
    page.keyboard.press("Enter")


def _compare(page) -> None:
    page.locator("[data-testid=stSidebar]").get_by_text("Compare with a second run").click()


SHOTS = [
    ("dashboard", "", None, False),
    ("timeline", "timeline", None, False),
    ("memory", "memory", None, True),
    ("buckets", "buckets", None, True),
    ("ring", "ring-messages", None, True),
    ("compare", "", _compare, True),
    ("traces", "traces", None, False),
    ("whatif", "what-if", None, True),
]


def _idle(page) -> None:
    """Wait until the script has finished and every figure is drawn (no skeleton left)."""
    page.wait_for_timeout(1000)
    page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for(timeout=90_000)
    page.wait_for_function("document.querySelectorAll('[data-testid=stSkeleton]').length === 0", timeout=90_000)
    plots = page.locator(".js-plotly-plot")
    for i in range(plots.count()):
        plots.nth(i).locator(".main-svg").first.wait_for(timeout=60_000)


def _serve(root: Path):
    """`streamlit run app.py` on the runs under ``root``; (process, url) once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DPCORE_PROFILES": str(root)}
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.3)
    return proc, url


def _profiles(tmp: Path, compare: bool) -> Path:
    """A copy of the committed samples (the dashboard never writes into the checkout). The samples
    hold one training run, and compare mode pairs only runs of one kind: for the compare picture,
    sample-train and a copy of it renamed sample-train-again."""
    root = tmp / ("compare" if compare else "samples")
    names = ["sample-train"] if compare else ["sample-train", "sample-allreduce"]
    for name in names:
        shutil.copytree(REPO / "profiles" / name, root / name)
    if compare:
        again = root / "sample-train-again"
        shutil.copytree(root / "sample-train", again)
        meta = json.loads((again / "run.json").read_text())
        meta["run_id"] = again.name
        (again / "run.json").write_text(json.dumps(meta, indent=1))
    return root


def _shoot(browser, url: str, out: Path, name: str, path: str, action, full: bool) -> None:
    """One screenshot of the page at ``path`` (after ``action``) saved as ``out/name.png``."""
    # Streamlit scrolls inside its own container: a "full page" is a tall viewport
    page = browser.new_page(viewport={"width": 1400, "height": 3200 if full else 1000})
    page.set_default_timeout(60_000)
    page.goto(f"{url}/{path}", wait_until="domcontentloaded")
    page.locator("h1").first.wait_for()
    _idle(page)
    if action:
        action(page)
        page.wait_for_timeout(500)
        _idle(page)
    page.wait_for_timeout(1500)  # plotly's layout
    page.screenshot(path=str(out / f"{name}.png"))
    print("wrote", out / f"{name}.png")
    page.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs"))
    ap.add_argument("--only", default="", help="comma-separated shot names (default: all)")
    ap.add_argument("--every-page", action="store_true", help="one tall shot of every page instead")
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    if args.every_page:
        sys.path.insert(0, str(REPO))
        from dpcore.read.dashboard.pages import PAGES

        shots = [(p.url_path, "" if p.default else p.url_path, None, True) for p in PAGES]
    else:  # the README's pictures: one screen each
        shots = [(n, path, action, False) for n, path, action, _ in SHOTS]
    shots = [s for s in shots if not only or s[0] in only]
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        for compare in (False, True):
            todo = [s for s in shots if (s[2] is _compare) == compare]
            if not todo:
                continue
            proc, url = _serve(_profiles(Path(tmp), compare))
            try:
                for name, path, action, full in todo:
                    _shoot(browser, url, Path(args.out), name, path, action, full)
            finally:
                proc.terminate()
                proc.wait(timeout=20)
        if (not only or "gpu" in only) and not args.every_page:
            if GPU_RUN.is_dir():
                root = Path(tmp) / "gpu"
                shutil.copytree(GPU_RUN, root / GPU_RUN.name)
                proc, url = _serve(root)
                try:
                    _shoot(browser, url, Path(args.out), "gpu", "gpu", None, False)
                finally:
                    proc.terminate()
                    proc.wait(timeout=20)
            else:
                print(f"skipped gpu.png: no GPU run at {GPU_RUN}")
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
