"""``verify``: every DP variant must end where ``single`` ends, from the same start and data.

Why it is a meaningful test: with a mean-reduced loss, the average of N shard gradients IS the
full-batch gradient, so after K SGD steps every correct variant holds the same parameters as
one process training on the whole global batch, up to float summation order. Bugs show up
as large differences: summing instead of averaging (x N), reducing a tied weight twice,
touching a frozen parameter, skipping the initial broadcast, losing gradients of a bucket.

Sharded variants (zero1, torch_zero1, fsdp, torch_fsdp) are compared on their FULL parameters
(``gather_full_params()`` for the FSDPs). ``fsdp`` is also run with each half ``compute_dtype``
(rows ``fsdp[float16]`` and ``fsdp[bfloat16]``): master weights stay float32, so the rows are held
to :func:`compute_tolerance`, the half type's rounding per step (toy at 2 and 3 ranks, 5 steps:
measured <= 1e-4 for float16 and <= 9e-4 for bfloat16, allowed 1.2e-3 and 9.8e-3).

``verify --comm-hook fp16,powersgd`` adds rows ``torch_ddp[<hook>]``: DDP with that comm hook.
Compression changes the gradients by design, so those rows are ``lossy`` with their measured
difference (a failure only if the replicas drift apart or the result is not finite); ``bf16``
is skipped with the reason where the backend refuses it (gloo). These rows use one bucket
(several PowerSGD buckets can deadlock on gloo; see ``_train``).

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

from dpcore.contract.config import (
    COMPUTE_DTYPES,
    PRECISION_TORCH,
    VERIFY_MODELS,
    TrainConfig,
    check_model_name,
    is_model_spec,
)
from dpcore.contract.errors import JobFailed
from dpcore.contract.limits import in_torchrun
from dpcore.contract.options import VerifyOptions
from dpcore.write.capture.comm_log import PhaseTimer
from dpcore.write.dp.variants import MULTIPROCESS, SINGLE_PROCESS, VARIANTS
from dpcore.write.runtime.context import DistContext
from dpcore.write.runtime.launch import launch, place
from dpcore.write.training.precision import resolve_dtype
from dpcore.write.training.trainer import local_context, make_trainer
from dpcore.write.training.workload import load_workload, param_bytes

#: What verify's spawned ranks run: the forkserver imports it (and the trainer with it) once.
PRELOAD = ("dpcore.write.commands.verify",)
# per-rank batch and bucket size used by verify (small buckets -> several buckets even on toy)
VERIFY_BATCH = {"toy": 4, "mlp": 8, "transformer": 2, "einsum": 16}
VERIFY_BUCKET_MB = {"toy": 0.0004, "mlp": 1.0, "transformer": 1.0, "einsum": 4.0}
VERIFY_LR = {"toy": 0.1}
COLUMNS = ("variant", "world_size", "max_abs_diff", "tolerance", "verdict")
#: ``single``'s verdict: it is what the others are compared with (one process, the whole batch),
#: so its row shows world size 1 and no difference.
REFERENCE = "reference (the others are compared with it)"
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
    check_model_name(model, VERIFY_MODELS)  # before the per-model tables are indexed
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
    a lost bucket), which moves parameters by about lr * |grad| per step. Adam / AdamW get
    10x more: they divide each element's step by its own gradient scale, so the summation-order
    noise of a near-zero gradient becomes a visible fraction of lr (measured on the tiny
    transformer: ~2.5e-5 after 3 steps for every DP variant, torch's included).

    Under bf16 / fp16 autocast (``--dtype``; ``single`` runs at the same dtype) the variants
    differ from ``single`` by the half type's rounding of differently split matmuls and sums,
    so the allowance is :func:`compute_tolerance`'s for that type, per step."""
    adaptive = cfg.optimizer in ("adam", "adamw")
    if cfg.dtype in ("bf16", "fp16"):
        return compute_tolerance(cfg, PRECISION_TORCH[cfg.dtype]) * (10 if adaptive else 1)
    per_step = 1e-6
    wide = cfg.model in ("transformer", "einsum") or is_model_spec(cfg.model)
    return per_step * max(1, cfg.steps) * (10 if wide else 1) * (10 if adaptive else 1)


def compute_tolerance(cfg: TrainConfig, compute_dtype: str) -> float:
    """Allowed max |diff| of ``fsdp`` computing in a half type against float32 ``single``.

    The forward/backward round to the half type's precision each step (unit roundoff u =
    2^-11 for float16, 2^-8 for bfloat16) and the float32 update carries that error into the
    parameters. Allowed: u/2 per step (10x for wide models), about 10x what toy shows at 2
    and 3 ranks, while a DP bug (x N gradients, a lost shard, a stale weight) moves the
    parameters by about lr x |grad| per step, far more."""
    unit = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[compute_dtype]
    wide = cfg.model in ("transformer", "einsum") or is_model_spec(cfg.model)
    return unit / 2 * max(1, cfg.steps) * (10 if wide else 1)


def verify_rows(wanted: list[str], optimizer: str = "sgd", comm_hooks: tuple[str, ...] = (),
                dtype: str = "fp32") -> list[str]:
    """Row names in table order: the variants, plus ``fsdp[<dtype>]`` after ``fsdp``.

    The half-compute rows always train with SGD (named ``fsdp[float16,sgd]`` when the run's
    optimizer is another): Adam's step is about lr x sign(g) for tiny gradients, so rounding a
    near-zero gradient can flip a whole step and no tolerance would separate noise from bugs;
    the optimizer itself runs on float32 master shards either way (checked by the float32
    ``fsdp`` row with the run's optimizer). Under bf16 / fp16 autocast (``dtype``) only the
    matching compute dtype is coherent, so only its row is added."""
    rows: list[str] = []
    suffix = "" if optimizer == "sgd" else ",sgd"
    halves = COMPUTE_DTYPES if dtype == "fp32" else (PRECISION_TORCH[dtype],)
    for v in [v for v in VARIANTS if v in wanted]:
        rows.append(v)
        if v == "fsdp":
            rows += [f"fsdp[{dt}{suffix}]" for dt in halves]
        if v == "torch_ddp":
            rows += [f"torch_ddp[{h}]" for h in comm_hooks if h != "none"]
    return rows


def _split_row(row: str) -> tuple[str, str]:
    """'fsdp[float16]' / 'fsdp[float16,sgd]' -> ('fsdp', 'float16'); 'zero1' -> ('zero1', '')."""
    if row.endswith("]") and "[" in row:
        v, dt = row[:-1].split("[", 1)
        return v, dt.split(",")[0]
    return row, ""


def _train(ctx: DistContext, variant: str, cfg: TrainConfig, replicas: int | None
           ) -> tuple[dict[str, torch.Tensor] | None, str | None]:
    variant, option = _split_row(variant)
    if variant == "torch_ddp" and option:  # torch_ddp[<comm hook>]
        # one bucket: PowerSGD launches each bucket's P all-reduce from a future's callback,
        # and with several buckets on gloo the ranks can launch them in different orders and
        # deadlock (seen here: verify's tiny buckets hung both ranks in the hook)
        hook, cfg = option, replace(cfg, bucket_mb=max(cfg.bucket_mb, 1024.0))
    elif option:
        hook, cfg = "none", replace(cfg, compute_dtype=option, optimizer="sgd")
    else:
        hook = "none"
    tr = make_trainer(variant, ctx, cfg, replicas=replicas, comm_hook=hook)
    if tr.skip_reason:
        return None, tr.skip_reason
    for step in range(cfg.steps):
        x, y = tr.batch(step)
        tr.step(x, y, PhaseTimer(ctx.device))
    gather = getattr(tr.model, "gather_full_params", None)
    if gather is None:
        return tr.named_parameters_cpu(), None
    params = {n: t.detach().cpu().clone() for n, t in gather().items()}
    params.update({n: b.detach().cpu().clone() for n, b in tr.module.named_buffers()})
    return params, None


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
        params, skip = _train(ctx, v, cfg, None)
        if params is None:  # skipped with a reason (same decision on every rank)
            out[v] = (None, 0.0, skip)
            continue
        spread = _rank_spread(ctx, params)
        # numpy, not tensors: torch pickles tensors as shared-memory fds, which can vanish
        # when the rank exits before the parent has read the result queue
        out[v] = ({k: t.numpy() for k, t in params.items()} if ctx.rank == 0 else None, spread,
                  None)
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
               timeout_s: float = 300, cfg: TrainConfig | None = None,
               comm_hooks: list[str] | None = None, device: str = "auto",
               dtype: str | None = None) -> tuple[list[dict[str, Any]], bool]:
    """:func:`verify` for a library caller or a test that names the options one by one
    (``dtype`` None: ``cfg``'s, else auto). UsageError naming what is wrong."""
    opts = VerifyOptions(model=model, world_size=world_size, steps=steps, backend=backend,
                         variants=tuple(VARIANTS if not variants else variants), timeout_s=timeout_s,
                         device=device, dtype=dtype or (cfg.dtype if cfg is not None else "auto"),
                         comm_hooks=tuple(comm_hooks or ("none",)))
    return verify(opts, cfg)


def verify(opts: VerifyOptions, cfg: TrainConfig | None = None) -> tuple[list[dict[str, Any]], bool]:
    """Train each variant ``opts.steps`` steps at ``opts.world_size`` and compare with ``single``.

    ``opts.device`` / ``opts.dtype``: ``--device`` and ``--dtype``, resolved once here, so
    ``single`` and every variant train on the same device type in the same precision. ``cfg``:
    the training config (None: :func:`verify_config` of the model). Returns one row per variant
    (``COLUMNS``) and ``ok`` (no row DIFFERS or errored; skipped rows are fine). Under torchrun
    only rank 0 gets rows; other ranks get ``([], True)``.
    """
    wanted, world_size, backend, timeout_s, device = (list(opts.variants), opts.world_size, opts.backend,
                                                      opts.timeout_s, opts.device)
    placement = place(device, backend, world_size)
    cfg = cfg or verify_config(opts.model, opts.steps)
    cfg = replace(cfg, steps=opts.steps, dtype=resolve_dtype(opts.dtype, placement.device))
    local = local_context(placement.device)
    ref, _ = _train(local, "single", cfg, world_size)
    assert ref is not None
    results: dict[str, tuple[dict | None, float, str | None]] = {"single": (ref, 0.0, None)}
    for v in SINGLE_PROCESS:
        if v in wanted and v != "single":
            params, skip = _train(local, v, cfg, world_size)
            results[v] = (params, 0.0, skip)
    # the half-compute rows train with SGD: their reference is single with SGD
    sgd_ref = ref
    if cfg.optimizer != "sgd" and "fsdp" in wanted:
        sgd, _ = _train(local, "single", replace(cfg, optimizer="sgd"), world_size)
        assert sgd is not None
        sgd_ref = sgd
    hooks = opts.comm_hooks
    multi = [v for v in verify_rows(wanted, cfg.optimizer, hooks, cfg.dtype) if _split_row(v)[0] in MULTIPROCESS]
    if multi:
        try:
            got = [launch(_verify_worker, world_size, backend=backend, args=(multi, cfg),
                          timeout_s=timeout_s, preload=PRELOAD, device=device)]
        except JobFailed:
            got = []
            for v in multi:  # isolate the failing variant(s)
                try:
                    got.append(launch(_verify_worker, world_size, backend=backend,
                                      args=([v], cfg), timeout_s=timeout_s, preload=PRELOAD,
                                      device=device))
                except JobFailed as exc:
                    results[v] = (None, 0.0, "error: " + exc.message.strip().splitlines()[0])
        if in_torchrun() and got and got[0][0] is None:
            return [], True
        for per_rank in got:
            for v, (params, _, skip) in per_rank[0].items():
                if params is None:
                    results[v] = (None, 0.0, skip)
                    continue
                spread = max(r[v][1] for r in per_rank if r is not None)
                results[v] = ({k: torch.from_numpy(a) for k, a in params.items()}, spread, None)
    rows, ok = [], True
    for v in verify_rows(wanted, cfg.optimizer, hooks, cfg.dtype):
        params, spread, note = results[v]
        if v == "single":  # the reference: one process with the whole batch, at any world size
            rows.append(_row(v, 1, None, tolerance(cfg), REFERENCE))
            continue
        base, option = _split_row(v)
        compute_dtype = option if base == "fsdp" else ""
        tol = compute_tolerance(cfg, compute_dtype) if compute_dtype else tolerance(cfg)
        if note and note.startswith("error"):
            rows.append(_row(v, world_size, None, tol, note))
            ok = False
        elif params is None:
            rows.append(_row(v, world_size, None, tol, f"skipped: {note}"))
        else:
            diff = max(max_abs_diff(params, sgd_ref if compute_dtype else ref), spread)
            verdict = "match" if diff <= tol else "DIFFERS"
            if base == "torch_ddp" and option:
                # a compressing comm hook changes the gradients by design: its difference is
                # the measured cost of the compression, not a bug (still a failure if the
                # replicas drifted apart or the result is not a number)
                verdict = "lossy" if spread <= tol and diff == diff and diff != float("inf") else "DIFFERS"
            ok &= verdict in ("match", "lossy")
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
