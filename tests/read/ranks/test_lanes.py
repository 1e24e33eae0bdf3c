"""The Timeline's lanes from the rank cache (issue 23: every view reads through the cache).

Why these tests: the Timeline page used to parse the drawn ranks' traces on every first open;
it now reads their ``lane_events`` tables and reduces the lanes (dpcore.read.tables.job_lanes; the
bound on the steps reduced: test_lanes_bounded.py). The drawn frame must be the
one the raw events give (their lanes read whole, tests/events_path.py), on the
committed sample run and on a synthetic run, for all ranks and for a picked few, on the miss
and on the hit; and a hit must parse no trace (the reader is made to raise).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dpcore.read.analysis import timeline
from dpcore.read.analysis.lanes import trace_lanes
from dpcore.read.ranks import Scale, reduce
from dpcore.read.rundir import load_run
from dpcore.read.tables import job_lanes, run_trace_steps
from tests.app_pages import APP, open_page, problems
from tests.events_path import job_trace_events, lanes_of
from tests.fixtures_run import make_run


def _by_rank(df: pd.DataFrame) -> pd.DataFrame:
    """A lanes table in rank order (job_lanes concatenates in the files' order, rank10 before rank2)."""
    return df.sort_values("rank", kind="stable").reset_index(drop=True)


def _same_lanes(run_path: Path, ranks: dict[str, tuple[int, ...]] | None = None) -> int:
    """Every traced step of every traced job: the lanes frame from the cache (miss, then hit)
    == the one from the raw events, exactly; the lanes tables too. Returns the rows compared."""
    run = load_run(run_path)
    rows = 0
    for job in run.jobs["job_id"]:
        steps = run.traced_steps(job)
        if not steps:
            continue
        picked = (ranks or {}).get(job)
        events = job_trace_events(run, job, ranks=picked)
        assert events is not None and len(events), job
        pd.testing.assert_frame_equal(_by_rank(job_lanes(run, job, picked, Scale(cache=False))),
                                      _by_rank(trace_lanes(events)), check_exact=True)
        for _ in ("miss", "hit"):
            lanes = job_lanes(run, job, picked)
            for step in steps:
                want = timeline(run, job, step, lanes_of(events))
                got = timeline(run, job, step, lanes=lanes)
                pd.testing.assert_frame_equal(got, want, check_exact=True)
                rows += len(want)
    return rows


def test_lanes_from_the_cache_are_the_raw_events_lanes_on_the_sample(samples: Path) -> None:
    assert _same_lanes(samples / "sample-train") > 1000


def test_lanes_from_the_cache_are_the_raw_events_lanes_on_a_test_run(tmp_path: Path) -> None:
    run = make_run(tmp_path / "profiles")
    assert _same_lanes(run) > 100
    # a view's picked ranks of a 4-rank job (the lanes of those ranks only)
    picked = {"ring-ws4": (0, 3), "bucketed-ws4-b25": (2,), "naive-ws4": (1, 2)}
    _same_lanes(run, picked)
    r = load_run(run)
    assert set(job_lanes(r, "ring-ws4", (0, 3))["rank"]) == {0, 3}


def test_the_lanes_table_is_rank_by_rank(samples: Path) -> None:
    """Ranks reduced one at a time concatenate to all of them at once (what lets a worker hold
    one rank), with a 'rank' and 'step' row per rank and traced step, and the sync markers."""
    run = load_run(samples / "sample-train")
    events = job_trace_events(run, "bucketed-ws2-b1")
    whole = trace_lanes(events)
    parts = pd.concat([trace_lanes(events[events["rank"] == r]) for r in (0, 1)], ignore_index=True)
    pd.testing.assert_frame_equal(parts, whole, check_exact=True)
    steps = sorted(int(s) for s in events["step"].unique() if s >= 0)
    assert sorted(whole.loc[whole["lane"] == "step", "step"]) == sorted(steps * 2)
    assert (whole.groupby("rank")["lane"].apply(lambda x: (x == "rank").sum()) == 1).all()
    assert whole.loc[whole["lane"] == "sync", "name"].str.startswith("dpcore_clock_sync#").all()
    assert set(whole["lane"]) == {"rank", "sync", "step", "compute", "comm"}


def test_missing_or_broken_traces_fall_back_as_the_events_path(tmp_path: Path) -> None:
    """A job whose rank trace is missing or unreadable gives None and a problem line, as
    job_trace_events does: the Timeline then draws steps.csv and collectives.csv."""
    path = make_run(tmp_path / "profiles")
    run = load_run(path)
    f = run.trace_files("ring-ws2")["rank1"]
    f.write_bytes(b"not a trace")
    problems_cache: list[str] = []
    problems_events: list[str] = []
    assert job_lanes(run, "ring-ws2", problems=problems_cache) is None
    assert job_trace_events(run, "ring-ws2", problems=problems_events) is None
    assert len(problems_cache) == 1 and str(f) in problems_cache[0]
    f.unlink()
    problems_cache.clear()
    assert job_lanes(load_run(path), "ring-ws2", problems=problems_cache) is None
    assert "no trace for rank 1" in problems_cache[0]
    step = run.traced_steps("ring-ws2")[0]
    pd.testing.assert_frame_equal(timeline(run, "ring-ws2", step, lanes=None), timeline(run, "ring-ws2", step, None))


def _no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way a trace could be parsed raises from here on."""
    def refuse(*_a, **_k):
        raise AssertionError("a trace was parsed")
    monkeypatch.setattr(reduce, "read_trace_meta", refuse)


def test_a_cache_hit_parses_no_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = load_run(make_run(tmp_path / "profiles"))
    step = run.traced_steps("bucketed-ws2-b1")[0]
    want = timeline(run, "bucketed-ws2-b1", step, lanes_of(job_trace_events(run, "bucketed-ws2-b1")))
    run_trace_steps(run)  # the dashboard's first page: the eager tables only (lanes are lazy)
    job_lanes(run, "bucketed-ws2-b1")  # the Timeline's first open of the job: its lanes cached
    _no_parsing(monkeypatch)
    got = timeline(run, "bucketed-ws2-b1", step, lanes=job_lanes(run, "bucketed-ws2-b1"))
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert set(got.loc[got["lane"] == "compute", "name"]) == {"compute"}  # the trace's lanes, not steps.csv's
    with pytest.raises(AssertionError, match="a trace was parsed"):  # a miss would parse
        job_lanes(run, "bucketed-ws2-b1", scale=Scale(cache=False))


def test_timeline_page_on_a_cached_run_parses_no_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Timeline page (AppTest) draws a traced step's trace lanes with the reader refusing:
    every lane it draws came from the cache."""
    root = tmp_path / "profiles"
    run = load_run(make_run(root))
    run_trace_steps(run)
    for job in run.jobs["job_id"]:  # a first Timeline open of each job: its lanes cached
        job_lanes(run, str(job))
    _no_parsing(monkeypatch)
    monkeypatch.setenv("DPCORE_PROFILES", str(root))
    at = AppTest.from_file(APP, default_timeout=120).run()
    open_page(at, "Timeline")
    assert not problems(at), problems(at)
    for job in ("bucketed-ws2-b1", "ring-ws4"):
        next(s for s in at.selectbox if s.label == "Job").set_value(job).run()
        step = next(s for s in at.selectbox if s.label == "Step")
        assert step.value in run.traced_steps(job)
        assert not problems(at), problems(at)
        spec = at.get("plotly_chart")[0].proto.spec
        assert "forward" not in spec and "compute" in spec  # drawn from the trace's lanes
