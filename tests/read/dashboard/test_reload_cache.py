"""What a reload of the dashboard reuses: the first chart (Overview's breakdown) comes back as the one
cached figure, with the numbers a fresh build gives, and a rewritten run is drawn anew.

Why: a reload reruns app.py in a new session; the chart it waits for first must cost no rebuild
and no unpickling (st.cache_resource), and caching must never change a number.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dpcore.contract import runformat as rf
from dpcore.read.analysis import job_summary
from dpcore.read.dashboard import data
from dpcore.read.dashboard.pages import overview
from dpcore.read.plots.overview import breakdown_figure
from dpcore.read.rundir import load_run
from dpcore.read.tables import run_trace_steps
from tests.app_pages import APP, heading, problems
from tests.fixtures_run import make_run


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    return make_run(tmp_path / "profiles", "20250101-120000-mlp")


def _bars(fig) -> list[tuple[str, tuple, tuple]]:
    """Every bar trace of a figure: name, x labels, heights (what the reader sees)."""
    return [(t.name, tuple(t.x), tuple(round(float(v), 9) for v in t.y)) for t in fig.data]


def test_the_breakdown_is_one_shared_figure_with_the_fresh_numbers(run_dir: Path) -> None:
    overview.breakdown.clear()
    root = run_dir.parent
    run = load_run(run_dir, root=root)
    key = data.key(run)
    first = overview.breakdown(run, key)
    assert overview.breakdown(run, key) is first  # no copy, no unpickling on a rerun
    fresh = breakdown_figure(job_summary(run, run_trace_steps(run)), "Where a training step's time goes")
    assert _bars(first) == _bars(fresh) and len(first.data) >= 3
    assert any(v > 0 for _, _, ys in _bars(first) for v in ys)
    # compare mode's shared y-axis is its own entry, not the single run's figure
    assert overview.breakdown(run, key, 1234.0) is not first
    assert overview.breakdown(run, key, 1234.0).layout.yaxis.range[1] == pytest.approx(1234.0)


def test_a_rewritten_run_is_drawn_anew(run_dir: Path) -> None:
    overview.breakdown.clear()
    root = run_dir.parent
    run = load_run(run_dir, root=root)
    before = overview.breakdown(run, data.key(run))
    steps = run_dir / rf.table_file("steps")
    st_ = steps.stat()
    os.utime(steps, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
    assert overview.breakdown(run, data.key(run)) is not before


def test_a_reload_draws_the_same_chart(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sessions (a reload) on the same run: the same chart, byte for byte, the second without
    building a figure."""
    monkeypatch.setenv("DPCORE_PROFILES", str(run_dir.parent))
    overview.breakdown.clear()
    specs = []
    for _ in range(2):
        at = AppTest.from_file(APP, default_timeout=60)
        at.run()
        assert not problems(at) and heading(at) == "Overview"
        specs.append(at.get("plotly_chart")[0].proto.spec)
    assert specs[0] == specs[1] and '"type":"bar"' in specs[0].replace(" ", "")
