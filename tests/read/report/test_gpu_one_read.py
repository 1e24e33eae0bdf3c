"""``dpcore gpu --per-step --kernels`` reads its path once: the ledger and the kernel classes come
from one load of the rank tables (a read of a 1,024-rank job's traces is the command's cost)."""
from __future__ import annotations

from pathlib import Path

import pytest

from dpcore.read.report import gpu as report_gpu
from dpcore.read.report.gpu import gpu_tables, gpu_text

DATA = Path(__file__).resolve().parents[2] / "data"
TRACE = DATA / "gpu_ledger_rank0.json.gz"


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of GPU tables the gpu command makes (folder_gpu and run_gpu, counted)."""
    got: list[str] = []
    real_folder, real_run = report_gpu.folder_gpu, report_gpu.run_gpu

    def folder(*a, **k):
        got.append("folder")
        return real_folder(*a, **k)

    def run(*a, **k):
        got.append("run")
        return real_run(*a, **k)

    monkeypatch.setattr(report_gpu, "folder_gpu", folder)
    monkeypatch.setattr(report_gpu, "run_gpu", run)
    return got


def test_per_step_and_kernels_read_the_trace_once(reads: list[str]) -> None:
    out = gpu_tables(str(TRACE), per_step=True, kernels=True)
    assert reads == ["folder"]
    # and both tables are there, as each alone prints them
    ledger = gpu_text(str(TRACE), per_step=True).rstrip("\n")
    kernels = gpu_text(str(TRACE), kernels=True).rstrip("\n")
    assert out == f"{ledger}\n\n{kernels}\n"


def test_per_step_and_kernels_of_a_run_read_it_once(reads: list[str], samples: Path) -> None:
    run = samples / "sample-gpu"
    if not (run / "run.json").is_file():
        pytest.skip("the sample-gpu run is not in the checkout")
    out = gpu_tables(str(run), per_step=True, kernels=True)
    assert reads == ["run"]
    assert "kernel_class" in out and "mfu_%" in out
