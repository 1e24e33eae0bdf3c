"""The CUDA-only paths of the engine, on a real GPU (marked ``gpu``: skipped without one).

Run on a GPU host with ``python -m pytest -m gpu tests/write tests/contract`` (scripts/gpu_check.sh
does). Known answers: CUDA-event phase times are positive and add up to the step; the memory
row of a CUDA step is the allocator's peak, at least the model's weights and gradients; NCCL
is asked about reduce-scatter (never probed with CPU tensors), so ``torch_fsdp`` runs and
``fsdp`` logs reduce-scatters; ranks sharing one GPU over gloo carry CUDA tensors; PowerSGD on
a CPU job runs where CUDA is available; ``--dtype auto`` is bf16 on a GPU that supports it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dpcore.contract.config import TrainConfig
from dpcore.write.capture.comm_log import PhaseTimer, Recorder
from dpcore.write.capture.memory import GPU_METHOD, measure_step
from dpcore.write.dp.sharding import has_native_reduce_scatter
from dpcore.write.dp.variants import torch_ddp
from dpcore.write.runtime.launch import launch
from dpcore.write.training.precision import resolve_dtype
from dpcore.write.training.trainer import local_context, make_trainer

pytestmark = pytest.mark.gpu
CFG = TrainConfig(model="mlp", width=64, batch_size=8, steps=3, warmup=0, profile_steps=0,
                  calibration_steps=0)


def test_cuda_events_time_the_phases() -> None:
    tr = make_trainer("single", local_context("cuda"), CFG, replicas=1)
    timer = PhaseTimer(torch.device("cuda", 0))
    x, y = tr.batch(0)
    tr.step(x, y, timer)
    t = timer.finish()
    assert t["step_ms"] > 0 and t["fwd_ms"] > 0 and t["bwd_ms"] > 0


def test_cuda_memory_row_is_the_allocators_peak() -> None:
    tr = make_trainer("single", local_context("cuda"), CFG, replicas=1)

    def one() -> None:
        x, y = tr.batch(0)
        tr.step(x, y, PhaseTimer(torch.device("cuda", 0)))

    row = measure_step(tr, one, job_id="single-ws1", variant="single", world_size=1, rank=0)
    weights = sum(p.numel() * p.element_size() for p in tr.module.parameters())
    assert row["peak_method"] == GPU_METHOD and row["device"].startswith("cuda")
    assert row["peak_bytes"] >= 2 * weights
    assert row["reserved_bytes"] >= row["peak_bytes"]  # torch.cuda.max_memory_reserved over the same step


def test_auto_dtype_is_bf16_on_this_gpu_when_it_has_bf16() -> None:
    assert resolve_dtype("auto", "cuda") == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")


def _nccl_job(ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"device": str(ctx.device), "backend": ctx.backend,
                           "native_rs": has_native_reduce_scatter(None, ctx.device)}
    for variant in ("fsdp", "torch_fsdp"):
        rec = Recorder(variant, ctx.rank)
        tr = make_trainer(variant, ctx, replace(CFG, dtype="bf16"), recorder=rec)
        out[f"{variant}_skip"] = tr.skip_reason
        if tr.skip_reason:
            continue
        for step in range(2):
            rec.step = step
            x, y = tr.batch(step)
            tr.step(x, y, PhaseTimer(ctx.device))
        torch.cuda.synchronize()
        out[f"{variant}_ops"] = sorted({r["op"] for r in rec.collective_rows()})
    return out


def test_nccl_is_asked_and_fsdp_reduce_scatters() -> None:
    """dpcore's own fsdp reduce-scatters on NCCL even at one rank. torch_fsdp (FSDP2) does not:
    its ``foreach_reduce`` skips the reduce-scatter when the group has one rank (torch 2.11 on an
    H200 and 2.13 alike), so a world-size-1 torch_fsdp job logs only the start-up broadcast; with
    two GPUs the same job must reduce-scatter."""
    gpus = min(torch.cuda.device_count(), 2)
    got = launch(_nccl_job, gpus, backend="nccl", device="cuda", timeout_s=300)
    r = got[0]
    assert (r["backend"], r["device"], r["native_rs"]) == ("nccl", "cuda:0", True)
    assert r["torch_fsdp_skip"] is None and r["fsdp_skip"] is None
    assert "reduce_scatter" in r["fsdp_ops"]
    if gpus == 1:
        assert "reduce_scatter" not in r["torch_fsdp_ops"] and "broadcast" in r["torch_fsdp_ops"]
    else:
        assert all("reduce_scatter" in g["torch_fsdp_ops"] for g in got)


def _shared_gpu_job(ctx: Any) -> dict[str, Any]:
    t = torch.full((1024,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(t)
    return {"device": str(ctx.device), "sum": float(t[0]), "backend": ctx.backend}


def test_ranks_share_one_gpu_over_gloo() -> None:
    got = launch(_shared_gpu_job, 2, backend="gloo", device="cuda", timeout_s=300)
    gpus = torch.cuda.device_count()
    assert [g["device"] for g in got] == [f"cuda:{r % gpus}" for r in range(2)]
    assert all(g["sum"] == 3.0 and g["backend"] == "gloo" for g in got)


def _powersgd_cpu_job(ctx: Any) -> float:
    cfg = replace(CFG, steps=torch_ddp.POWERSGD_START + 2, model="toy", batch_size=4)
    tr = make_trainer("torch_ddp", ctx, cfg, comm_hook="powersgd")
    loss = 0.0
    for step in range(cfg.steps):
        x, y = tr.batch(step)
        loss = tr.step(x, y, PhaseTimer(ctx.device))
    return loss


def test_powersgd_cpu_job_on_a_gpu_host() -> None:
    losses = launch(_powersgd_cpu_job, 2, backend="gloo", device="cpu", timeout_s=300)
    assert all(torch.isfinite(torch.tensor(losses)))
