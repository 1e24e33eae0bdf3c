"""Which runs' traces the dashboard has read comes from one place, the per-step traces cache
itself (data.cached_trace_steps): once a run's entry has made room for others, traces_read says
so, and the page shows steps.csv first again instead of blocking on a cold read."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from dpcore.read.dashboard import data


@dataclass
class _Run:
    path: Path


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs whose traces were read (run_trace_steps, counted), on an empty cache."""
    got: list[str] = []

    def read(run, problems=None):
        got.append(run.path.name)
        return pd.DataFrame({"job_id": ["j"], "step": [len(got)]})

    monkeypatch.setattr(data, "run_trace_steps", read)
    if hasattr(data, "_trace_steps"):
        monkeypatch.setattr(data, "_trace_steps", type(data._trace_steps)())
    else:
        data.cached_trace_steps.clear()
    return got


def _runs(tmp_path: Path, n: int) -> list[_Run]:
    out = []
    for i in range(n):
        (tmp_path / f"run{i}").mkdir()
        out.append(_Run(tmp_path / f"run{i}"))
    return out


def test_an_evicted_run_reads_as_not_read(tmp_path: Path, reads: list[str]) -> None:
    runs = _runs(tmp_path, 17)  # one more than the cache keeps
    first = runs[0]
    assert not data.traces_read(first)
    data.cached_trace_steps(first, data.key(first))
    assert data.traces_read(first) and reads == ["run0"]
    data.cached_trace_steps(first, data.key(first))
    assert reads == ["run0"]  # a hit
    for run in runs[1:]:
        data.cached_trace_steps(run, data.key(run))
    # the 17th run took the first one's place: not read any more, and reading it reads again
    assert not data.traces_read(first)
    assert all(data.traces_read(r) for r in runs[1:])
    data.cached_trace_steps(first, data.key(first))
    assert reads.count("run0") == 2 and data.traces_read(first)


def test_a_hit_is_a_copy_with_its_problems(tmp_path: Path, reads: list[str]) -> None:
    run = _runs(tmp_path, 1)[0]
    a = data.cached_trace_steps(run, data.key(run))
    a.loc[0, "step"] = 99
    b = data.cached_trace_steps(run, data.key(run))
    assert b.loc[0, "step"] == 1 and b.attrs["problems"] == [] and data.trace_problems(run) == []
