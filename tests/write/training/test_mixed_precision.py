"""Mixed precision as users run it, each with a known answer that the old code got wrong.

- bf16 jobs: fsdp and torch_fsdp all-gather their parameters in bf16, exactly half the bytes
  of the same fp32 job (the old code all-gathered float32 in both: the same bytes).
- fp16 with a sharded variant: when one rank's shard overflows, every rank skips the step and
  halves its scale (the old scaler checked only the rank's own shards: rank 0 stepped, rank 1
  skipped, and the replicas parted for good).
- data_parallel: a replica thread computes in the caller's autocast dtype (the old wrapper let
  DataParallel re-enter autocast without the dtype: float16 under a bf16 job).
- ``--dtype auto``: bf16 only on a GPU with bf16 units (the old check counted emulation: bf16
  on a V100).
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn as nn

from dpcore.contract.config import TrainConfig
from dpcore.write.capture.comm_log import PhaseTimer, Recorder
from dpcore.write.dp.variants.data_parallel import ReplicaAutocast, autocast_state
from dpcore.write.runtime.launch import launch
from dpcore.write.training import precision
from dpcore.write.training.precision import param_dtype_name, resolve_dtype
from dpcore.write.training.trainer import make_trainer

CFG = TrainConfig(model="mlp", width=32, batch_size=4, lr=0.1, steps=2, warmup=0,
                  profile_steps=0, calibration_steps=0)


# -- --dtype auto on a faked GPU ------------------------------------------------------------

def _fake_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int],
              has_emulation_arg: bool = True) -> None:
    """A GPU of ``capability`` whose is_bf16_supported() counts emulation, as torch's does."""
    def supported(including_emulation: bool = True) -> bool:
        return True if including_emulation else capability >= (8, 0)

    def old_supported() -> bool:  # a torch without the argument (2.4)
        return True

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        supported if has_emulation_arg else old_supported)


@pytest.mark.parametrize("capability,expected", [((7, 0), "fp32"), ((7, 5), "fp32"),
                                                 ((8, 0), "bf16"), ((9, 0), "bf16")])
@pytest.mark.parametrize("has_emulation_arg", [True, False])
def test_auto_is_bf16_only_where_the_gpu_computes_it(monkeypatch: pytest.MonkeyPatch,
                                                     capability: tuple[int, int], expected: str,
                                                     has_emulation_arg: bool) -> None:
    """V100 (7.0) and T4 (7.5) emulate bf16: fp32. A100 (8.0) and H100 (9.0): bf16."""
    _fake_gpu(monkeypatch, capability, has_emulation_arg)
    assert resolve_dtype("auto", "cuda") == expected
    assert resolve_dtype("auto", "cpu") == "fp32"
    assert resolve_dtype("bf16", "cuda") == "bf16"  # asked for: as asked, emulated or not


def test_param_dtype_follows_the_job() -> None:
    assert param_dtype_name("bf16") == "bfloat16"
    assert param_dtype_name("fp16") == "float16"
    assert param_dtype_name("fp32") is None
    assert param_dtype_name("fp32", "bfloat16") == "bfloat16"  # fsdp's own compute_dtype


# -- data_parallel's replica threads ----------------------------------------------------------

def _in_thread_like_data_parallel(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What DataParallel's parallel_apply does: a new thread that re-enters autocast with the
    on/off switch only (torch.amp.autocast(device_type, enabled=...)), no dtype. On CUDA that
    thread's dtype is CUDA's default, float16; the CPU stand-in here gives the thread that
    same default, float16, while the caller runs in bf16."""
    out: dict[str, torch.Tensor] = {}

    def worker() -> None:
        torch.set_autocast_dtype("cpu", torch.float16)  # a fresh thread's CUDA default
        with torch.autocast("cpu", enabled=True):
            out["y"] = module(x)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    return out["y"]


def test_data_parallel_replica_computes_in_the_callers_dtype() -> None:
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 4), torch.randn(2, 8)
    replica = ReplicaAutocast(lin, device_type="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_state("cpu") == (True, torch.bfloat16)
        replica.capture()  # what DataParallelDP.forward does in the caller's thread
        bare = _in_thread_like_data_parallel(lin, x)
        wrapped = _in_thread_like_data_parallel(replica, x)
    assert bare.dtype == torch.float16     # the defect: the thread's default, not the job's
    assert wrapped.dtype == torch.bfloat16  # the job's dtype
    replica.capture()  # outside autocast: the replica runs as it is
    assert replica(x).dtype == torch.float32


# -- two gloo ranks ------------------------------------------------------------------------------

def _all_gather_bytes(variant: str, ctx: Any, dtype: str) -> dict[str, Any]:
    rec = Recorder(variant, ctx.rank)
    tr = make_trainer(variant, ctx, replace(CFG, dtype=dtype), recorder=rec)
    if tr.skip_reason:
        return {"skip": tr.skip_reason}
    rec.step = 0
    x, y = tr.batch(0)
    tr.step(x, y, PhaseTimer(ctx.device))
    return {"bytes": sum(r["bytes"] for r in rec.collective_rows()
                         if r["op"] == "all_gather" and r["step"] == 0)}


def _overflow_on_rank1(variant: str, ctx: Any) -> dict[str, Any]:
    """One fp16 step in which only rank 1's gradients hold an inf (after they were averaged,
    so no other rank can see it in its own gradients)."""
    tr = make_trainer(variant, ctx, replace(CFG, dtype="fp16", optimizer="sgd"))
    if tr.skip_reason:
        return {"skip": tr.skip_reason}
    sync = tr.model.finish_gradient_synchronization

    def sync_then_overflow() -> None:
        sync()
        if ctx.rank == 1:
            for p in tr.module.parameters():
                if p.grad is not None:
                    p.grad.view(-1)[0] = float("inf")
                    break

    tr.model.finish_gradient_synchronization = sync_then_overflow  # type: ignore[method-assign]
    before = [p.detach().clone() for p in tr.module.parameters()]
    scale0 = float(tr.scaler.get_scale())
    x, y = tr.batch(0)
    tr.step(x, y, PhaseTimer(ctx.device))
    after = list(tr.module.parameters())
    return {"stepped": any(not torch.equal(a, b) for a, b in zip(after, before)),
            "scale_ratio": float(tr.scaler.get_scale()) / scale0}


def _rank_checks(ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in ("fsdp", "torch_fsdp"):
        for dtype in ("fp32", "bf16"):
            out[f"{variant}-{dtype}"] = _all_gather_bytes(variant, ctx, dtype)
    for variant in ("fsdp", "zero1"):
        out[f"overflow-{variant}"] = _overflow_on_rank1(variant, ctx)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return launch(_rank_checks, 2, backend="gloo", timeout_s=600)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["fsdp", "torch_fsdp"])
def test_bf16_job_all_gathers_half_the_bytes(results: list[dict[str, Any]], variant: str) -> None:
    for r in results:
        fp32, bf16 = r[f"{variant}-fp32"], r[f"{variant}-bf16"]
        if "skip" in fp32:
            pytest.skip(fp32["skip"])
        assert fp32["bytes"] > 0
        assert bf16["bytes"] * 2 == fp32["bytes"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["fsdp", "zero1"])
def test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank(results: list[dict[str, Any]],
                                                                 variant: str) -> None:
    for r in results:
        got = r[f"overflow-{variant}"]
        assert got["stepped"] is False
        assert got["scale_ratio"] == 0.5  # backoff_factor: each rank saw the overflow


def test_unsynced_scaler_is_the_plain_one() -> None:
    """Replicated variants keep torch's own scaler (their gradients are the same everywhere:
    no extra all-reduce in the step they time)."""
    plain = precision.grad_scaler(torch.device("cpu"), "fp16")
    assert type(plain) is torch.amp.GradScaler
    assert isinstance(precision.grad_scaler(torch.device("cpu"), "fp16", sync_ranks=True),
                      precision.RankAgreeingGradScaler)
    assert precision.grad_scaler(torch.device("cpu"), "bf16", sync_ranks=True) is None
