"""One training step of any DP variant, with phase timing (used by ``verify`` and ``profile``).

Usage on every rank of a launched job::

    tr = make_trainer("bucketed", ctx, cfg, recorder)
    for step in range(cfg.steps):
        x, y = tr.batch(step)            # this rank's shard of the global batch, on its device
        recorder.step = step             # the CALLER tags collectives with the step number
        loss = tr.step(x, y, timer)      # timer.finish() then gives fwd/bwd/sync/opt ms

Single-process variants (``REGISTRY[v].processes == 1``: single, manual, data_parallel) run
only in a job launched with ONE process; the logical world size N is passed as
``make_trainer(..., replicas=N)``: ``manual`` builds N replicas, ``data_parallel`` uses up to
N GPUs, and all three consume the whole global batch ``cfg.global_batch(N)`` (so ``single`` at
N is the reference for the N-rank variants). Multi-process variants consume
``cfg.local_batch(world_size)`` samples per rank per step. Every variant answers the
:class:`~dpcore.write.dp.variants.Wrapper` calls, so the step below is the same code for all.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

import torch
import torch._dynamo  # noqa: F401  (see below)
import torch.nn as nn
from torch.profiler import record_function

from dpcore.contract.config import (
    COMM_HOOKS,
    PARAM_SHARDED,
    SHARDED,
    TrainConfig,
    check_choices,
    gloo_cuda_refusal,
    is_model_spec,
)
from dpcore.contract.errors import UsageError, choices_error
from dpcore.write.capture.backward_end import BackwardEnd
from dpcore.write.capture.comm_log import NULL_RECORDER, PhaseTimer, Recorder, clock_for
from dpcore.write.dp.variants import REGISTRY, VARIANTS, Wrapper, optimizer_class, wrap
from dpcore.write.runtime.context import DistContext
from dpcore.write.training.models import build_module, loss_fn, make_batch
from dpcore.write.training.precision import autocast, grad_scaler, param_dtype_name, resolve_dtype, set_tf32
from dpcore.write.training.workload import Inputs, TupleInputs, Workload, load_workload, shard_batch, workload_batch

# ``torch.optim`` imports torch._dynamo lazily on the first optimizer (seconds on a busy CPU);
# importing it above lets the launcher's forkserver preload it once instead of in every rank.


class Trainer:
    """A model wrapped in one DP variant plus its ``cfg.optimizer`` (see module docstring)."""

    def __init__(self, variant: str, ctx: DistContext, cfg: TrainConfig,
                 recorder: Recorder = NULL_RECORDER, replicas: int | None = None,
                 bucket_mb: float | None = None, comm_hook: str = "none", delay_s: float = 0.0) -> None:
        if variant not in REGISTRY:
            raise choices_error("variant", variant, VARIANTS)
        check_choices((comm_hook,), "comm hook", COMM_HOOKS)
        cfg = replace(cfg, dtype=resolve_dtype(cfg.dtype, ctx.device.type))
        self.ctx, self.cfg = ctx, cfg
        if ctx.device.type == "cuda":
            set_tf32(cfg.tf32)
        #: fp16's gradient scaler (None for fp32 and bf16); sharded ranks skip a step together
        self.scaler = grad_scaler(ctx.device, cfg.dtype, sync_ranks=variant in SHARDED)
        self.single_process = REGISTRY[variant].processes == 1
        if self.single_process and ctx.world_size != 1:
            raise UsageError(f"variant {variant!r} runs in one process: launch it with world "
                             f"size 1 and pass the replica count as replicas=N "
                             f"(got a {ctx.world_size}-process job)")
        self.replicas = int(replicas or ctx.world_size)
        # ranks sharing GPUs over gloo: a variant needing what gloo lacks on CUDA tensors is
        # skipped before it is built (its first collective could crash the rank)
        self.skip_reason: str | None = gloo_cuda_refusal(variant, ctx.backend, ctx.device.type)
        if self.skip_reason:
            return
        # A user's MODULE:FUNCTION is loaded here, in this rank, with torch seeded from
        # cfg.seed: same initial weights everywhere, and nothing of the user's pickled.
        self.workload: Workload | None = (load_workload(cfg.model, cfg.seed)
                                          if is_model_spec(cfg.model) else None)
        module = (TupleInputs(self.workload.model).to(ctx.device) if self.workload
                  else build_module(cfg, device=ctx.device))
        self._recorder = recorder
        # A CUDA job's collectives and messages are timed by events on the stream (NCCL returns
        # at enqueue, so a host clock read after a call or in its callback is the launch time);
        # a CPU job keeps the host clock. Set before the variant's first (init) collective.
        recorder.time_on(ctx.device)
        # DDP waits for its buckets *inside* loss.backward() (the reducer's final autograd
        # callback), so "backward" would swallow the wait: the bwd phase ends where backward's
        # computation did (BackwardEnd: the last gradient's accumulation on the host clock, a
        # final callback queued ahead of DDP's on the stream's), the rest of backward() is grad
        # sync. On CUDA for DDP only: FSDP2 queues its own final callback first.
        split = REGISTRY[variant].grad_sync_in_backward and (ctx.device.type == "cpu" or variant == "torch_ddp")
        self._bwd_end: BackwardEnd | None = (
            BackwardEnd(recorder.clock if recorder.clock is not None else clock_for(ctx.device))
            if split else None)
        self._split_backward = split
        # grads.csv: when each gradient became ready (one clock read per gradient), for the
        # multi-process variants that a profile records; the what-if model re-packs these.
        log_grads = recorder.enabled and not self.single_process
        # Hooks of one tensor run in registration order, and a variant's own hook launches the
        # bucket its gradient completes: registered before the variant wraps the model, the stamp
        # is taken when the gradient is ready, not after that launch call.
        early = self._hook_grads(module, log_grads) if self._split_backward or log_grads else []
        self.model: Wrapper = (REGISTRY[variant](module, replicas=self.replicas)
                               if self.single_process else
                               wrap(variant, module, bucket_mb=cfg.bucket_mb if bucket_mb is None else bucket_mb,
                                    recorder=recorder,
                                    compute_dtype=param_dtype_name(cfg.dtype, cfg.compute_dtype)
                                    if variant in PARAM_SHARDED else None,
                                    comm_hook=comm_hook if variant == "torch_ddp" else "none",
                                    powersgd_rank=cfg.powersgd_rank))
        self.skip_reason = self.model.skip_reason
        self.loss_fn = self.workload.loss_fn if self.workload else loss_fn(cfg.model)
        self.opt = self.model.make_optimizer(optimizer_class(cfg.optimizer), lr=cfg.lr)
        self.global_batch = cfg.global_batch(self.replicas if self.single_process
                                             else ctx.world_size)
        self._delay_s = delay_s
        self.samples_per_step = (self.global_batch if self.single_process
                                 else cfg.local_batch(ctx.world_size))
        #: dpcore.write.capture.memory's StepSampler during its one measured step, else None: the timed
        #: steps pay one ``if`` per phase for it.
        self.probe = None
        if self._split_backward or log_grads:
            named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
            if [id(p) for _, p in named] != [id(p) for p, _ in early]:
                # the variant replaced the parameters (fsdp's shards): stamp the ones it trains,
                # after its own hooks (the what-if does not model these variants)
                for _, handle in early:
                    handle.remove()
                self._hook_grads(self.module, log_grads)
            if log_grads:
                recorder.set_params([(n, p.numel() * p.element_size()) for n, p in named])

    def _hook_grads(self, module: nn.Module, log: bool) -> list[tuple[nn.Parameter, Any]]:
        """Register the grad-ready hook on every trainable parameter of ``module``, indexed in
        registration order (grads.csv's ``param``); (parameter, handle) pairs."""
        return [(p, p.register_post_accumulate_grad_hook(self._make_grad_hook(i, log)))
                for i, p in enumerate(q for q in module.parameters() if q.requires_grad)]

    def _make_grad_hook(self, index: int, log: bool):
        rec, end = self._recorder, self._bwd_end

        def hook(param: torch.Tensor) -> None:
            if end is not None:
                end(param)
            if log:
                rec.grad_ready(index)
        return hook

    @property
    def module(self) -> nn.Module:
        """The bare model (replica 0 for ``manual``)."""
        return self.model.module

    def batch(self, step: int) -> tuple[Inputs, torch.Tensor]:
        """This trainer's share of step ``step``'s global batch, on its device."""
        if self.workload:
            x, y = workload_batch(self.cfg.model, self.workload, step, self.global_batch,
                                  self.cfg.seed)
        else:
            x, y = make_batch(self.cfg, self.cfg.model, step, self.global_batch, self.cfg.seed)
        return self.shard(x, y)

    def shard(self, x: Inputs, y: torch.Tensor) -> tuple[Inputs, torch.Tensor]:
        """Slice a global batch to this rank's contiguous shard (whole batch for one process).

        ``x`` is a tensor or a :class:`~dpcore.write.training.workload.Batch` of tensors (a user's
        tuple inputs): every tensor keeps the same rows."""
        if not self.single_process:
            x = shard_batch(x, self.ctx.rank, self.ctx.world_size)
            y = shard_batch(y, self.ctx.rank, self.ctx.world_size)
        dev = self.ctx.device
        return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    def step(self, x: Inputs, y: torch.Tensor, timer: PhaseTimer) -> float:
        """One optimizer step on this rank's batch; returns the (replica-mean) loss.

        Phases: forward (incl. loss), backward (hook variants launch collectives here),
        grad_sync (waiting for / running the gradient averaging), optimizer (step and
        zeroing gradients). ``recorder.step`` must be set by the caller beforehand.
        """
        if self.skip_reason:
            raise RuntimeError(self.skip_reason)
        m, probe = self.model, self.probe
        timer.start()
        m.on_train_batch_start()
        with record_function("forward"), (probe.forward() if probe else contextlib.nullcontext()):
            if self._delay_s:
                time.sleep(self._delay_s)  # --inject-delay: a straggler, on purpose
            with autocast(self.ctx.device, self.cfg.dtype):
                loss = m.forward_loss(x, y, self.loss_fn)
        timer.mark("fwd")
        if probe:
            probe.sample("forward")
        scaler = self.scaler
        end = self._bwd_end
        if end is not None:
            end.take()  # a backward outside this step (none should be) is not this one's
        with record_function("backward"):
            (scaler.scale(loss) if scaler is not None else loss).backward()
        timer.mark("bwd", at=end.take() if end is not None else None)
        if probe:
            probe.sample("backward")
        with record_function("grad_sync"):
            m.finish_gradient_synchronization()
        timer.mark("sync")
        if probe:
            probe.sample("grad_sync")
        with record_function("optimizer"):
            if scaler is not None:  # unscale, skip the step on inf/nan, adapt the scale
                scaler.step(self.opt)
                scaler.update()
            else:
                self.opt.step()
            if probe:
                probe.sample("optimizer")  # grads and optimizer state both alive
            self.opt.zero_grad(set_to_none=True)
        timer.mark("opt")
        return float(loss.detach()) / m.loss_terms

    def named_parameters_cpu(self) -> dict[str, torch.Tensor]:
        """Every parameter (frozen too) and buffer of the bare model, as CPU copies."""
        mod = self.module
        out = {n: p.detach().cpu().clone() for n, p in mod.named_parameters()}
        out.update({n: b.detach().cpu().clone() for n, b in mod.named_buffers()})
        return out


def make_trainer(variant: str, ctx: DistContext, cfg: TrainConfig,
                 recorder: Recorder = NULL_RECORDER, *, replicas: int | None = None,
                 bucket_mb: float | None = None, comm_hook: str = "none", delay_s: float = 0.0) -> Trainer:
    """Build ``cfg``'s model from ``cfg.seed``, wrap it in ``variant``, add cfg.optimizer(lr).

    ``replicas``: logical world size for single-process variants (default ctx.world_size).
    ``bucket_mb`` and ``comm_hook``: a profile job's own (its :class:`JobSpec`'s, the one place
    they are set per job), else ``cfg.bucket_mb`` (``--bucket-mb``) and no hook. ``delay_s``:
    this rank's ``--inject-delay`` sleep in every forward
    (:meth:`dpcore.write.capture.inject.Injections.delay_s`).
    """
    return Trainer(variant, ctx, cfg, recorder, replicas, bucket_mb, comm_hook, delay_s)


def local_context(device: torch.device | str | None = None) -> DistContext:
    """A world-of-one context for single-process variants run without a launch."""
    dev = torch.device(device) if device is not None else (
        torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    return DistContext(rank=0, world_size=1, local_rank=0,
                       backend="nccl" if dev.type == "cuda" else "gloo", device=dev,
                       threads=torch.get_num_threads())
