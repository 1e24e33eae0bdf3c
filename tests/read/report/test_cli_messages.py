"""What the read commands say, and only that (issue 25 item 12): a FIFO is named as one, a run
whose writer died is `stale` as on the dashboard, and no library warning reaches stderr."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dpcore.contract import runformat as rf
from tests.fixtures_run import make_run

ROOT = Path(__file__).resolve().parents[3]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcore", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)  # a hang guard, not a measurement


@pytest.mark.parametrize("command", ["analyze", "stragglers", "summarize"])
def test_a_fifo_is_named_as_one_not_as_missing(tmp_path, command):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    out = cli(command, str(fifo))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "not found" not in out.stderr and "pipe" in out.stderr and str(fifo) in out.stderr, out.stderr


def test_summarize_says_stale_where_the_dashboard_does(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = make_run(tmp_path, "20250101-000000-dead", steps=3, profiled=1)
    meta = json.loads((run / rf.RUN_JSON).read_text())
    meta.update(status="running", owner={"pid": dead.pid, "host": socket.gethostname()})
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    out = cli("summarize", str(run))
    assert out.returncode == 0 and out.stdout.splitlines()[0] == "20250101-000000-dead (stale)", out.stdout[:200]


def test_no_library_warning_reaches_stderr(tmp_path, samples):
    """Collectives of 0 bytes made whatif's fit divide 0 by 0: numpy printed a RuntimeWarning
    with a source line; now only dpcore's own lines are on stderr."""
    run = Path(shutil.copytree(samples / "sample-train", tmp_path / "zero"))
    f = run / rf.table_file("collectives")
    pd.read_csv(f).assign(bytes=0).to_csv(f, index=False)
    for args in (["whatif", str(run), "--job", "bucketed-ws2-b25"], ["summarize", str(run)], ["analyze", str(run)]):
        out = cli(*args)
        assert "Warning" not in out.stderr and ".py:" not in out.stderr, (args, out.stderr)
