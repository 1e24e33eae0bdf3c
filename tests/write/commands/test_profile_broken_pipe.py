"""``profile --progress json | head -1`` (issue 25, item 7): the reader leaving is not a reason
to fail the jobs, nor a silent exit 0 with every job ``failed``. The run goes on, its jobs
complete, the exit status is the run's, and stderr says that stdout was closed. Real CLI, real
pipe closed by the reader after its first line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_a_closed_progress_pipe_does_not_fail_the_run(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpcore", "profile", "--variants", "single,flat", "--world-sizes", "2",
         "--width", "16", "--steps", "3", "--warmup", "1", "--no-trace", "--progress", "json",
         "--run-id", "piped", "--out", str(tmp_path), "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    first = proc.stdout.readline()  # what `head -1` reads, then it exits
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert json.loads(first)["event"] == "run_start"
    err = err.decode()
    meta = json.loads((tmp_path / "piped" / "run.json").read_text())
    assert proc.returncode == 0, err[-2000:]
    assert meta["status"] == "complete", meta
    assert [j["status"] for j in meta["jobs"]] == ["complete", "complete"]
    assert "stdout was closed (broken pipe)" in err and "Traceback" not in err, err[-2000:]


def test_a_closed_pipe_keeps_the_runs_exit_status(tmp_path: Path) -> None:
    """`profile | head` with a job that fails: the end table meets a closed pipe, and the exit
    status is still the run's (1), not the silent 0 it was."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpcore", "profile", "--variants", "flat", "--world-sizes", "2",
         "--width", "16", "--steps", "2", "--warmup", "0", "--no-trace", "--progress", "none",
         "--run-id", "failing", "--out", str(tmp_path), "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "DPCORE_FAIL_JOB": "flat-ws2"})
    proc.stdout.close()  # the reader is gone before the table is printed
    _, err = proc.communicate(timeout=300)
    meta = json.loads((tmp_path / "failing" / "run.json").read_text())
    assert meta["status"] == "failed"
    assert proc.returncode == 1, err.decode()[-2000:]
