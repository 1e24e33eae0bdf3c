"""gloo over CUDA tensors: a GPU trace whose communication is gloo's host spans, not NCCL kernels.

``tests/data/shape_gloo_cuda_2r`` (written by ``tests/data/make_shapes.py``, whose ``gloo_cuda``
docstring works the answers out by hand) has that shape with round numbers; the real one,
``../shared/gpu/traces/h200_ddp_gloo_cuda_2r`` (2 ranks sharing an H200, DDP over gloo with CUDA
tensors), is read when present.
"""
from __future__ import annotations

import io
import shutil
from pathlib import Path

import pandas as pd
import pytest

from dpcore.read.importer.write_run import import_traces
from dpcore.read.report.analyze import analyze
from dpcore.read.report.stragglers import stragglers_text
from dpcore.read.rundir import load_run
from tests.trace_helpers import read_trace_dir

pytestmark = pytest.mark.usefixtures("scan_path")  # each test: a cache of its own

DATA = Path(__file__).resolve().parents[2] / "data"
SHAPE = DATA / "shape_gloo_cuda_2r"
REAL = Path(__file__).resolve().parents[3].parent / "shared" / "gpu" / "traces" / "h200_ddp_gloo_cuda_2r"


def _csv(text: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(text))


def near(v: float):
    return pytest.approx(v, abs=1e-3)


def test_gloo_spans_on_the_workers_are_the_comm_of_a_gpu_trace():
    ev = read_trace_dir(SHAPE)
    spans = ev[ev["name"] == "gloo:all_reduce"]
    worker = spans[spans["category"] == "user_annotation"]
    assert len(worker) == 12 and set(worker["kind"]) == {"comm"}
    # the profiler's copies on the device timeline are not gloo's work
    assert set(spans.loc[spans["category"] == "gpu_user_annotation", "kind"]) == {"other"}
    assert set(ev.loc[ev["category"] == "gpu_memcpy", "kind"]) == {"memcpy"}
    assert set(ev.loc[ev["category"] == "kernel", "kind"]) == {"compute"}


def test_analyze_measures_gloo_comm_against_the_compute_kernels():
    df = _csv(analyze(str(SHAPE), csv=True)).set_index("rank")
    assert list(df.index) == [0, 1]
    assert df["steps"].tolist() == [3, 3] and df["step_ms"].tolist() == pytest.approx([51.2, 51.2], abs=1e-3)
    assert df.loc[0, "comm_ms"] == near(36.0) and df.loc[1, "comm_ms"] == near(30.0)
    assert df.loc[0, "compute_ms"] == near(25.0) and df.loc[1, "compute_ms"] == near(31.0)
    assert df.loc[0, "exposed_comm_ms"] == near(26.2) and df.loc[1, "exposed_comm_ms"] == near(20.2)
    assert df.loc[0, "overlap_pct"] == near(100 * 9.8 / 36) and df.loc[1, "overlap_pct"] == near(100 * 9.8 / 30)


def test_stragglers_match_gloo_collectives_by_their_enqueue():
    text = stragglers_text(str(SHAPE))
    assert "6 collectives matched on 2 ranks (gloo:all_reduce)" in text
    assert "no enqueue" not in text  # every worker span linked to its c10d::allreduce_
    assert "rank 1 arrived last in 100% of 6 collectives; others waited 6 ms on average" in text
    df = _csv(stragglers_text(str(SHAPE), csv=True)).set_index("rank")
    assert df.loc[0, "mean_wait_ms"] == near(6.0) and df.loc[1, "mean_wait_ms"] == near(0.0)


def test_import_writes_the_gloo_collectives(tmp_path):
    got = import_traces(SHAPE, tmp_path / "profiles", "gloo-cuda")
    coll = load_run(got.run_dir).collectives
    assert len(coll) == 12 and set(coll["op"].str.replace(r"\s*#.*", "", regex=True)) <= {"gloo:all_reduce",
                                                                                           "all_reduce"}
    r0 = coll[coll["rank"] == 0].sort_values("t_launch_ns")
    r1 = coll[coll["rank"] == 1].sort_values("t_launch_ns")
    # arrival = the enqueue; rank 1 enqueues 6 ms after rank 0, every time
    assert (r1["t_launch_ns"].to_numpy() - r0["t_launch_ns"].to_numpy()).tolist() == pytest.approx([6e6] * 6)


@pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} is absent (the GPU traces are not in a fresh clone)")
def test_the_real_gloo_cuda_trace(tmp_path):
    src = tmp_path / "h200"
    shutil.copytree(REAL, src)
    df = _csv(analyze(str(src), csv=True)).set_index("rank")
    assert list(df.index) == [0, 1] and (df["steps"] == 3).all()
    # 8 Linear(2048) gradients (134 MB) through the host every step: most of the ~63 ms step
    assert (df["comm_ms"] > 50).all() and (df["comm_ms"] < df["step_ms"]).all()
    assert (df["overlap_pct"] > 0).all() and (df["compute_ms"] > 0).all()
    text = stragglers_text(str(src))
    assert "24 collectives matched on 2 ranks (gloo:all_reduce)" in text
    assert "no enqueue" not in text
    coll = load_run(import_traces(src, tmp_path / "profiles", "h200").run_dir).collectives
    assert coll.groupby("rank").size().to_dict() == {0: 24, 1: 24}
    assert (coll["t_launch_ns"] <= coll["t_start_ns"]).all()  # arrival: the enqueue, before gloo's worker starts


def test_the_timeline_draws_gloo_comm_of_both_ranks(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dpcore.read import analysis as A
    from dpcore.read import tables as K
    from tests.app_pages import ROOT, open_page, problems
    from tests.events_path import trace_step_metrics, traced_job_events

    got = import_traces(SHAPE, tmp_path / "profiles", "gloo-cuda")
    run = load_run(got.run_dir)
    job = "imported-ws2"
    assert run.traced_steps(job) == [1, 2, 3]
    t = A.timeline(run, job, 2, lanes=K.job_lanes(run, job, ranks=(0, 1)))
    comm = t[t["lane"] == "comm"]
    assert set(comm["name"]) == {"gloo:all_reduce"} and set(comm["op"]) == {"all_reduce"}
    # ms from the step's start: a GPU step's first kernel, 1 ms after its ProfilerStep (the import's
    # GPU step is the window the numbers are measured in): the worker spans of the docstring
    assert comm[["rank", "start_ms", "end_ms"]].round(3).values.tolist() == [
        [0, 10.2, 36.2], [0, 20.2, 46.2], [1, 16.2, 36.2], [1, 26.2, 46.2]]
    rows = A.step_metrics(run.steps, run.collectives, trace_step_metrics(traced_job_events(run)), run.comm_calls)
    assert A.step_ranks(rows, job, 2)["comm_ms"].tolist() == pytest.approx([36.0, 30.0])
    monkeypatch.setenv("DPCORE_PROFILES", str(tmp_path / "profiles"))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    open_page(at, "Timeline")
    assert not problems(at), problems(at)
    assert {str(s).split(" ")[0] for s in at.dataframe[0].value["source"]} == {"trace"}
    assert at.dataframe[0].value["comm_ms"].iloc[:2].round(3).tolist() == [36.0, 30.0]
