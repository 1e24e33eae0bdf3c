"""``dpcore.integrations.TransformersCallback``: a real 2-rank Hugging Face ``Trainer`` (a tiny
model built in the job, DDP on gloo through Accelerate), started by real ``torchrun``, produces a
run that ``summarize`` and the dashboard open, with the Trainer's bucket size."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from dpcore.read.rundir import load_run  # noqa: E402
from tests.integrations.helpers import free_port, opens_everywhere  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integrations" / "transformers_job.py"
GRAD_BYTES = (32 * 128 + 128 + 128 * 4 + 4) * 4  # the tiny model's fp32 gradients


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profiles")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), str(JOB), str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PYTHONFAULTHANDLER": "1"}  # a rank killed by a signal prints its Python stacks
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = [d for d in out.iterdir() if d.is_dir() and "transformers" in d.name]
    assert len(runs) == 1, runs
    return runs[0]


def test_a_transformers_run(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.meta["status"] == "complete" and run.meta["kind"] == "record"
    cfg = run.meta["config"]
    assert cfg["framework"] == "transformers" and cfg["model"] == "TinyModel"
    job = run.meta["jobs"][0]
    assert job["id"] == "torch_ddp-ws2-b1" and job["bucket_mb"] == 1  # the Trainer's ddp_bucket_cap_mb
    st = run.steps
    assert sorted(st["step"].unique()) == [2, 3, 4, 5, 6] and sorted(st["rank"].unique()) == [0, 1]
    assert st.loc[st["step"].isin([2, 3]), "profiled"].all()
    for col in ("step_ms", "fwd_ms", "bwd_ms", "opt_ms"):
        assert (st[col] > 0).all(), col
    assert (st["samples"] == 16).all()
    assert set(run.collectives.groupby(["rank", "step"])["bytes"].sum()) == {GRAD_BYTES}
    assert run.traced_steps(job["id"]) == [2, 3]


def test_summarize_and_dashboard_open_it(run_dir: Path, capsys, monkeypatch) -> None:
    csv = opens_everywhere(run_dir, capsys, monkeypatch)
    assert csv.splitlines()[1].startswith("torch_ddp-ws2-b1,")
