"""A job whose loss becomes NaN is ``failed``, naming the step, not ``complete`` (issue 25,
item 11): its step times measure a diverged model, and a complete status would present them
as a result. Real profile run (single and a 2-rank gloo flat job), real CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_nan_loss_fails_the_job_and_names_the_step(tmp_path: Path) -> None:
    # lr 1e30 on SGD: the first update blows every weight up, the next loss is inf/nan
    proc = subprocess.run(
        [sys.executable, "-m", "dpcore", "profile", "--variants", "single,flat", "--world-sizes", "2",
         "--width", "16", "--steps", "3", "--warmup", "1", "--no-trace", "--lr", "1e30",
         "--progress", "none", "--run-id", "nan", "--out", str(tmp_path), "--timeout", "120"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    meta = json.loads((tmp_path / "nan" / "run.json").read_text())
    assert meta["status"] == "failed"
    jobs = {j["id"]: j for j in meta["jobs"]}
    assert set(jobs) == {"single-ws1", "flat-ws2"}
    for job in jobs.values():
        assert job["status"] == "failed", job
        assert "the loss became" in job["error"] and "lower --lr, now 1e+30" in job["error"], job["error"]
