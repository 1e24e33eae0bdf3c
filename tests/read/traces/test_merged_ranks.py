"""A merged trace (every rank a process named 'rank <r>') is read as its ranks; a rankless trace
whose processes are named otherwise (a GPU trace: 'python', 'GPU 0') is not split."""
from __future__ import annotations

import json
from pathlib import Path

from dpcore.read.traces.reader import read_trace, trace_notes
from dpcore.read.traces.world import merged_ranks


def _trace(path: Path, names: dict[int, str], args_first: bool) -> Path:
    ev = []
    for pid, name in names.items():
        meta = {"args": {"name": name}, "ph": "M", "name": "process_name", "pid": pid, "tid": 0} if args_first \
            else {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
        ev.append(meta)
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": 7, "ts": 10.0 + pid, "dur": 5.0})
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


def test_merged_trace_ranks_come_from_process_names(tmp_path: Path) -> None:
    for args_first in (False, True):  # whatever the key order of the metadata events
        p = _trace(tmp_path / f"merged{args_first}.json", {0: "rank 0", 1: "rank 1"}, args_first)
        assert merged_ranks(p) == {"0": 0, "1": 1}
        ev = read_trace(p)
        assert sorted(ev["rank"].unique()) == [0, 1] and len(ev) == 2
        assert any("a merged trace: ranks 0, 1 read from its process names" in n for n in trace_notes(ev))


def test_other_process_names_are_not_ranks(tmp_path: Path) -> None:
    p = _trace(tmp_path / "gpu.json", {123: "python 123", 0: "GPU 0"}, False)
    assert merged_ranks(p) == {}
    ev = read_trace(p)
    assert set(ev["rank"]) == {0} and any("read as rank 0 of 1" in n for n in trace_notes(ev))
