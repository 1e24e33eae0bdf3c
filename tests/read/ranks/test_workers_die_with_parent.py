"""``kill -9`` of a read command leaves no worker behind: ``analyze --workers 2`` is killed while
its two worker processes exist, and both are gone within seconds (they waited forever,
re-parented to init, before)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.synthetic import write_gpu_trace_dir

ROOT = Path(__file__).resolve().parents[3]


def _children(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_kill_9_of_analyze_takes_its_workers_along(tmp_path):
    traces = tmp_path / "job"
    write_gpu_trace_dir(traces, world_size=4, steps=3, kernels_per_step=4000, seed=2)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DPCORE_CACHE_DIR": str(tmp_path / "c")}
    p = subprocess.Popen([sys.executable, "-m", "dpcore", "analyze", str(traces), "--workers", "2",
                          "--no-cache"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(kids) < 2 and p.poll() is None:
            kids = _children(p.pid)
            time.sleep(0.02)
        assert len(kids) >= 2, "the two workers never started (the read ended first?)"
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(k) for k in kids):
            time.sleep(0.1)
        left = [k for k in kids if _alive(k)]
        assert left == [], f"workers {left} outlived their killed parent"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for k in kids:  # only the workers this test saw started, by their id
            if _alive(k):
                os.kill(k, signal.SIGKILL)
