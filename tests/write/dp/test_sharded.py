"""Sharded variants (zero1, torch_zero1, fsdp, torch_fsdp) and their API on real gloo groups.

One launch per world size (2 and 3) runs every distributed check and returns numbers; the
tests below only assert on them. Known answers: after a few steps every sharded variant holds
``single``'s parameters (SGD and Adam), ``shard_optimizer`` in a hand-written loop over a model
not from dpcore matches a plain optimizer, optimizer state per rank is about total / N, and
fsdp's gradients have their shard's shape and dtype.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import dpcore
from dpcore.contract.config import TrainConfig
from dpcore.contract.errors import UsageError
from dpcore.write.capture.comm_log import PhaseTimer, Recorder
from dpcore.write.dp.sharding import Collectives, assign_owners, shard_size
from dpcore.write.dp.variants import wrap
from dpcore.write.runtime.launch import launch
from dpcore.write.training.trainer import local_context, make_trainer

ROOT = Path(__file__).resolve().parents[3]
CFG = TrainConfig(model="toy", batch_size=4, lr=0.1, steps=3, warmup=0, profile_steps=0,
                  bucket_mb=0.0004)
STEPS = 3


class Awkward(nn.Module):
    """Not a dpcore model: a 1-element 2-D parameter, sizes not divisible by 2 or 3 (primes),
    a 1-element bias, a frozen matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(7, 11)                     # 77 and 11 elements
        self.tiny = nn.Parameter(torch.randn(1, 1))     # one element, sharded by fsdp
        self.out = nn.Linear(11, 5)                     # 55 and 5
        self.gain = nn.Parameter(torch.ones(1))         # one element, replicated
        self.frozen = nn.Parameter(torch.randn(5, 5), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.lin(x)) * self.tiny[0, 0]) @ self.frozen * self.gain


def _awkward_batch(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(n, 7, generator=g), torch.randn(n, 5, generator=g)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _full_params(tr: Any) -> dict[str, torch.Tensor]:
    gather = getattr(tr.model, "gather_full_params", None)
    return ({k: v.detach().clone() for k, v in gather().items()} if gather
            else {n: p.detach().clone() for n, p in tr.module.named_parameters()})


def _train(variant: str, ctx: Any, cfg: TrainConfig, replicas: int | None = None) -> Any:
    tr = make_trainer(variant, ctx, cfg, replicas=replicas)
    if tr.skip_reason:  # e.g. torch_fsdp on a torch without the public fully_shard (2.4)
        return tr
    for step in range(STEPS):
        x, y = tr.batch(step)
        tr.step(x, y, PhaseTimer(ctx.device))
    return tr


def _state_numel(opt: torch.optim.Optimizer) -> int:
    local = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard in .optim
    return sum(v.numel() for s in local.state.values() for k, v in s.items()
               if isinstance(v, torch.Tensor) and k != "step")


def _known_answers(ctx: Any, out: dict[str, Any]) -> None:
    """zero1 / torch_zero1 / fsdp / torch_fsdp end where single ends (SGD and Adam)."""
    for opt in ("sgd", "adam"):
        cfg = replace(CFG, optimizer=opt)
        ref = _full_params(_train("single", local_context("cpu"), cfg, ctx.world_size))
        for v in ("zero1", "torch_zero1", "fsdp", "torch_fsdp"):
            tr = _train(v, ctx, cfg)
            if tr.skip_reason:
                out[f"{v}/{opt}"] = ("skipped", tr.skip_reason)
                continue
            out[f"{v}/{opt}"] = _max_diff(_full_params(tr), ref)
            if opt == "adam":
                full = sum(p.numel() for p in tr.module.parameters() if p.requires_grad)
                out[f"state/{v}"] = (_state_numel(tr.opt), full)
            dist.barrier()
    for dt in ("float16", "bfloat16"):
        cfg = replace(CFG, compute_dtype=dt)
        ref = _full_params(_train("single", local_context("cpu"), cfg, ctx.world_size))
        out[f"fsdp[{dt}]"] = _max_diff(_full_params(_train("fsdp", ctx, cfg)), ref)


def _fsdp_api(ctx: Any, out: dict[str, Any]) -> None:
    """wrap('fsdp') in a user's loop: grads' shapes/dtypes, gather_full_params, recorder rows."""
    torch.manual_seed(0)
    ref = Awkward()
    torch.manual_seed(0)
    rec = Recorder("fsdp-test", ctx.rank)
    model = wrap("fsdp", Awkward(), recorder=rec)
    opt = model.make_optimizer(torch.optim.Adam, lr=0.05)
    ref_opt = torch.optim.Adam([p for p in ref.parameters() if p.requires_grad], lr=0.05)
    n, ws = 6 * ctx.world_size, ctx.world_size
    for step in range(STEPS):
        rec.step = step
        x, y = _awkward_batch(step, n)
        lo = ctx.rank * 6
        nn.functional.mse_loss(model(x[lo:lo + 6]), y[lo:lo + 6]).backward()
        model.finish_gradient_synchronization()
        out.setdefault("grad_ok", True)
        for p in model.module.parameters():
            if p.requires_grad:
                out["grad_ok"] &= (p.grad is not None and p.grad.shape == p.shape
                                   and p.grad.dtype == p.dtype)
            else:
                out["grad_ok"] &= p.grad is None
        opt.step()
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    full = model.gather_full_params()
    out["fsdp_api_diff"] = _max_diff(full, {k: v.detach() for k, v in ref.named_parameters()})
    out["fsdp_shapes"] = {k: tuple(v.shape) for k, v in full.items()}
    out["fsdp_shard_shapes"] = {k: tuple(p.shape) for k, p in model.module.named_parameters()}
    rows = [r for r in rec.collective_rows() if r["step"] == 1]
    out["fsdp_ops"] = sorted({r["op"] for r in rows})
    out["fsdp_rs_bytes"] = sum(r["bytes"] for r in rows if r["op"] == "reduce_scatter")
    out["fsdp_ag_bytes"] = sum(r["bytes"] for r in rows if r["op"] == "all_gather")
    out["fsdp_expected_bytes"] = sum(ws * shard_size(p.numel(), ws) * 4
                                     for p in ref.parameters() if p.dim() >= 2 and p.requires_grad)
    out["fsdp_frozen_bytes"] = ws * shard_size(25, ws) * 4


def _shard_optimizer_loop(ctx: Any, out: dict[str, Any]) -> None:
    """dpcore.shard_optimizer with DDP in a hand-written loop vs a plain full-batch Adam."""
    torch.manual_seed(1)
    ref = Awkward()
    torch.manual_seed(1)
    mine = Awkward()
    ddp = nn.parallel.DistributedDataParallel(mine)
    opt = dpcore.shard_optimizer([p for p in mine.parameters() if p.requires_grad],
                                 torch.optim.AdamW, lr=0.05, weight_decay=0.01)
    ref_opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=0.05,
                                weight_decay=0.01)
    out["is_optimizer"] = isinstance(opt, torch.optim.Optimizer)
    for step in range(STEPS):
        x, y = _awkward_batch(step, 6 * ctx.world_size)
        lo = ctx.rank * 6
        nn.functional.mse_loss(ddp(x[lo:lo + 6]), y[lo:lo + 6]).backward()
        opt.step()
        opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    out["grads_cleared"] = all(p.grad is None for p in mine.parameters())
    out["shard_opt_diff"] = _max_diff(dict(mine.named_parameters()), dict(ref.named_parameters()))
    count = torch.tensor([float(_state_numel(opt))])
    out["shard_state"] = float(count.item())
    dist.all_reduce(count)
    out["shard_state_total"] = float(count.item())
    out["shard_full_state"] = float(_state_numel(ref_opt))
    sd = opt.state_dict()
    opt.load_state_dict(sd)
    out["state_dict_ok"] = len(sd["state"]) == len(opt.owned_parameters())


def _fallback_reduce_scatter(ctx: Any, out: dict[str, Any]) -> None:
    """The all-reduce + slice stand-in equals the native reduce-scatter (awkward sizes)."""
    rec = Recorder("rs", ctx.rank)
    native, fallback = Collectives(), Collectives(recorder=rec, native_reduce_scatter=False)
    worst = 0.0
    for per_rank in (1, 2, 5, 7):
        full = torch.arange(per_rank * ctx.world_size, dtype=torch.float32) * (ctx.rank + 1)
        a, b = torch.empty(per_rank), torch.empty(per_rank)
        native.reduce_scatter(a, full.clone())
        fallback.reduce_scatter(b, full.clone(), async_op=True).wait()
        worst = max(worst, float((a - b).abs().max()))
    out["fallback_diff"] = worst
    out["fallback_ops"] = sorted({r["op"] for r in rec.collective_rows()})


def sharded_checks(ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _known_answers(ctx, out)
    _fsdp_api(ctx, out)
    _shard_optimizer_loop(ctx, out)
    _fallback_reduce_scatter(ctx, out)
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"ws{n}")
def checks(request: Any) -> tuple[int, dict[str, Any]]:
    res = launch(sharded_checks, request.param, backend="gloo", timeout_s=300)
    return request.param, res[0]


def test_sharded_variants_match_single_sgd_and_adam(checks: Any) -> None:
    _, r = checks
    for v in ("zero1", "torch_zero1", "fsdp", "torch_fsdp"):
        for opt in ("sgd", "adam"):
            got = r[f"{v}/{opt}"]
            if isinstance(got, tuple):  # torch_fsdp where the backend cannot run it
                assert v == "torch_fsdp" and got[0] == "skipped" and got[1], got
                continue
            assert got < 2e-6, (v, opt, got)


def test_optimizer_state_is_sharded(checks: Any) -> None:
    ws, r = checks
    for v in ("zero1", "torch_zero1", "fsdp"):
        mine, full = r[f"state/{v}"]
        # Adam keeps exp_avg + exp_avg_sq per element: 2 x (this rank's share)
        assert 0 < mine <= 2 * (full / ws + 91), (v, mine, full)  # 91: toy's largest param
    assert r["shard_state_total"] == r["shard_full_state"] > 0  # every element exactly once
    assert r["shard_state"] < r["shard_full_state"]


def test_half_compute_within_tolerance(checks: Any) -> None:
    from dpcore.write.commands.verify import compute_tolerance
    _, r = checks
    for dt in ("float16", "bfloat16"):
        assert 0 < r[f"fsdp[{dt}]"] <= compute_tolerance(replace(CFG, steps=STEPS), dt), dt


def test_fsdp_user_loop_grads_and_full_params(checks: Any) -> None:
    ws, r = checks
    assert r["grad_ok"]
    assert r["fsdp_api_diff"] < 2e-6
    assert r["fsdp_shapes"] == {"lin.weight": (11, 7), "lin.bias": (11,), "tiny": (1, 1),
                                "out.weight": (5, 11), "out.bias": (5,), "gain": (1,),
                                "frozen": (5, 5)}
    assert r["fsdp_shard_shapes"]["lin.weight"] == (shard_size(77, ws),)
    assert r["fsdp_shard_shapes"]["tiny"] == (1,) and r["fsdp_shard_shapes"]["gain"] == (1,)


def test_fsdp_collectives_volume(checks: Any) -> None:
    _, r = checks
    assert r["fsdp_ops"] == ["all_gather", "all_reduce", "reduce_scatter"]
    # one reduce-scatter of every trainable >= 2-D parameter; two all-gathers (forward and
    # backward) of every >= 2-D parameter, frozen ones included
    assert r["fsdp_rs_bytes"] == r["fsdp_expected_bytes"]
    assert r["fsdp_ag_bytes"] == 2 * (r["fsdp_expected_bytes"] + r["fsdp_frozen_bytes"])


def test_shard_optimizer_in_a_hand_written_loop(checks: Any) -> None:
    _, r = checks
    assert r["is_optimizer"] and r["grads_cleared"] and r["state_dict_ok"]
    assert r["shard_opt_diff"] < 2e-6


def test_reduce_scatter_fallback_is_exact_and_logged_as_all_reduce(checks: Any) -> None:
    _, r = checks
    assert r["fallback_diff"] == 0.0 and r["fallback_ops"] == ["all_reduce"]


def test_pure_shard_helpers() -> None:
    assert [shard_size(n, 3) for n in (0, 1, 2, 3, 4, 77)] == [0, 1, 1, 1, 2, 26]
    assert assign_owners([91, 77, 11, 77, 7], 2) == [0, 1, 0, 1, 0]
    assert assign_owners([5], 3) == [0]  # fewer parameters than ranks: others own nothing
    loads = [0, 0, 0]
    for size, r in zip([10, 9, 8, 7, 6, 5], assign_owners([10, 9, 8, 7, 6, 5], 3)):
        loads[r] += size
    assert max(loads) - min(loads) <= 5


def test_compute_dtype_only_for_fsdp() -> None:
    with pytest.raises(UsageError, match="compute_dtype is an fsdp / torch_fsdp option") as exc:
        wrap("ring", nn.Linear(2, 2), compute_dtype=torch.float16)
    assert "\n" not in str(exc.value)
    with pytest.raises(UsageError, match="valid choices: float16, bfloat16"):
        wrap("fsdp", nn.Linear(2, 2), compute_dtype="int8")
    with pytest.raises(UsageError, match="torch.optim.Optimizer subclass"):
        dpcore.shard_optimizer([nn.Parameter(torch.zeros(2))], "adam")  # type: ignore[arg-type]


def test_cli_rejects_bad_optimizer(capsys: Any) -> None:
    from dpcore.cli import main
    for cmd in ("verify", "profile"):
        assert main([cmd, "--optimizer", "lamb"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "sgd" in err and "adamw" in err, err


def test_profile_sharded_variants_records_their_collectives(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCORE_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "dpcore", "profile", "--variants", "zero1,torch_zero1,fsdp,torch_fsdp",
         "--world-sizes", "2", "--steps", "2", "--warmup", "1", "--model", "mlp", "--width", "32",
         "--batch-size", "4", "--no-trace", "--optimizer", "adam", "--progress", "none",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    import json
    jobs = {j["variant"]: j for j in json.loads((run / "run.json").read_text())["jobs"]}
    assert set(jobs) == {"zero1", "torch_zero1", "fsdp", "torch_fsdp"}
    for v, job in jobs.items():
        assert job["status"] == "complete" or (v == "torch_fsdp" and job["status"] == "skipped"
                                               and job.get("skip_reason")), job
    with open(run / "collectives.csv") as f:
        rows = list(csv.DictReader(f))
    by = lambda job, op: [r for r in rows if r["job_id"].startswith(job + "-")  # noqa: E731
                          and r["op"] == op and r["rank"] == "0" and r["step"] == "0"]
    ag, rs = by("fsdp", "all_gather"), by("fsdp", "reduce_scatter")
    assert ag and rs and all(int(r["bytes"]) > 0 for r in ag + rs)
    # mlp: every layer's weight all-gathered in forward and backward, reduce-scattered once
    assert sum(int(r["bytes"]) for r in ag) == 2 * sum(int(r["bytes"]) for r in rs)
    assert by("zero1", "all_reduce") and by("zero1", "broadcast")
    assert by("torch_zero1", "all_reduce") and by("torch_zero1", "broadcast")
    if jobs["torch_fsdp"]["status"] == "complete":
        assert by("torch_fsdp", "all_gather") and by("torch_fsdp", "reduce_scatter")
