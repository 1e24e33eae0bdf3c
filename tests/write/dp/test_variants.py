"""DP wrappers: the one interface, and the multi-process variants on real gloo groups.

One worker per world size (2 and 3 ranks, one launch each) checks every multi-process variant:
broadcast at construction, gradient equal to the single-process full-batch gradient (tied
weight reduced once, i.e. not doubled), frozen parameter untouched, no_sync accumulation ==
bigger batch, the Recorder's rows, and the same gradients with the null recorder. The
interface checks need no process group.
"""
from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dpcore.contract.config import SINGLE_PROCESS, TrainConfig
from dpcore.contract.errors import UsageError
from dpcore.write.capture.comm_log import NULL_RECORDER, NullRecorder, Recorder
from dpcore.write.dp.variants import MULTIPROCESS, REGISTRY, REPLICATED, VARIANTS, Wrapper, assign_buckets, wrap
from dpcore.write.dp.variants.base import DPWrapper
from dpcore.write.runtime.launch import launch
from dpcore.write.training.models import build_module, loss_fn, make_batch, shard

CFG = TrainConfig(model="toy", batch_size=4, lr=0.1)
TOY_NAMES = [n for n, _ in build_module(CFG).named_parameters()]
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
    m = build_module(CFG)
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
    for v in REPLICATED:  # the sharded variants: tests/write/dp/test_sharded.py
        r: dict[str, Any] = {}
        bare = build_module(CFG, seed=100 + ctx.rank)  # different start on every rank
        r["spread_before"] = _spread(_flat(bare))
        rec = Recorder(f"{v}-test", ctx.rank)
        model = wrap(v, bare, bucket_mb=BUCKET_MB, recorder=rec)
        r["spread_after"] = _spread(_flat(bare))
        r["broadcast_rows"] = sum(1 for row in rec.collective_rows() if row["op"] == "broadcast")
        r["param_names"] = [n for n, _ in model.named_parameters()]
        # same start as single (seed 0) for the gradient checks
        with torch.no_grad():
            fresh = build_module(CFG)
            for p, q in zip(_tensors(bare), _tensors(fresh)):
                p.copy_(q)
        frozen0 = bare.frozen.detach().clone()
        rec.step = 1
        _backward(model, 1, ctx)
        model.finish_gradient_synchronization()
        r["grad_diff"] = _grad_diff(bare, ref1)
        grads1 = {n: p.grad.clone() for n, p in bare.named_parameters() if p.grad is not None}
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
        r["null_grad_diff"] = _null_recorder_grad_diff(v, ctx, grads1)
        out[v] = r
        dist.barrier()
    return out


def _null_recorder_grad_diff(v: str, ctx: Any, recorded: dict[str, torch.Tensor]) -> float:
    """Step 1 again with the default (null) recorder: recording must not change the maths."""
    model = wrap(v, build_module(CFG), bucket_mb=BUCKET_MB)
    _backward(model, 1, ctx)
    model.finish_gradient_synchronization()
    got = {n: p.grad for n, p in model.module.named_parameters() if p.grad is not None}
    if got.keys() != recorded.keys():
        return float("inf")
    return max((got[n] - recorded[n]).abs().max().item() for n in got)


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


def test_null_recorder_gives_the_same_gradients(checks: Any) -> None:
    for v, r in checks[1].items():
        if v == "torch_ddp":  # recording swaps DDP's C++ path for our hook: float noise only
            assert r["null_grad_diff"] < 1e-6, (v, r["null_grad_diff"])
        else:                 # same code either way: bitwise equal
            assert r["null_grad_diff"] == 0.0, (v, r["null_grad_diff"])


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
    with pytest.raises(UsageError, match="one process"):
        wrap("manual", torch.nn.Linear(2, 2))
    with pytest.raises(UsageError, match="valid choices"):
        wrap("nope", torch.nn.Linear(2, 2))


# ------------------------------------------------------------------ the one interface
def test_every_variant_is_a_complete_wrapper() -> None:
    for v, cls in REGISTRY.items():
        assert issubclass(cls, Wrapper), v
        assert not inspect.isabstract(cls), (v, cls.__abstractmethods__)
        assert cls.name == v
        assert cls.processes == (1 if v in SINGLE_PROCESS else "N"), v
        for call in ("forward", "finish_gradient_synchronization", "on_train_batch_start",
                     "no_sync", "forward_loss", "optim_parameters"):
            assert callable(getattr(cls, call)), (v, call)
        assert cls.skip_reason is None and cls.loss_terms == 1, v  # per-instance only
    assert inspect.isabstract(Wrapper) and inspect.isabstract(DPWrapper)


def test_a_variant_missing_a_call_cannot_be_built() -> None:
    class NoSync(DPWrapper):  # forgot _sync
        name = "broken"

    class NoFinish(Wrapper):  # forgot finish_gradient_synchronization
        name = "broken"
        processes = 1

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(TypeError, match="_sync"):
        NoSync(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="finish_gradient_synchronization"):
        NoFinish()


@pytest.mark.parametrize("v", SINGLE_PROCESS)
def test_one_process_variants_answer_every_call(v: str) -> None:
    """The trainer's calls, on the one-process variants (no process group needed)."""
    model = REGISTRY[v](build_module(CFG), replicas=2)
    assert isinstance(model.module, torch.nn.Module)
    if model.skip_reason is not None:  # data_parallel without 2 GPUs
        assert v == "data_parallel" and "GPUs" in model.skip_reason
        return
    x, y = make_batch(CFG, "toy", 0, 8)
    model.on_train_batch_start()
    with model.no_sync():
        assert not model.require_backward_grad_sync
        loss = model.forward_loss(x, y, loss_fn("toy"))
    assert model.require_backward_grad_sync
    loss.backward()
    model.finish_gradient_synchronization()
    assert model.loss_terms == (2 if v == "manual" else 1)
    params = model.optim_parameters()
    assert params and all(p.requires_grad and p.grad is not None for p in params)
    assert len(params) == model.loss_terms * 5  # toy: 5 trainable tensors per replica


# ------------------------------------------------------------------ the null recorder
def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(f) for n, f in vars(cls).items()
            if not n.startswith("_") and inspect.isfunction(f)}


def test_null_recorder_has_every_recorder_method_with_its_signature() -> None:
    real, null = _public_methods(Recorder), _public_methods(NullRecorder)
    assert real and real == null  # every one overridden in NullRecorder itself, same signature
    public_state = [a for a in Recorder.__slots__ if not a.startswith("_")]
    rec = Recorder("job", 3, offset_ns=7)
    for attr in public_state + ["enabled"]:
        assert type(getattr(NULL_RECORDER, attr)) is type(getattr(rec, attr)), attr
    assert rec.enabled and not NULL_RECORDER.enabled


def test_null_recorder_records_nothing_and_keeps_no_state() -> None:
    rec = NULL_RECORDER
    rec.step = 5
    assert rec.step == -1
    with pytest.raises(AttributeError):
        rec.job_id = "x"  # type: ignore[misc]
    idx = rec.launch("all_reduce", "native", 8, 0)
    assert idx == -1
    rec.done(idx)
    rec.message("ring", 0, "reduce_scatter", 0, 0, 1, 0, 8, 1, 2, "send")
    assert rec.collective_rows() == [] and rec.message_rows() == []
    import time
    t0 = time.perf_counter_ns()
    assert t0 <= rec.now() <= time.perf_counter_ns()  # still the clock


def test_every_recorder_parameter_defaults_to_the_null_recorder() -> None:
    from dpcore.write.dp import comm
    from dpcore.write.dp.comm import central, naive, ring
    from dpcore.write.dp.variants import base, torch_ddp
    from dpcore.write.training import trainer as train
    fns = [wrap, train.make_trainer, train.Trainer, comm.all_reduce, comm.native_all_reduce,
           ring.ring_all_reduce, naive.naive_all_reduce, central.central_all_reduce,
           base.DPWrapper, base.broadcast_module, torch_ddp.TorchDDP]
    for fn in fns:
        assert inspect.signature(fn).parameters["recorder"].default is NULL_RECORDER, fn
