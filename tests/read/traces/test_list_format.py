"""An old trace in the JSON Array Format (a bare list of events, no ``traceEvents`` key, as
Chrome's tracing and early torch.profiler versions wrote) is read like the Object Format."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from dpcore.read.traces.bytescan import Scanner
from dpcore.read.traces.reader import read_trace

pytestmark = pytest.mark.usefixtures("scan_path")  # each test: a cache of its own

EVENTS = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 20},
          {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING", "pid": 0, "tid": 7, "ts": 10.5,
           "dur": 5, "args": {"stream": 7, "correlation": 1}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 9, "dur": 1,
           "args": {"correlation": 1}}] * 40


@pytest.mark.parametrize("window", [64, 2 << 20])
def test_list_format_reads_like_the_object_format(tmp_path: Path, window: int) -> None:
    bare = tmp_path / "list" / "rank3.json.gz"
    bare.parent.mkdir()
    bare.write_bytes(gzip.compress(json.dumps(EVENTS, indent=1).encode()))
    wrapped = tmp_path / "obj" / "rank3.json.gz"
    wrapped.parent.mkdir()
    wrapped.write_bytes(gzip.compress(json.dumps({"traceEvents": EVENTS}).encode()))
    found = Scanner(bare).run(window)  # the scan reads it (not only the full parse)
    assert found is not None and found[0] == {} and found[1].ts.tolist()[:3] == [1.0, 10.5, 9.0]
    got, want = read_trace(bare), read_trace(wrapped)
    assert len(got) == 120 and set(got["rank"]) == {3}
    assert got["kind"].value_counts().to_dict() == want["kind"].value_counts().to_dict()
    pd.testing.assert_frame_equal(got, want)
