"""Run directory writing: atomic files, schema order, collision-free ids, merged traces."""
from __future__ import annotations

import csv
import gzip
import json
import os
from pathlib import Path

import pytest

from dpcore.contract.clocksync import marker_name, shift_us
from dpcore.contract.files import atomic_write_text
from dpcore.contract.runformat import STEP_COLUMNS, TABLES
from dpcore.write.capture.merged_trace import _lanes, merge_job_traces
from dpcore.write.capture.run_writer import RunWriter


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "run.json"
    atomic_write_text(target, "old")

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temp file left behind


def test_run_writer_tables_and_jobs(tmp_path):
    w = RunWriter(tmp_path, "t", command=["x"], config={"a": 1}, environment={"backend": "gloo"})
    w.add_job({"id": "flat-ws2", "status": "running"})
    w.add_job({"id": "flat-ws2", "status": "complete", "clock_offsets_ns": {"0": 0, "1": 12}})
    w.append_rows("steps", [{"job_id": "flat-ws2", "rank": 0, "step": 0, "step_ms": 1.5}])
    w.append_rows("steps", [{"job_id": "flat-ws2", "rank": 1, "step": 0, "step_ms": 1.7}])
    w.finish("complete")
    meta = json.loads((w.run_dir / "run.json").read_text())
    assert meta["status"] == "complete" and meta["finished"]
    assert meta["jobs"] == [{"id": "flat-ws2", "status": "complete",
                             "clock_offsets_ns": {"0": 0, "1": 12}}]
    with open(w.run_dir / "steps.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == STEP_COLUMNS and len(rows) == 3
    for table, cols in TABLES.items():
        with open(w.run_dir / f"{table}.csv") as f:
            assert next(csv.reader(f)) == cols
    with pytest.raises(ValueError, match="unknown table"):
        w.append_rows("bogus", [])


def test_two_writers_same_second_get_two_runs(tmp_path):
    a = RunWriter(tmp_path, "same", command=[], config={}, environment={})
    b = RunWriter(tmp_path, "same", command=[], config={}, environment={})
    assert a.run_dir != b.run_dir and a.run_dir.exists() and b.run_dir.exists()


def test_lanes_separate_overlapping_slices():
    assert _lanes([(0, 10), (2, 5), (5, 8), (11, 12)]) == [0, 1, 1, 0]


def _rank_trace(path: Path, marker_ts: float, rank: int) -> None:
    ev = [{"ph": "X", "name": marker_name(0), "ts": marker_ts, "dur": 0, "pid": 100 + rank,
           "tid": 7, "cat": "user_annotation"},
          {"ph": "X", "name": "forward", "ts": marker_ts + 10, "dur": 50, "pid": 100 + rank,
           "tid": 7, "cat": "user_annotation"},
          {"ph": "M", "name": "thread_name", "pid": 100 + rank, "tid": 7, "args": {"name": "main"}}]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)


def test_merged_trace_aligns_ranks_and_draws_flows(tmp_path):
    # rank 1's profiler clock is 5000 us ahead of rank 0's, but both markers happened at
    # shared time 1_000_000 ns -> merged forward events must land at the same ts.
    _rank_trace(tmp_path / "rank0.json.gz", 100.0, 0)
    _rank_trace(tmp_path / "rank1.json.gz", 5100.0, 1)
    msgs = [
        {"algo": "ring", "rank": 0, "step": 1, "call": 0, "phase": "reduce_scatter",
         "ring_step": 0, "src": 0, "dst": 1, "chunk": 0, "bytes": 8, "t_post_ns": 1_012_000,
         "t_done_ns": 1_020_000, "side": "send"},
        {"algo": "ring", "rank": 1, "step": 1, "call": 0, "phase": "reduce_scatter",
         "ring_step": 0, "src": 0, "dst": 1, "chunk": 0, "bytes": 8, "t_post_ns": 1_011_000,
         "t_done_ns": 1_022_000, "side": "recv"},
    ]
    out = tmp_path / "merged.json.gz"
    info = merge_job_traces({0: tmp_path / "rank0.json.gz", 1: tmp_path / "rank1.json.gz"},
                            {0: [(999_000, 1_001_000)], 1: [(999_500, 1_000_500)]}, msgs, out)
    doc = json.loads(gzip.decompress(out.read_bytes()))
    evs = doc["traceEvents"]
    fwd = sorted((e["pid"], e["ts"]) for e in evs if e.get("name") == "forward")
    assert fwd == [(0, 1010.0), (1, 1010.0)]
    names = {e["pid"]: e["args"]["name"] for e in evs if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    s = [e for e in evs if e["ph"] == "s"]
    f = [e for e in evs if e["ph"] == "f"]
    assert len(s) == len(f) == 1 and s[0]["id"] == f[0]["id"]
    assert s[0]["pid"] == 0 and f[0]["pid"] == 1 and s[0]["ts"] == 1012.0
    assert info["message_events"] == 2


def test_clock_shift_uses_the_tightest_bracket():
    # sample 0 was descheduled between its reads (wide bracket, marker 4 ms late); sample 1 is
    # tight. The trace clock runs 500 us behind: marker k at shared (t_a+t_b)/2 - 500 us.
    samples = [(1_000_000, 5_000_000), (10_000_000, 10_002_000)]
    markers = {0: 4_900.0, 1: 10_001.0 - 500.0}
    assert shift_us(markers, samples) == 500.0
    assert shift_us({}, samples) is None


def test_run_files_are_readable_by_others(tmp_path):
    w = RunWriter(tmp_path, "perm", command=[], config={}, environment={})
    w.append_rows("steps", [])
    w.finish("complete")
    for name in ("run.json", "steps.csv", "collectives.csv"):
        mode = (w.run_dir / name).stat().st_mode & 0o777
        assert mode & 0o044 == 0o044, (name, oct(mode))  # group/other can read (umask 022)


@pytest.mark.parametrize("status,leftover", [("interrupted", "interrupted"), ("failed", "failed")])
def test_close_never_leaves_a_job_running(tmp_path, status, leftover):
    w = RunWriter(tmp_path, "c", command=[], config={}, environment={})
    w.add_job({"id": "a", "status": "complete"})
    w.add_job({"id": "b", "status": "running"})
    w.add_job({"id": "c", "status": "pending"})
    w.close(status)
    meta = json.loads((w.run_dir / "run.json").read_text())
    assert meta["status"] == status
    assert [j["status"] for j in meta["jobs"]] == ["complete", leftover, leftover]
