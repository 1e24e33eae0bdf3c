"""What a newcomer met on the views: compare mode listing "float32 vs fp32" as a difference and
two rows both labelled "torch_ddp ×2"; Live's p90 with the profiled steps in it; a 1-rank GPU
job's Timeline drawing all-reduce boxes while its cards say comm 0.00 ms, on an axis starting
before the step; the Runs page saying "model None", "CPU cores ?" and one device name 8 times.
Each test fails on the behaviour reported.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.read.analysis.live import job_rows, rank_stats
from dpcore.read.dashboard.compare import config_diff, dtype_name, ratio_table
from dpcore.read.dashboard.pages.live import timed_rows
from dpcore.read.dashboard.pages.runs import NOT_RECORDED, devices_text, known, model_text
from dpcore.read.plots.timeline import timeline_figure


def test_compare_reads_one_dtype_under_its_spellings() -> None:
    assert [dtype_name(d) for d in ("fp32", "float32", "torch.float32", "FP32", "bf16", "fp16", "auto")] == [
        "float32", "float32", "float32", "float32", "bfloat16", "float16", "auto"]
    a = {"config": {"dtype": "float32", "compute_dtype": "bf16", "steps": 10}}
    b = {"config": {"dtype": "fp32", "compute_dtype": "bfloat16", "steps": 12}}
    assert config_diff({"A": a, "B": b}).to_dict("records") == [{"setting": "config.steps", "A": "10", "B": "12"}]


def test_compare_pairs_jobs_by_id_and_labels_a_comm_hook_twin_apart() -> None:
    """A run with torch_ddp-ws2-b25 and its fp16 twin: pairing on (variant, world size, bucket)
    alone crossed them (4 rows, two labels 'torch_ddp ×2' twice); by job id: 2 rows, told apart."""
    sa = pd.DataFrame(dict(job_id=["torch_ddp-ws2-b25", "torch_ddp-ws2-b25-fp16"], variant="torch_ddp",
                           world_size=2, bucket_mb=25.0, step_ms=[10.0, 8.0], exposed_ms=[2.0, 1.0]))
    t = ratio_table({"A": sa, "B": sa.assign(step_ms=[15.0, 4.0])})
    assert t["job"].tolist() == ["torch_ddp ×2", "torch_ddp ×2 · fp16"]
    assert t["T: B/A"].tolist() == [1.5, 0.5]


def test_live_stats_leave_the_profiled_steps_out() -> None:
    """Rank 0's timed steps take 10-19 ms, its two profiled steps 100 ms: the p90 of the timed
    steps is 18.1 ms (with the profiled ones in the window it was 91.9 ms)."""
    live = pd.DataFrame(dict(job_id="j", rank=0, step=range(12), profiled=[False] * 10 + [True] * 2,
                             step_ms=[10.0 + i for i in range(10)] + [100.0, 100.0], comm_ms=np.nan,
                             exposed_comm_ms=np.nan, wall_time=range(12)))
    assert rank_stats(job_rows(live, "j"))["step_ms_p90"].iloc[0] == pytest.approx(91.9)  # before
    stats = rank_stats(job_rows(timed_rows(live), "j"))
    assert stats["step_ms_p90"].iloc[0] == pytest.approx(18.1) and stats["steps"].iloc[0] == 10


def test_runs_page_text_never_says_none_or_question_mark() -> None:
    assert devices_text(["NVIDIA H200"] * 8) == "8 × NVIDIA H200"
    assert devices_text(["NVIDIA H200", "NVIDIA H200", "NVIDIA A100"]) == "2 × NVIDIA H200, NVIDIA A100"
    assert devices_text(None, "cpu") == "cpu" and devices_text([], None) == NOT_RECORDED
    assert model_text({"model": None}) == NOT_RECORDED and model_text({"model": "mlp", "width": 256}) == "mlp width 256"
    assert known(None) == NOT_RECORDED and known(16) == "16"


def test_timeline_leaves_out_dpcores_clock_markers() -> None:
    """The markers ran before the step (start −0.68 ms on the GPU sample): the axis starts with the step's work."""
    rows = pd.DataFrame(dict(rank=0, lane=["thread 1", "stream 7", "thread 1"],
                             name=["dpcore_clock_sync#0", "gemm", "aten::mm"], op="", kind=["cpu", "compute", "cpu"],
                             start_ms=[-4.0, 0.2, 0.1], end_ms=[-3.9, 5.0, 4.0]))
    fig = timeline_figure(rows)
    starts = [float(b) for t in fig.data for b in t.base]
    assert min(starts) == pytest.approx(0.1)
    assert not any("dpcore_clock_sync" in str(c[0]) for t in fig.data for c in t.customdata)


@pytest.mark.slow
def test_a_one_rank_gpu_jobs_timeline_draws_no_comm(samples: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sample-gpu's torch_ddp-ws1-b25: its collectives.csv has 13 all-reduce calls a step, of
    one rank (no peer: comm 0 on the cards). The Timeline draws no all-reduce box for them."""
    from streamlit.testing.v1 import AppTest

    from tests.app_pages import APP, open_page, problems
    if not (samples / "sample-gpu").is_dir():
        pytest.skip("the sample run sample-gpu is absent")
    monkeypatch.setenv("DPCORE_PROFILES", str(samples))
    at = AppTest.from_file(APP, default_timeout=180).run()
    at.sidebar.selectbox(key="run_a").set_value("sample-gpu").run()
    open_page(at, "Timeline")
    at.selectbox(key=f"tl-job-{(samples / 'sample-gpu').resolve()}").set_value("torch_ddp-ws1-b25").run()
    assert not problems(at)
    spec = at.get("plotly_chart")[0].proto.spec
    assert "all-reduce" not in spec and "stream" in spec
    assert any("At 1 rank a collective has no peer" in c.value for c in at.caption)
    comm = next(m for m in at.metric if m.label.startswith("comm C"))
    assert comm.value == "0.00 ms"


def test_a_run_label_fits_the_picker_by_width_not_only_by_count() -> None:
    """30 characters did not always fit the picker's 190 px: "interrupted · 2026120…300-cc4b"
    is 190.2 px in Chromium, a run id of capitals and m/w 256 px. Labels are cut by their width
    in the picker's font (label_px: within 3 % of Chromium's canvas on these strings)."""
    from dpcore.read.dashboard.picker import LABEL_PX, label_px, run_labels

    assert label_px("20261201-185634-mi300-cc4b") == pytest.approx(173.6, rel=0.03)
    assert label_px("ABCDEFGHIJKLMNOPQRSTUVWXYZ") == pytest.approx(206.1, rel=0.03)
    runs = pd.DataFrame(dict(run_id=["20261201-185634-mi300-cc4b", "20261201-185635-WWWWMMMMwwwwmmmm-x", "s"],
                             path=["/p/a", "/p/b", "/p/c"], status=["interrupted", "complete", "complete"]))
    labels = run_labels(runs)
    assert labels["a"].startswith("interrupted · 2026") and labels["a"].endswith("cc4b")
    assert labels["b"].startswith("2026") and labels["b"].endswith("-x") and "…" in labels["b"]
    assert labels["c"] == "s" and all(label_px(v) <= LABEL_PX for v in labels.values())
