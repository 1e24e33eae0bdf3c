"""The committed GPU sample (profiles/sample-gpu, three jobs of an H200 run cut by
scripts/make_gpu_sample.py): it loads, its ledger is the recording's, and `summarize` and `gpu` read it.

Why: the other samples were recorded on CPUs, so a fresh clone's GPU page was empty and every GPU
view test skipped. The known answers are ../shared/gpu/README.md's ledger of the recording
(single-ws1: idle 4.28 %, compute 95.50 %, non-compute 0.22 %; torch_ddp-ws1-b25: 5.21 / 93.51 / 1.28).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dpcore.cli import main
from dpcore.read.rundir import load_run
from dpcore.read.tables import run_gpu
from tests.read.dashboard.gpu_runs import SAMPLE_GPU

pytestmark = pytest.mark.skipif(not (SAMPLE_GPU / "run.json").is_file(), reason=f"{SAMPLE_GPU} is absent")


def test_the_gpu_sample_loads_with_the_recorded_ledger(samples: Path) -> None:
    run = load_run(samples / "sample-gpu", root=samples)
    env = run.meta["environment"]
    assert (env["device"], env["backend"], env["devices"]) == ("cuda", "nccl", ["NVIDIA H200"])
    assert [j["id"] for j in run.meta["jobs"]] == ["single-ws1", "torch_ddp-ws1-b25", "data_parallel-ws1", "fsdp-ws1"]
    for job in ("single-ws1", "torch_ddp-ws1-b25", "fsdp-ws1"):
        assert set(run.trace_files(job)) == {"rank0"}, job
    whole = run_gpu(run)[0].query("window == 'trace' and rank == 0").set_index("job_id")
    pct = 100 * whole[["idle_ms", "compute_ms", "non_compute_ms"]].div(whole["span_ms"], axis=0)
    assert pct.loc["single-ws1"].tolist() == pytest.approx([4.28, 95.50, 0.22], abs=0.006)
    assert pct.loc["torch_ddp-ws1-b25"].tolist() == pytest.approx([5.21, 93.51, 1.28], abs=0.006)
    assert pct.loc["fsdp-ws1"].tolist() == pytest.approx([46.36, 52.84, 0.79], abs=0.006)
    files = [p for p in (samples / "sample-gpu").rglob("*") if p.is_file()]
    assert max(p.stat().st_size for p in files) < 5 * 1024 * 1024


@pytest.mark.slow
def test_summarize_and_gpu_read_the_gpu_sample(samples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summarize", str(samples / "sample-gpu")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sample-gpu (complete)") and "data_parallel-ws1  skipped" in out
    assert main(["gpu", str(samples / "sample-gpu")]) == 0
    out = capsys.readouterr().out
    assert "single-ws1 rank 0" in out and "fsdp-ws1 rank 0" in out


@pytest.mark.slow
def test_gpu_prints_every_table_asked_and_one_line_for_missing_collectives(
        samples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sample-gpu has no collective call in its traces (one rank): `gpu --per-step --kernels
    --collectives` printed only "no collective calls" and lost the other two tables."""
    path = str(samples / "sample-gpu")
    assert main(["gpu", path, "--per-step", "--kernels", "--collectives"]) == 0
    out = capsys.readouterr().out
    assert main(["gpu", path, "--per-step"]) == 0
    per_step = capsys.readouterr().out.rstrip("\n")
    assert main(["gpu", path, "--kernels"]) == 0
    kernels = capsys.readouterr().out.rstrip("\n")
    assert out.rstrip("\n") == f"{per_step}\n\n{kernels}\n\ncollectives: no collective calls in the traces at {path}"
    assert main(["gpu", path, "--collectives"]) == 2  # asked alone: the one-line error, as before
    assert "no collective calls" in capsys.readouterr().err
