"""``--dtype``: what each precision really runs (autocast in the half type, float32 master
weights, fp16's gradient scaler), how ``auto`` resolves, and what run.json records."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dpcore.contract.config import TrainConfig
from dpcore.contract.errors import UsageError
from dpcore.contract.options import ProfileOptions
from dpcore.write.capture.comm_log import PhaseTimer
from dpcore.write.commands.profile import run_profile
from dpcore.write.training import precision
from dpcore.write.training.precision import autocast_precision, resolve_dtype
from dpcore.write.training.trainer import local_context, make_trainer

CFG = TrainConfig(model="mlp", width=16, batch_size=4, steps=2, warmup=0, profile_steps=0)


def test_auto_is_fp32_on_cpu_and_bf16_on_a_gpu_that_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_dtype("auto", "cpu") == "fp32"
    assert resolve_dtype("fp16", "cpu") == "fp16"
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precision.torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: True)  # an A100
    assert resolve_dtype("auto", "cuda") == "bf16"
    monkeypatch.setattr(precision.torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: including_emulation)  # a V100: emulated
    assert resolve_dtype("auto", "cuda") == "fp32"


def test_bad_and_contradicting_dtypes_are_refused() -> None:
    with pytest.raises(UsageError, match="unknown dtype float8"):
        TrainConfig(dtype="float8")
    with pytest.raises(UsageError, match="contradicts --dtype bf16"):
        TrainConfig(dtype="bf16", compute_dtype="float16")
    assert TrainConfig(dtype="bf16", compute_dtype="bfloat16").compute_dtype == "bfloat16"


def test_autocast_state_is_read_at_step_time() -> None:
    assert autocast_precision("cpu") == "fp32"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_precision("cpu") == "bf16"
    with torch.autocast("cpu", dtype=torch.float16):
        assert autocast_precision("cpu") == "fp16"


@pytest.mark.parametrize("dtype,compute", [("fp32", torch.float32), ("bf16", torch.bfloat16),
                                           ("fp16", torch.float16)])
def test_trainer_computes_in_the_dtype_with_float32_master_weights(dtype: str,
                                                                   compute: torch.dtype) -> None:
    tr = make_trainer("single", local_context("cpu"), replace(CFG, dtype=dtype), replicas=1)
    seen: list[torch.dtype] = []
    first = next(m for m in tr.module.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    losses = []
    for step in range(3):
        x, y = tr.batch(step)
        losses.append(tr.step(x, y, PhaseTimer(torch.device("cpu"))))
    assert seen == [compute] * 3
    assert {p.dtype for p in tr.module.parameters()} == {torch.float32}
    assert all(torch.isfinite(torch.tensor(losses)))
    assert (tr.scaler is not None) == (dtype == "fp16")
    if tr.scaler is not None:
        assert tr.scaler.get_scale() > 0


def test_profile_records_dtype_tf32_and_each_jobs_placement(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    opts = ProfileOptions(variants=("single", "bucketed"), world_sizes=(1, 2), trace=False,
                          train=replace(CFG, dtype="bf16", calibration_steps=0, warmup=1),
                          out=str(tmp_path), progress="none", device="cpu")
    code, run_dir = run_profile(opts, ["profile"])
    assert code == 0 and run_dir is not None
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("dpcore: world size")]
    assert line == ["dpcore: world size 1: cpu/gloo (1 rank(s) on the CPU); world size 2: cpu/gloo "
                    "(2 rank(s) on the CPU). Why: --device cpu"]
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["config"]["dtype"], meta["config"]["tf32"]) == ("bf16", False)
    assert meta["environment"]["device"] == "cpu"
    jobs = {j["id"]: j for j in meta["jobs"]}
    assert set(jobs) == {"single-ws1", "bucketed-ws1-b25", "bucketed-ws2-b25"}
    for j in jobs.values():
        assert j["status"] == "complete"
        assert (j["backend"], j["device"], j["gpus_shared"]) == ("gloo", "cpu", False)
