"""Every read command and every dashboard page on the runs recorded on a GPU (``../shared/gpu/runs``:
an H200, NCCL at world size 1, bf16 where the framework chose it; see its README).

Why: those runs have shapes the CPU suite never makes (CUDA-event step times, kernels on several
streams, the user and imported jobs of ``dpcore.record``, the callbacks and ``trace_handler``), and
a reader that only ever saw CPU runs broke on them before. The runs are copied to a temporary
folder, so nothing is written beside the shared data. The tests skip, saying why, where the folder
is absent (a user's fresh clone).
"""
from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dpcore.cli import main
from dpcore.read import analysis as A
from dpcore.read.dashboard.pages import PAGES
from dpcore.read.dashboard.picker import fit_label
from dpcore.read.rundir import load_run
from tests.app_pages import data_problems, heading, open_page, problems
from tests.events_path import trace_step_metrics, traced_job_events

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT.parent / "shared" / "gpu"
RUNS = ("h200_variants_ws1", "h200_rec-gpu", "h200_th-gpu", "h200_pl-gpu-auto", "h200_pl-gpu-ddp", "h200_hf-gpu")

pytestmark = pytest.mark.skipif(not (GPU / "runs").is_dir(),
                                reason=f"{GPU / 'runs'} is absent (the GPU runs are not in a fresh clone)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu-runs")
    for name in RUNS:
        shutil.copytree(GPU / "runs" / name, out / name)
    return out


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _csv(text: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(text))


def _timed_median(run_dir: Path) -> dict[str, float]:
    """Per job, the median step time over steps.csv's timed rows (every row when none is timed: a
    trace import has only traced steps), the definition of T."""
    steps = pd.read_csv(run_dir / "steps.csv")
    out = {}
    for job, g in steps.groupby("job_id"):
        timed = g[~g["profiled"].astype(bool)]
        out[job] = float((timed if len(timed) else g)["step_ms"].median())
    return out


@pytest.mark.parametrize("name", RUNS)
def test_summarize_gives_the_timed_median_and_no_comm_at_world_size_1(runs, capsys, name):
    code, out, err = _cli(capsys, "summarize", str(runs / name), "--csv")
    assert code == 0, err
    df = _csv(out).set_index("job_id")
    done = df[df["status"] == "complete"]
    want = _timed_median(runs / name)
    # run.json's environment as recorded (h200_rec-gpu's says cpu: written before record saw the GPU)
    on_gpu = json.loads((runs / name / "run.json").read_text())["environment"]["device"] == "cuda"
    assert set(done.index) == set(want)
    for job, row in done.iterrows():
        assert row["step_ms"] == pytest.approx(want[job], abs=1e-3), job
        assert row["world_size"] == 1 and row["comm_ms"] == 0 and math.isnan(row["overlap_pct"]), job
        # both methods of a world-size-1 job see no communication: the trace, which covers the steps,
        # unless the profiler inflated the job's traced steps on a GPU (docs/DESIGN.md "GPU time"):
        # then the timed steps' intervals split T
        timed_split = row["trace_inflation"] > 1.2 and on_gpu
        assert row["comm_source"] == ("intervals" if timed_split else "trace"), job


def test_summarize_lists_the_skipped_jobs_with_their_reason(runs, capsys):
    code, out, _ = _cli(capsys, "summarize", str(runs / "h200_variants_ws1"), "--csv")
    df = _csv(out).set_index("job_id")
    assert code == 0 and df.loc["data_parallel-ws1", "status"] == "skipped"
    assert set(df.loc[df["status"] == "complete", "variant"]) == {
        "single", "manual", "naive", "flat", "central", "ring", "overlap", "bucketed", "torch_ddp", "zero1",
        "torch_zero1", "fsdp"}


@pytest.mark.parametrize("name", RUNS)
def test_analyze_reads_every_traced_job(runs, capsys, name):
    code, out, err = _cli(capsys, "analyze", str(runs / name), "--csv")
    assert code == 0, err
    df = _csv(out)
    run = load_run(runs / name)
    traced = {j for j in run.jobs["job_id"] if run.traced_steps(j)}
    assert set(df["job_id"]) == traced and (df["rank"] == 0).all()
    assert (df["comm_ms"] == 0).all() and df["overlap_pct"].isna().all()  # world size 1: no peer
    for _, r in df.iterrows():  # its steps are the job's traced steps, measured on the GPU's kernels
        assert r["steps"] == len(run.traced_steps(r["job_id"])) and r["compute_ms"] > 0, r["job_id"]
        assert 0 < r["compute_ms"] <= r["step_ms"], r["job_id"]


@pytest.mark.parametrize("name", RUNS)
def test_stragglers_and_hang_refuse_in_one_line(runs, capsys, name):
    code, out, err = _cli(capsys, "stragglers", str(runs / name))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "nothing to match" in err and "Traceback" not in err
    code, out, err = _cli(capsys, "hang", str(runs / name))
    assert code == 2 and "none of its jobs hung" in err and len(err.strip().splitlines()) == 1


def test_whatif_projects_a_world_size_1_job(runs, capsys):
    # a trace_handler run holds one imported job: not a job whatif replays, said in plain words
    code, _, err = _cli(capsys, "whatif", str(runs / "h200_th-gpu"), "--job", "imported-ws1")
    assert code == 2 and "job 'imported-ws1' is an imported job; whatif replays" in err
    run = runs / "h200_variants_ws1"
    # no all-reduce was timed at world size >= 2 (one GPU): alpha and B must be given
    code, _, err = _cli(capsys, "whatif", str(run), "--job", "torch_ddp-ws1-b25")
    assert code == 2 and "--latency-us and --bandwidth-gbps" in err
    code, out, err = _cli(capsys, "whatif", str(run), "--job", "torch_ddp-ws1-b25", "--bandwidth-gbps", "100",
                          "--latency-us", "10", "--world-sizes", "1,2,8", "--bucket-mb", "25", "--csv")
    assert code == 0, err
    df = _csv(out).set_index("world_size")
    assert list(df.index) == [1, 2, 8]
    t = _timed_median(run)["torch_ddp-ws1-b25"]
    assert df.loc[1, "measured_step_ms"] == pytest.approx(t, abs=1e-3)
    assert df.loc[1, "comm_ms"] == 0 and df.loc[2, "comm_ms"] > 0 and df.loc[8, "comm_ms"] > df.loc[2, "comm_ms"]
    # the ring's alpha-beta cost per bucket: 2(N-1) messages of alpha, 2(N-1)/N of its bytes over B
    alpha_ms, n_buckets = 10e-3, int(df.loc[2, "buckets"])
    bytes_over_b = df.loc[2, "comm_ms"] - n_buckets * 2 * alpha_ms  # N = 2: factor 1
    assert bytes_over_b > 0
    assert df.loc[8, "comm_ms"] == pytest.approx(n_buckets * 14 * alpha_ms + 2 * 7 / 8 * bytes_over_b, abs=1e-3)


@pytest.mark.parametrize("name", RUNS)
def test_import_reads_each_runs_traces(runs, capsys, tmp_path, name):
    run = load_run(runs / name)
    for job in (j for j in run.jobs["job_id"] if run.traced_steps(j)):
        code, out, err = _cli(capsys, "import", str(runs / name / "traces" / job), "--out", str(tmp_path / job))
        assert code == 0, (job, err)
        assert out.startswith("imported 1 rank(s), "), (job, out)
        got = load_run(next((tmp_path / job).iterdir()))
        assert sorted(got.steps["step"].unique()) == run.traced_steps(job), job


def test_timeline_labels_agree_on_world_size_1_runs(runs):
    """Every step's rank rows name the method the job's row names (both: the trace)."""
    for name in RUNS:
        run = load_run(runs / name)
        rows = A.step_metrics(run.steps, run.collectives, trace_step_metrics(traced_job_events(run)),
                              run.comm_calls)
        jobs = A.job_metrics(rows).set_index("job_id")
        for job in (j for j in jobs.index if run.traced_steps(j)):
            for step in run.traced_steps(job):
                for source in (None, jobs.loc[job, "comm_source"]):
                    got = A.step_ranks(rows, job, step, source)
                    assert set(got["source"]) == {jobs.loc[job, "comm_source"]} == {"trace"}, (name, job, step)


def test_every_page_renders_on_every_gpu_run(runs, monkeypatch):
    monkeypatch.setenv("DPCORE_PROFILES", str(runs))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300).run()
    ids = {json.loads((runs / n / "run.json").read_text())["run_id"] for n in RUNS}
    # the picker shows each run id whole, or cut in the middle where it would not fit the sidebar
    assert set(at.sidebar.selectbox(key="run_a").options) == {fit_label(i) for i in ids}
    for i, run_id in enumerate(at.sidebar.selectbox(key="run_a").options):  # its label: the id, maybe cut
        at.sidebar.selectbox(key="run_a").select_index(i).run()
        for page in PAGES:
            open_page(at, page.title)
            assert heading(at) == page.title, (run_id, page.title)
            assert not problems(at), (run_id, page.title, problems(at))
            assert not data_problems(at), (run_id, page.title, data_problems(at))
            if page.title == "Timeline" and at.dataframe:
                sources = {str(s).split(" ")[0] for s in at.dataframe[0].value["source"]}
                assert sources == {"trace"}, (run_id, sources)


@pytest.mark.parametrize("name", ["h200_variants_ws1", "h200_pl-gpu-auto"])
def test_summarize_has_step_mfu_only_where_flops_are_known(runs, capsys, name):
    """These runs were recorded without shapes: FLOPs coverage 0 %, so no step MFU and no GEMM
    efficiency (an empty cell, never a 0 % or a guess); the idle share is the ledger's."""
    code, out, err = _cli(capsys, "summarize", str(runs / name), "--csv")
    assert code == 0, err
    df = _csv(out)
    done = df[df["status"] == "complete"]
    assert {"gpu_step_mfu_pct", "gemm_eff_pct", "flops_coverage_pct"} <= set(df.columns)
    assert (done["flops_coverage_pct"] == 0).all()
    assert done["gpu_step_mfu_pct"].isna().all() and done["gemm_eff_pct"].isna().all()
    assert done["gpu_idle_pct"].notna().all()
