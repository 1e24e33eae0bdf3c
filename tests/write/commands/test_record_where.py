"""``dpcore.record`` writes what the user's job really ran on and in: the default group's
backend (also at world size 1), the model's device, and the precision its forward ran in
(the autocast state read as the model runs), with TF32's setting."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from dpcore.write.commands.record import record
from dpcore.write.runtime.launch import launch


def _train(out: Path, autocast: torch.dtype | None) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with record(out, model=model, warmup=1, trace=False) as rec:
        for _ in range(3):
            with rec.step():
                with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
                    loss = model(torch.randn(4, 8)).float().pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
    return json.loads((rec.run_dir / "run.json").read_text())


def test_no_group_fp32(tmp_path: Path) -> None:
    assert not dist.is_initialized()
    meta = _train(tmp_path, None)
    assert (meta["config"]["dtype"], meta["config"]["tf32"]) == ("fp32", False)
    assert (meta["environment"]["backend"], meta["environment"]["device"]) == ("none", "cpu")
    job = meta["jobs"][0]
    assert (job["backend"], job["device"], job["gpus_shared"]) == ("none", "cpu", False)


def test_no_group_bf16_autocast_is_recorded(tmp_path: Path) -> None:
    assert _train(tmp_path, torch.bfloat16)["config"]["dtype"] == "bf16"


def _in_a_gloo_group(ctx: Any, out: str) -> dict[str, Any]:
    return _train(Path(out), torch.float16)


def test_world_of_one_with_a_gloo_group_says_gloo(tmp_path: Path) -> None:
    """Before, a group of one was written as backend 'none'."""
    meta = launch(_in_a_gloo_group, 1, backend="gloo", args=(str(tmp_path),), timeout_s=120)[0]
    assert meta["environment"]["backend"] == "gloo" and meta["jobs"][0]["backend"] == "gloo"
    assert meta["config"]["dtype"] == "fp16"
