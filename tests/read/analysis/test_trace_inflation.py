"""The profiler's own effect (metrics.job_metrics' trace_inflation) on hand-made steps, and
summarize's GPU columns on the GPU runs in ../shared/gpu (skipped where absent)."""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from dpcore.read.analysis.metrics import INFLATION_LIMIT, job_metrics, step_metrics
from dpcore.read.report.gpu import gpu_text
from dpcore.read.report.summarize import summarize

GPU_RUNS = Path(__file__).resolve().parents[3].parent / "shared" / "gpu" / "runs"
needs_gpu_runs = pytest.mark.skipif(not GPU_RUNS.is_dir(), reason="../shared/gpu (GPU runs) is not beside the checkout")


def _step(job: str, step: int, bwd: float, profiled: bool) -> dict:
    return dict(job_id=job, variant="single", world_size=1, bucket_mb=25.0, rank=0, step=step, profiled=profiled,
                t_start_ns=step * 10**9, step_ms=10 + bwd + 5 + 5, fwd_ms=10.0, bwd_ms=bwd, sync_ms=5.0, opt_ms=5.0,
                comm_ms=0.0, comm_ops=0, comm_bytes=0, samples=8)


def test_inflated_job_is_flagged_and_split_by_its_timed_steps() -> None:
    # timed steps: 40 ms of which 35 compute (fwd 10 + bwd 20 + opt 5; sync 5 is not compute).
    # job "slow": traced steps of 60 ms (bwd 40): 1.5x > 1.2 -> inflated, compute = 35 of the timed
    # steps (the traced share, 55/60 of 40 = 36.67 ms, is not used). job "even": traced 44 ms (bwd 24):
    # 1.1x -> not inflated, compute = 40 * 39/44 from the traced steps' share.
    steps = pd.DataFrame([_step(j, k, 20.0, False) for j in ("slow", "even") for k in range(4)]
                         + [_step("slow", k, 40.0, True) for k in (4, 5)]
                         + [_step("even", k, 24.0, True) for k in (4, 5)])
    rows = step_metrics(steps, pd.DataFrame())
    out = job_metrics(rows, timed_split=["slow", "even"]).set_index("job_id")  # both GPU jobs
    assert out.loc["slow", "trace_inflation"] == pytest.approx(1.5)
    assert out.loc["even", "trace_inflation"] == pytest.approx(1.1)
    assert out["inflated"].to_dict() == {"slow": True, "even": False}
    assert out.loc["slow", "compute_ms"] == pytest.approx(35.0)
    assert out.loc["even", "compute_ms"] == pytest.approx(40 * 39 / 44)
    assert (out["step_ms"] == 40).all() and INFLATION_LIMIT == 1.2
    # a CPU job (not in timed_split) is flagged too, but keeps the traced shares
    cpu = job_metrics(rows).set_index("job_id")
    assert cpu["inflated"].to_dict() == {"slow": True, "even": False}
    assert cpu.loc["slow", "compute_ms"] == pytest.approx(40 * 55 / 60)


@needs_gpu_runs
def test_only_fsdp_is_inflated_and_gpu_columns_match_the_gpu_command() -> None:
    run = GPU_RUNS / "h200_variants_ws1"
    s = pd.read_csv(io.StringIO(summarize(str(run), csv=True)))
    flagged = s.loc[s["trace_inflation"] > INFLATION_LIMIT, "job_id"].tolist()
    assert flagged == ["fsdp-ws1"]
    assert s.set_index("job_id").loc["fsdp-ws1", "trace_inflation"] == pytest.approx(104.45 / 61.57, abs=0.01)
    ledger = pd.read_csv(io.StringIO(gpu_text(str(run), csv=True))).set_index("job_id")
    traced = s.dropna(subset=["gpu_idle_pct"]).set_index("job_id")
    assert len(traced) == 12  # the two skipped jobs have no traces
    for job, row in traced.iterrows():  # one value per metric: summarize shows the gpu command's number
        assert row["gpu_idle_pct"] == pytest.approx(ledger.loc[job, "idle_pct"], abs=1e-3)
        assert str(row["host_bound"]) == "False"


@needs_gpu_runs
@pytest.mark.parametrize("run", ["h200_rec-gpu", "h200_th-gpu", "h200_pl-gpu-auto", "h200_pl-gpu-ddp", "h200_hf-gpu"])
def test_summarize_calls_the_mlp_runs_host_bound(run: str) -> None:
    s = pd.read_csv(io.StringIO(summarize(str(GPU_RUNS / run), csv=True)))
    assert s["host_bound"].astype(str).tolist() == ["True"] and (s["gpu_idle_pct"] > 85).all()
