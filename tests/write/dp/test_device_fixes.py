"""Engine fixes found on a GPU host, each tested on a CPU machine.

- The reduce-scatter question is put to the backend for the group's own device: NCCL is
  asked (never probed with CPU tensors, which it must refuse), other backends are probed on
  the device the caller's tensors live on.
- PowerSGD on a CPU job where CUDA is reported available: PyTorch's hook synchronizes the
  bucket's device, a CPU one there.
- ``torch_ddp`` on a torch whose DDP has only ``broadcast_buffers`` (<= 2.11): ranks that start
  with different buffers hold rank 0's after wrapping (the old switch skips DDP's init sync).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dpcore.contract.config import TrainConfig
from dpcore.write.capture.comm_log import PhaseTimer
from dpcore.write.dp import sharding
from dpcore.write.dp.sharding import Collectives, group_backend, has_native_reduce_scatter
from dpcore.write.dp.variants import torch_ddp
from dpcore.write.runtime.launch import launch
from dpcore.write.training.trainer import make_trainer

CFG = TrainConfig(model="toy", batch_size=4, lr=0.1, steps=3, warmup=0, profile_steps=0)


def test_group_backend_reads_per_device_backend_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sharding.dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    assert group_backend(None, torch.device("cuda", 0)) == "nccl"
    assert group_backend(None, torch.device("cpu")) == "gloo"
    monkeypatch.setattr(sharding.dist, "get_backend", lambda group=None: "gloo")
    assert group_backend(None, torch.device("cuda", 1)) == "gloo"


def test_nccl_is_asked_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NCCL group answers yes without any collective: no process group exists here, and a
    probe on the 'meta' device would fail (see the gloo test below)."""
    monkeypatch.setattr(sharding.dist, "get_backend", lambda group=None: "nccl")
    assert has_native_reduce_scatter(None, "meta") is True
    monkeypatch.setattr(sharding.dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    assert has_native_reduce_scatter(None, "cuda:0") is True


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))


def _rank_checks(ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # the probe runs on the device it is given: CPU works on gloo, 'meta' cannot
    out["rs_cpu"] = Collectives(device="cpu").native_reduce_scatter
    out["rs_meta"] = has_native_reduce_scatter(None, "meta")
    # the old DDP switch (broadcast_buffers=False skips DDP's init sync): ranks start with
    # different BatchNorm statistics and must hold rank 0's after wrapping
    torch_ddp._NO_FORWARD_BUFFER_SYNC = {"broadcast_buffers": False}
    torch.manual_seed(0)
    net = BNNet()
    with torch.no_grad():
        net.bn.running_mean.fill_(float(ctx.rank + 1))
        net.bn.running_var.fill_(float(ctx.rank + 3))
    wrapped = torch_ddp.TorchDDP(net)
    mean = wrapped.module.bn.running_mean.clone()
    var = wrapped.module.bn.running_var.clone()
    spread = [mean, var]
    for t in spread:
        lo, hi = t.clone(), t.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        out.setdefault("buffer_spread", 0.0)
        out["buffer_spread"] = max(out["buffer_spread"], float((hi - lo).abs().max()))
    out["running_mean"] = float(mean[0])
    # PowerSGD with CUDA reported available (as on any GPU host), on a CPU job
    torch.cuda.is_available = lambda: True
    cfg = replace(CFG, steps=torch_ddp.POWERSGD_START + 2)
    tr = make_trainer("torch_ddp", ctx, cfg, comm_hook="powersgd")
    timer = PhaseTimer(ctx.device)
    losses = []
    for step in range(cfg.steps):
        x, y = tr.batch(step)
        losses.append(tr.step(x, y, timer))
    out["powersgd_losses"] = losses
    out["powersgd_compressed"] = tr.model.hook_state.iter > torch_ddp.POWERSGD_START
    out["powersgd_params"] = [float(p.detach().double().sum()) for p in tr.module.parameters()]
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return launch(_rank_checks, 2, backend="gloo", timeout_s=240)


def test_reduce_scatter_probe_runs_on_the_groups_device(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert r["rs_cpu"] is True and r["rs_meta"] is False


def test_old_ddp_switch_still_gives_every_rank_rank0s_buffers(results: list[dict[str, Any]]) -> None:
    assert results[0]["buffer_spread"] == 0.0
    assert results[1]["running_mean"] == 1.0  # rank 0's value


def test_powersgd_cpu_job_runs_where_cuda_is_reported(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert r["powersgd_compressed"] is True
        assert all(torch.isfinite(torch.tensor(r["powersgd_losses"])))
    # the replicas stayed in step through the compressed all-reduces
    assert results[0]["powersgd_params"] == results[1]["powersgd_params"]


def test_gloo_on_cuda_is_probed_like_any_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """gloo's reduce-scatter is an all-reduce on CUDA tensors too (ProcessGroupGloo.cpp), and an
    older gloo raises rather than crashes: so gloo on CUDA is probed, not answered no. No process
    group exists here: reaching the probe's first group call shows the probe was run."""
    class Probed(Exception):
        pass

    def world_size(group: Any = None) -> int:
        raise Probed

    monkeypatch.setattr(sharding.dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(sharding.dist, "get_world_size", world_size)
    with pytest.raises(Probed):
        has_native_reduce_scatter(None, "cuda:0")
