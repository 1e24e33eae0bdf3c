"""The run.json entry of a job's what-if calibration: ranks merged per plan, NaN as null, and a
failed calibration recorded as its error (the job's measured rows are written regardless)."""
from __future__ import annotations

import json

from dpcore.write.capture.run_lifecycle import calibration_entry


def _rank(rank: int) -> dict:
    step = {"rank": rank, "step": 1_000_000, "bwd_start_ms": 0.0, "bwd_end_ms": 10.0, "bytes": [4],
            "launch_ms": [10.0], "end_ms": [12.0]}
    return {"plans": [{"bucket_mb": 4.0, "steps": [step]}, {"bucket_mb": 0.25, "steps": [step]}],
            "cost_ms": 100.0 + rank}


def test_ranks_merge_and_nan_is_null() -> None:
    entry = calibration_entry([_rank(0), _rank(1)])
    assert [len(p["steps"]) for p in entry["data"]] == [2, 2] and entry["cost_ms"] == 101.0
    assert entry["kappa"] is None and entry["per_message_ms"] is None      # one size, same comm: no fit
    assert "NaN" not in json.dumps(entry) and entry["steps_per_plan"] == 1


def test_a_failed_calibration_is_its_error() -> None:
    assert calibration_entry([_rank(0), {"error": "RuntimeError: out of memory"}]) == {
        "error": "RuntimeError: out of memory"}
