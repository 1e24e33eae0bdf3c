"""The Timeline reduces lanes for the steps it draws, never for every traced step.

Why: the lanes used to be a cached per-rank table of every traced step, built at the first read;
on a GPU rank that is ~0.15 s a step, 75 minutes for a 30,000-step trace, for one step drawn.
Now the cache keeps the rank's lane events (:data:`LANE_EVENTS_TABLE`) and the lanes are
reduced for the steps asked. These tests pin (a) that the lanes of the steps asked are exactly
the old full computation's rows of those steps (on the committed sample's traces and on the
H200 GPU traces), and (b) on a made 30,000-step GPU trace, that the steps reduced are the steps
asked (counted, not timed), at the first read and at a later visit, which parses no trace.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.read.analysis import lanes as lanes_mod
from dpcore.read.analysis.lanes import LANE_EVENTS_TABLE, lane_events, trace_lanes
from dpcore.read.analysis.timeline import timeline
from dpcore.read.ranks import Scale, reduce
from dpcore.read.rundir import load_run
from dpcore.read.tables import folder_tables, job_lanes
from dpcore.read.traces.reader import read_trace
from tests.events_path import job_trace_events
from tests.read.ranks.long_trace import PERIOD_US, write_long_trace

STEPS = 30_000
GPU_TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "gpu" / "traces" / "h200_ddp_gloo_cuda_2r"


def _of_steps(full: pd.DataFrame, steps: list[int]) -> pd.DataFrame:
    """The old full lanes table's rows of ``steps`` and its per-rank rows (step -1: rank, sync)."""
    return full[full["step"].isin([-1, *steps])].reset_index(drop=True)


def test_lanes_of_the_steps_asked_are_the_full_tables_rows_on_the_sample(samples: Path, tmp_path: Path) -> None:
    run_dir = shutil.copytree(samples / "sample-train", tmp_path / "sample-train")
    run = load_run(run_dir)
    compared = 0
    for job in ("bucketed-ws2-b1", "torch_ddp-ws2-b25", "zero1-ws2-b1", "ring-ws1"):
        events = job_trace_events(run, job)
        full = trace_lanes(events)  # the old computation: every traced step
        (step,) = run.traced_steps(job)
        for scale in (Scale(cache=False, workers=1), Scale(workers=1), Scale(workers=1)):  # no cache, miss, hit
            got = job_lanes(run, job, steps=[step], scale=scale)
            pd.testing.assert_frame_equal(got, _of_steps(full, [step]), check_exact=True)
            pd.testing.assert_frame_equal(timeline(run, job, step, lanes=got), timeline(run, job, step, full),
                                          check_exact=True)
            compared += len(got)
        # no step asked: the per-rank rows only (the rank's extent and its clock-sync markers)
        none = job_lanes(run, job, steps=[])
        assert set(none["lane"]) == {"rank", "sync"} and (none["step"] == -1).all()
        assert len(none) == len(full[full["step"] == -1])
    assert compared > 200
    # a known value of the sample: bucketed-ws2-b1's step 11, rank 0, its 'step' row
    row = job_lanes(run, "bucketed-ws2-b1", ranks=(0,), steps=[11]).query("lane == 'step'")
    full0 = trace_lanes(job_trace_events(run, "bucketed-ws2-b1", ranks=(0,)))
    assert len(row) == 1 and row["start_us"].iloc[0] == full0.query("lane == 'step' and step == 11")["start_us"].iloc[0]


@pytest.mark.skipif(not GPU_TRACES.is_dir(), reason="../shared/gpu/traces/h200_ddp_gloo_cuda_2r is absent")
def test_lane_events_give_the_full_lanes_of_each_step_of_a_gpu_trace(tmp_path: Path) -> None:
    """An H200 trace (DDP over gloo with CUDA tensors, three steps): the cached table, reduced
    step by step, is the full computation's rows of that step, launch threads and streams too."""
    traces = shutil.copytree(GPU_TRACES, tmp_path / "gpu")
    for f, t in zip(sorted(traces.iterdir()), folder_tables(traces, Scale(workers=1), need=(LANE_EVENTS_TABLE,))):
        full = trace_lanes(read_trace(f))
        steps = sorted(int(s) for s in full.loc[full["step"] >= 0, "step"].unique())
        assert len(steps) >= 3 and any(full["lane"].str.startswith("stream ")), f
        pd.testing.assert_frame_equal(trace_lanes(t[LANE_EVENTS_TABLE]), full, check_exact=True)
        for s in steps:
            pd.testing.assert_frame_equal(trace_lanes(t[LANE_EVENTS_TABLE], [s]), _of_steps(full, [s]),
                                          check_exact=True)


@pytest.fixture(scope="module")
def long_run(samples: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A copy of the sample run whose one-rank job ``zero1-ws1-b0.25`` has a 30,000-step GPU trace."""
    run_dir = shutil.copytree(samples / "sample-train", tmp_path_factory.mktemp("long") / "sample-train")
    job = "zero1-ws1-b0.25"
    write_long_trace(run_dir / "traces" / job / "rank0.json.gz", STEPS)
    return run_dir, job


class _Counted:
    """gpu_lanes, counting the (rank, step)s it reduces; past ``cap`` it fails (the old code
    reduced every step: the test then fails in seconds, not minutes)."""

    def __init__(self, cap: int) -> None:
        self.calls, self.cap, self.real = 0, cap, lanes_mod.gpu_lanes

    def __call__(self, ev: pd.DataFrame):
        self.calls += 1
        if self.calls > self.cap:
            raise AssertionError(f"more than {self.cap} steps reduced to lanes")
        return self.real(ev)


def test_a_30000_step_trace_reduces_only_the_steps_asked(long_run: tuple[Path, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, job = long_run
    run = load_run(run_dir)
    counted = _Counted(cap=10)
    monkeypatch.setattr(lanes_mod, "gpu_lanes", counted)
    got = job_lanes(run, job, steps=[5, STEPS - 1], scale=Scale(workers=1))  # the first read: a miss
    assert counted.calls == 2
    assert sorted(got.loc[got["step"] >= 0, "step"].unique()) == [5, STEPS - 1]
    t = 1_000_000.0 + 5 * PERIOD_US
    s5 = got[got["step"] == 5]
    spans = {lane: list(zip(g["name"], g["start_us"] - t, g["end_us"] - t)) for lane, g in s5.groupby("lane")}
    assert spans == {
        "step": [("", 0.0, 90.0)],
        "compute": [("compute", 10.0, 35.0)],
        "comm": [("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 45.0, 75.0)],
        "thread 4242": [("aten::mm", 2.0, 32.0), ("cudaLaunchKernel", 40.0, 44.0)],
        "stream 7": [("ampere_sgemm_128x64_nn", 10.0, 35.0)],
        "stream 13": [("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 45.0, 75.0)],
    }
    rank_row = got[got["lane"] == "rank"]
    last_end = 1_000_000.0 + (STEPS - 1) * PERIOD_US + 90
    assert rank_row[["start_us", "end_us"]].values.tolist() == [[1_000_000.0, last_end]]

    # a later visit to other steps: from the cache, no trace parsed, those steps only
    def refuse(*_a, **_k):
        raise AssertionError("a trace was parsed")
    monkeypatch.setattr(reduce, "read_trace_meta", refuse)
    counted.calls = 0
    again = job_lanes(load_run(run_dir), job, steps=[12_345])
    assert counted.calls == 1
    s = again[again["step"] == 12_345]
    assert np.allclose(s.loc[s["lane"] == "stream 7", ["start_us", "end_us"]].to_numpy() - 12_345 * PERIOD_US,
                       [[1_000_010.0, 1_000_035.0]])


def test_the_timeline_page_reduces_the_drawn_step_only(long_run: tuple[Path, str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's lanes of a traced step of the 30,000-step job reduce that step alone (the old
    page read the job's lanes of every step first)."""
    from dpcore.read.dashboard import data
    from dpcore.read.dashboard.pages import timeline as page

    run_dir, job = long_run
    run = load_run(run_dir)
    counted = _Counted(cap=10)
    monkeypatch.setattr(lanes_mod, "gpu_lanes", counted)
    (step,) = run.traced_steps(job)
    page.lanes(run, data.key(run), job, step, (0,))
    assert counted.calls == 1


def test_lane_events_keep_what_the_lanes_read(samples: Path) -> None:
    """The cached table is the traced steps' events, the sync markers and the extent's two
    events, in their order: its lanes are the events' lanes, row for row."""
    run = load_run(samples / "sample-train")
    ev = job_trace_events(run, "torch_ddp-ws2-b25", ranks=(1,))
    kept = lane_events(ev, {})
    assert 0 < len(kept) <= len(ev) and kept.index.is_monotonic_increasing
    assert set(kept.columns) == set(LANE_EVENTS_TABLE.dtypes)
    pd.testing.assert_frame_equal(trace_lanes(LANE_EVENTS_TABLE.typed(kept)), trace_lanes(ev), check_exact=True)


def test_a_lanes_miss_does_not_rebuild_the_eager_tables_the_cache_holds(samples: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard's first page caches every trace's eager tables (the overlap of each step:
    ~1 ms a step, 27 s for 30,000 steps); the Timeline's first read of a job then builds its lane
    events alone, not the eager tables again. A trace without them still gets them."""
    from dpcore.read.ranks import pool
    from dpcore.read.tables import run_trace_steps

    run = load_run(shutil.copytree(samples / "sample-train", tmp_path / "sample-train"))
    built: list[tuple[str, ...]] = []
    real = pool._reduce

    def spy(path: str, only: bool, tables: tuple):
        built.append(tuple(t.name for t in tables))
        return real(path, only, tables)
    monkeypatch.setattr(pool, "_reduce", spy)
    assert job_lanes(run, "single-ws1", steps=[11], scale=Scale(workers=1)) is not None  # nothing cached yet
    assert built == [("overlap", "comm", "lane_events")]
    run_trace_steps(run, Scale(workers=1))
    built.clear()
    job_lanes(run, "ring-ws2", steps=[11], scale=Scale(workers=1))
    assert built == [("lane_events",), ("lane_events",)]
