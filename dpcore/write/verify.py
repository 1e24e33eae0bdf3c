"""``verify``: every DP variant must end where ``single`` ends, from the same start and data.

Why it is a meaningful test: with a mean-reduced loss, the average of N shard gradients IS the
full-batch gradient, so after K SGD steps every correct variant holds the same parameters as
one process training on the whole global batch, up to float summation order. Bugs show up
as large differences: summing instead of averaging (x N), reducing a tied weight twice,
touching a frozen parameter, skipping the initial broadcast, losing gradients of a bucket.

All multi-process variants run in ONE launch (sequentially, fresh model each), which keeps
verify fast; if that launch fails, each variant is re-run alone so that one broken variant
gets an ``error`` verdict instead of hiding the others. Single-process variants (single,
manual, data_parallel) run in this process with ``replicas=N``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from dpcore.contract.config import TrainConfig, is_model_spec
from dpcore.contract.errors import JobFailed, UsageError
from dpcore.write.recorder import PhaseTimer
from dpcore.write.launch import DistContext, in_torchrun, launch
from dpcore.write.models import MODEL_NAMES
from dpcore.write.train import local_context, make_trainer
from dpcore.write.variants import MULTIPROCESS, SINGLE_PROCESS, VARIANTS
from dpcore.write.workload import load_workload, param_bytes

# per-rank batch and bucket size used by verify (small buckets -> several buckets even on toy)
VERIFY_BATCH = {"toy": 4, "mlp": 8, "transformer": 2, "einsum": 16}
VERIFY_BUCKET_MB = {"toy": 0.0004, "mlp": 1.0, "transformer": 1.0, "einsum": 4.0}
VERIFY_LR = {"toy": 0.1}
COLUMNS = ("variant", "world_size", "max_abs_diff", "tolerance", "verdict")
#: A user's MODULE:FUNCTION model: per-rank batch, and buckets sized so that its gradients
#: fill about this many of them (several buckets, whatever the model's size).
SPEC_VERIFY_BATCH, SPEC_VERIFY_BUCKETS = 4, 4


def verify_config(model: str, steps: int, **overrides: Any) -> TrainConfig:
    """The training config every variant of a verify run shares (weak scaling, fixed seed).

    For a user's ``MODULE:FUNCTION`` the bucket size comes from its parameter bytes (the
    workload is loaded here, in this process), so ``bucketed`` and ``torch_ddp`` really
    split the gradients into several buckets."""
    if is_model_spec(model):
        bucket_mb = overrides.pop("bucket_mb", None)
        if bucket_mb is None:
            bucket_mb = spec_bucket_mb(load_workload(model, overrides.get("seed", 0)).model)
        base = dict(model=model, batch_size=SPEC_VERIFY_BATCH, scaling="weak", steps=steps,
                    warmup=0, profile_steps=0, bucket_mb=bucket_mb, lr=0.01, seed=0)
        base.update(overrides)
        return TrainConfig(**base)
    if model not in MODEL_NAMES:
        raise UsageError(f"unknown model {model!r}; valid choices: {', '.join(MODEL_NAMES)} "
                         "or MODULE:FUNCTION")
    base = dict(model=model, batch_size=VERIFY_BATCH[model], scaling="weak", steps=steps,
                warmup=0, profile_steps=0, bucket_mb=VERIFY_BUCKET_MB[model],
                lr=VERIFY_LR.get(model, 0.01), seed=0)
    base.update(overrides)
    return TrainConfig(**base)


def spec_bucket_mb(model: torch.nn.Module) -> float:
    """Verify's bucket size for a user's model: its trainable bytes split about
    ``SPEC_VERIFY_BUCKETS`` ways, so the bucketed variants really use several buckets."""
    return max(param_bytes(model) / SPEC_VERIFY_BUCKETS / 2**20, 1e-6)


def tolerance(cfg: TrainConfig) -> float:
    """Allowed max |diff|: float32 summation-order noise grows with steps; half types are loose.

    Wide reductions (transformer, einsum) and users' models, whose size we do not know, get
    10x: still far below what a real DP bug costs (x N gradients, a tied weight reduced twice,
    a lost bucket), which moves parameters by about lr * |grad| per step."""
    per_step = 1e-6 if cfg.dtype == "float32" else 1e-2
    wide = cfg.model in ("transformer", "einsum") or is_model_spec(cfg.model)
    return per_step * max(1, cfg.steps) * (10 if wide else 1)


def _train(ctx: DistContext, variant: str, cfg: TrainConfig, replicas: int | None
           ) -> tuple[dict[str, torch.Tensor] | None, str | None]:
    tr = make_trainer(variant, ctx, cfg, replicas=replicas)
    if tr.skip_reason:
        return None, tr.skip_reason
    for step in range(cfg.steps):
        x, y = tr.batch(step)
        tr.step(x, y, PhaseTimer(ctx.device))
    return tr.named_parameters_cpu(), None


def _rank_spread(ctx: DistContext, params: dict[str, torch.Tensor]) -> float:
    """Max |params - rank 0's params| over all ranks (replicas must stay identical)."""
    flat = torch.cat([p.reshape(-1).double() for p in params.values()]).to(ctx.device)
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    spread = (flat - ref).abs().max().reshape(1)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    return float(spread.item())


def _verify_worker(ctx: DistContext, variants: list[str], cfg: TrainConfig) -> dict[str, Any]:
    """Rank body: train each variant; rank 0 returns final params, every rank the spread."""
    out: dict[str, Any] = {}
    for v in variants:
        params, _ = _train(ctx, v, cfg, None)
        assert params is not None
        spread = _rank_spread(ctx, params)
        # numpy, not tensors: torch pickles tensors as shared-memory fds, which can vanish
        # when the rank exits before the parent has read the result queue
        out[v] = ({k: t.numpy() for k, t in params.items()} if ctx.rank == 0 else None, spread)
        dist.barrier()
    return out


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest element-wise difference over every tensor; inf if names or shapes differ."""
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return float("inf")
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()),
               default=0.0)


def _row(variant: str, ws: int, diff: float | None, tol: float, verdict: str) -> dict[str, Any]:
    return {"variant": variant, "world_size": ws, "max_abs_diff": diff, "tolerance": tol,
            "verdict": verdict}


def run_verify(world_size: int, model: str = "toy", steps: int = 5,
               variants: list[str] | None = None, backend: str = "auto",
               timeout_s: float = 300, cfg: TrainConfig | None = None
               ) -> tuple[list[dict[str, Any]], bool]:
    """Train each variant ``steps`` steps at ``world_size`` and compare with ``single``.

    Returns one row per variant (``COLUMNS``) and ``ok`` (no row DIFFERS or errored; skipped
    rows are fine). Under torchrun only rank 0 gets rows; other ranks get ``([], True)``.
    """
    if world_size < 1:
        raise UsageError(f"world size must be >= 1, got {world_size}")
    wanted = list(VARIANTS) if not variants else list(variants)
    bad = [v for v in wanted if v not in VARIANTS]
    if bad:
        raise UsageError(f"unknown variant {', '.join(bad)}; valid choices: {', '.join(VARIANTS)}")
    cfg = cfg or verify_config(model, steps)
    cfg = replace(cfg, steps=steps)
    tol = tolerance(cfg)
    local = local_context()
    ref, _ = _train(local, "single", cfg, world_size)
    assert ref is not None
    results: dict[str, tuple[dict | None, float, str | None]] = {"single": (ref, 0.0, None)}
    for v in SINGLE_PROCESS:
        if v in wanted and v != "single":
            params, skip = _train(local, v, cfg, world_size)
            results[v] = (params, 0.0, skip)
    multi = [v for v in wanted if v in MULTIPROCESS]
    if multi:
        try:
            got = [launch(_verify_worker, world_size, backend=backend, args=(multi, cfg),
                          timeout_s=timeout_s)]
        except JobFailed:
            got = []
            for v in multi:  # isolate the failing variant(s)
                try:
                    got.append(launch(_verify_worker, world_size, backend=backend,
                                      args=([v], cfg), timeout_s=timeout_s))
                except JobFailed as exc:
                    results[v] = (None, 0.0, "error: " + exc.message.strip().splitlines()[0])
        if in_torchrun() and got and got[0][0] is None:
            return [], True
        for per_rank in got:
            for v, (params, _) in per_rank[0].items():
                spread = max(r[v][1] for r in per_rank if r is not None)
                results[v] = ({k: torch.from_numpy(a) for k, a in params.items()}, spread, None)
    rows, ok = [], True
    for v in [v for v in VARIANTS if v in wanted]:
        params, spread, note = results[v]
        if note and note.startswith("error"):
            rows.append(_row(v, world_size, None, tol, note))
            ok = False
        elif params is None:
            rows.append(_row(v, world_size, None, tol, f"skipped: {note}"))
        else:
            diff = max(max_abs_diff(params, ref), spread)
            verdict = "match" if diff <= tol else "DIFFERS"
            ok &= verdict == "match"
            rows.append(_row(v, world_size, diff, tol, verdict))
    return rows, ok


def format_table(rows: list[dict[str, Any]]) -> str:
    """Plain-text table of verify rows (what ``python -m dpcore verify`` prints)."""
    head = ["variant", "world", "max |diff|", "tolerance", "verdict"]
    body = [[r["variant"], str(r["world_size"]),
             "-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.3e}",
             f"{r['tolerance']:.1e}", r["verdict"]] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body])
