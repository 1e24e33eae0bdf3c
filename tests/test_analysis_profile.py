"""Analysis of a real `python -m dpcore profile` run (2 gloo ranks, flat vs overlap)."""
import subprocess
import sys
from pathlib import Path

import pytest

from dpcore.analysis import job_summary, list_runs, load_run, overlap_by_rank, read_trace_dir
from dpcore.analysis.commands import analyze, summarize

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("profiles")
    cmd = [sys.executable, "-m", "dpcore", "profile", "--variants", "flat,overlap", "--world-sizes", "2",
           "--steps", "4", "--warmup", "1", "--out", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    runs, warnings = list_runs(out)
    assert not warnings and len(runs) == 1
    return Path(runs["path"].iloc[0])


def test_profile_run_overlap(run_dir):
    run = load_run(run_dir)
    s = job_summary(run).set_index("variant")
    assert set(s.index) == {"flat", "overlap"} and (s["status"] == "complete").all()
    assert s.loc["flat", "overlap_pct"] < 5.0                         # blocking all-reduce after backward
    assert s.loc["overlap", "overlap_pct"] > s.loc["flat", "overlap_pct"] + 5.0
    assert (s["comm_ms"] > 0).all() and (s["step_ms"] >= s["compute_ms"]).all()
    flat = overlap_by_rank(read_trace_dir(run_dir / "traces" / "flat-ws2"))
    ovl = overlap_by_rank(read_trace_dir(run_dir / "traces" / "overlap-ws2"))
    assert sorted(flat["rank"]) == [0, 1] and (flat["comm_ms"] > 0).all()
    assert flat["overlap_pct"].max() < 5.0 and ovl["overlap_pct"].mean() > flat["overlap_pct"].mean()
    assert analyze(str(run_dir / "traces" / "flat-ws2"), csv=True).splitlines()[0] == \
        "rank,overlap_pct,comm_ms,exposed_comm_ms,compute_ms"
    assert "overlap-ws2" in summarize(str(run_dir))
