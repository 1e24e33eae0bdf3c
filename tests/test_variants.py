"""Multi-process DP wrappers on real gloo groups at 2 and 3 ranks (one launch per size).

One worker per world size checks every variant: broadcast at construction, gradient equal to
the single-process full-batch gradient (tied weight reduced once, i.e. not doubled), frozen
parameter untouched, no_sync accumulation == bigger batch, and the Recorder's rows.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from dpcore.contract.config import TrainConfig
from dpcore.contract.errors import UsageError
from dpcore.write.recorder import Recorder
from dpcore.write.launch import launch
from dpcore.write.models import build_model, loss_fn, make_batch, shard
from dpcore.write.variants import (MULTIPROCESS, PROCESSES, VARIANTS, assign_buckets,
                             launch_world_size, wrap)

CFG = TrainConfig(model="toy", batch_size=4, lr=0.1)
TOY_NAMES = [n for n, _ in build_model(CFG).named_parameters()]
BUCKET_MB = 0.0004  # 419 bytes: toy's 263 floats fall into 3 buckets


def _spread(t: torch.Tensor) -> float:
    ref = t.clone()
    dist.broadcast(ref, 0)
    d = (t - ref).abs().max().reshape(1)
    dist.all_reduce(d, op=dist.ReduceOp.MAX)
    return float(d)


def _tensors(m: torch.nn.Module) -> list[torch.Tensor]:
    return list(m.parameters()) + list(m.buffers())


def _flat(m: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in _tensors(m)])


def _full_grads(batches: list[int]) -> dict[str, torch.Tensor]:
    """Single-process gradient of sum_k mean-loss(global batch k): the DP target."""
    m = build_model(CFG)
    for step in batches:
        x, y = make_batch(CFG, "toy", step, 4 * dist.get_world_size())
        loss_fn("toy")(m(x), y).backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def _grad_diff(m: torch.nn.Module, ref: dict[str, torch.Tensor]) -> float:
    return max((p.grad - ref[n]).abs().max().item() for n, p in m.named_parameters()
               if p.requires_grad)


def _backward(model: Any, step: int, ctx: Any) -> None:
    x, y = make_batch(CFG, "toy", step, 4 * ctx.world_size)
    x, y = shard(x, ctx.rank, ctx.world_size), shard(y, ctx.rank, ctx.world_size)
    model.on_train_batch_start()
    loss_fn("toy")(model(x), y).backward()


def variant_checks(ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ref1, ref23 = _full_grads([1]), _full_grads([2, 3])
    for v in MULTIPROCESS:
        r: dict[str, Any] = {}
        bare = build_model(CFG, seed=100 + ctx.rank)  # different start on every rank
        r["spread_before"] = _spread(_flat(bare))
        rec = Recorder(f"{v}-test", ctx.rank)
        model = wrap(v, bare, bucket_mb=BUCKET_MB, recorder=rec)
        r["spread_after"] = _spread(_flat(bare))
        r["broadcast_rows"] = sum(1 for row in rec.collective_rows() if row["op"] == "broadcast")
        r["param_names"] = [n for n, _ in model.named_parameters()]
        # same start as single (seed 0) for the gradient checks
        with torch.no_grad():
            fresh = build_model(CFG)
            for p, q in zip(_tensors(bare), _tensors(fresh)):
                p.copy_(q)
        frozen0 = bare.frozen.detach().clone()
        rec.step = 1
        _backward(model, 1, ctx)
        model.finish_gradient_synchronization()
        r["grad_diff"] = _grad_diff(bare, ref1)
        r["tied_ratio"] = (bare.emb.weight.grad.norm() / ref1["emb.weight"].norm()).item()
        r["frozen_grad_none"] = bare.frozen.grad is None
        model.zero_grad()
        n_before = len(rec.collective_rows())
        rec.step = 2
        with model.no_sync():
            _backward(model, 2, ctx)
        model.finish_gradient_synchronization()
        r["rows_in_no_sync"] = len(rec.collective_rows()) - n_before
        rec.step = 3
        _backward(model, 3, ctx)
        model.finish_gradient_synchronization()
        r["accum_diff"] = _grad_diff(bare, ref23)
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
        r["frozen_same"] = torch.equal(bare.frozen, frozen0) if ctx.rank == 0 else True
        r["final_spread"] = _spread(_flat(bare))
        rows = [row for row in rec.collective_rows() if row["op"] == "all_reduce"]
        r["rows_step1"] = sum(1 for row in rows if row["step"] == 1)
        r["rows_step3"] = sum(1 for row in rows if row["step"] == 3)
        r["buckets_step1"] = sorted({row["bucket"] for row in rows if row["step"] == 1})
        r["buckets_step3"] = sorted({row["bucket"] for row in rows if row["step"] == 3})
        r["times_ok"] = all(row["t_end_ns"] >= row["t_launch_ns"] > 0 for row in rows)
        r["n_buckets"] = len(getattr(model, "buckets", []))
        out[v] = r
        dist.barrier()
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"ws{n}")
def checks(request: Any) -> tuple[int, dict[str, Any]]:
    res = launch(variant_checks, request.param, backend="gloo", timeout_s=120)
    return request.param, res[0]


def test_broadcast_makes_replicas_equal(checks: Any) -> None:
    _, res = checks
    for v, r in res.items():
        assert r["spread_before"] > 0.01, v
        assert r["spread_after"] == 0.0, v
        assert r["param_names"] == ["module." + n for n in TOY_NAMES], v


def test_gradients_are_averaged_and_tied_weight_reduced_once(checks: Any) -> None:
    ws, res = checks
    for v, r in res.items():
        assert r["grad_diff"] < 1e-6, (v, r["grad_diff"])
        assert r["tied_ratio"] == pytest.approx(1.0, abs=1e-5), v  # not x2, not x ws
        assert r["final_spread"] == 0.0, v


def test_frozen_parameter_untouched(checks: Any) -> None:
    for v, r in checks[1].items():
        assert r["frozen_grad_none"] and r["frozen_same"], v


def test_no_sync_accumulates_like_a_bigger_batch(checks: Any) -> None:
    for v, r in checks[1].items():
        assert r["rows_in_no_sync"] == 0, v
        assert r["accum_diff"] < 1e-6, (v, r["accum_diff"])


def test_recorder_rows_per_step(checks: Any) -> None:
    _, res = checks
    expected = {"naive": 5, "overlap": 5, "flat": 1, "central": 1, "ring": 1, "bucketed": 3}
    assert res["bucketed"]["n_buckets"] == 3
    assert res["bucketed"]["buckets_step1"] == [0, 1, 2]
    for v, r in res.items():
        assert r["broadcast_rows"] >= (0 if v == "torch_ddp" else 1), v
        assert r["times_ok"], v
        if v == "torch_ddp":  # one row per DDP bucket (DDP rebuilds buckets after step 1)
            assert r["rows_step1"] == len(r["buckets_step1"]) >= 1
            assert r["rows_step3"] == len(r["buckets_step3"]) >= 1
        else:
            assert r["rows_step1"] == r["rows_step3"] == expected[v], v


def test_assign_buckets_pure() -> None:
    assert assign_buckets([28, 308, 44, 308, 364], 419.4) == [[0, 1, 2], [3], [4]]
    assert assign_buckets([500, 10, 10], 100) == [[0], [1, 2]]          # oversize alone
    assert assign_buckets([10, 10, 10], 1e9, keys=["a", "a", "b"]) == [[0, 1], [2]]
    assert assign_buckets([], 10) == []


def test_registry_and_wrap_errors() -> None:
    assert set(VARIANTS) == set(MULTIPROCESS) | {"single", "manual", "data_parallel"}
    assert PROCESSES["manual"] == 1 and PROCESSES["ring"] == "N"
    assert launch_world_size("single", 4) == 1 and launch_world_size("bucketed", 4) == 4
    with pytest.raises(UsageError, match="one process"):
        wrap("manual", torch.nn.Linear(2, 2))
    with pytest.raises(UsageError, match="valid choices"):
        wrap("nope", torch.nn.Linear(2, 2))
