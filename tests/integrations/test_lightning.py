"""``dpcore.integrations.LightningCallback``: a real 2-rank Lightning ``Trainer`` with
``DDPStrategy`` on CPU/gloo, started by real ``torchrun``, produces a run that ``summarize`` and
the dashboard open, with the strategy's bucket size; a comm hook the user registered on the
strategy's DDP model is kept (fp16: half the bytes on the wire)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from dpcore.read.rundir import load_run  # noqa: E402
from tests.integrations.helpers import free_port, opens_everywhere  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integrations" / "lightning_job.py"
GRAD_BYTES = (32 * 128 + 128 + 128 * 4 + 4) * 4  # Tiny's fp32 gradients


def _torchrun(out: Path, hook: str) -> Path:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), str(JOB), str(out), hook]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PYTHONFAULTHANDLER": "1"}  # a rank killed by a signal prints its Python stacks
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = [d for d in out.iterdir() if d.is_dir() and f"lightning-{hook}" in d.name]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("profiles")
    return {hook: _torchrun(out, hook) for hook in ("none", "fp16")}


def test_a_lightning_run(runs: dict[str, Path]) -> None:
    run = load_run(runs["none"])
    assert run.meta["status"] == "complete" and run.meta["kind"] == "record"
    cfg = run.meta["config"]
    assert cfg["framework"] == "lightning" and cfg["strategy"] == "DDPStrategy" and cfg["model"] == "Tiny"
    job = run.meta["jobs"][0]
    assert job["id"] == "torch_ddp-ws2-b1" and job["bucket_mb"] == 1  # the strategy's bucket size
    st = run.steps
    assert sorted(st["step"].unique()) == [2, 3, 4, 5, 6] and sorted(st["rank"].unique()) == [0, 1]
    assert st.loc[st["step"].isin([2, 3]), "profiled"].all() and not st.loc[st["step"] > 3, "profiled"].any()
    for col in ("step_ms", "fwd_ms", "bwd_ms", "opt_ms"):
        assert (st[col] > 0).all(), col
    assert (st["samples"] == 16).all()
    c = run.collectives
    assert set(c.groupby(["rank", "step"])["bytes"].sum()) == {GRAD_BYTES}  # every bucket, fp32
    assert set(run.rank_trace_files(job["id"])) and run.traced_steps(job["id"]) == [2, 3]


def test_users_comm_hook_is_kept(runs: dict[str, Path]) -> None:
    run = load_run(runs["fp16"])
    assert run.meta["jobs"][0]["comm_hook"] == "fp16_compress_hook"
    assert set(run.collectives.groupby(["rank", "step"])["bytes"].sum()) == {GRAD_BYTES // 2}


def test_summarize_and_dashboard_open_it(runs: dict[str, Path], capsys, monkeypatch) -> None:
    csv = opens_everywhere(runs["none"], capsys, monkeypatch)
    assert csv.splitlines()[1].startswith("torch_ddp-ws2-b1,")
