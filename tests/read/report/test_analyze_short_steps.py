"""analyze says when a rank's steps are too short to be training steps: an old JSON-array trace of
CPU events read as "3 steps of 0.0175 ms" with no word; the numbers describe the step ranges only."""
from __future__ import annotations

import json
from pathlib import Path

from dpcore.read.report.analyze import MIN_STEP_MS, analyze


def test_tiny_steps_get_a_note(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "Operator", "name": n, "pid": 1, "tid": 1, "ts": 1000.0 + 40000 * k + i,
               "dur": 17.5 if i == 0 else 10.0} for k in range(3) for i, n in enumerate((f"ProfilerStep#{k}",
                                                                                          "aten::mm"))]
    (tmp_path / "trace.json").write_text(json.dumps(events))  # a JSON array: the legacy export
    text = analyze(str(tmp_path))
    assert ("note: rank 0: its 3 step(s) average 0.0175 ms, shorter than any training step (< 0.1 ms)"
            in text) and MIN_STEP_MS == 0.1


def test_real_steps_get_none(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": 1000.0 + 40000 * k + i,
               "dur": 5000.0 if i == 0 else 3000.0} for k in range(3) for i, n in enumerate((f"ProfilerStep#{k}",
                                                                                             "aten::mm"))]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    assert "shorter than any training step" not in analyze(str(tmp_path))
