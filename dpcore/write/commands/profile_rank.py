"""What each rank does for one profiling job: warm-up, timed steps, then profiled steps.

Why timed steps run without the profiler: torch.profiler adds per-op overhead, so the step
times the charts use come from plain ``perf_counter`` (CPU, after a barrier so all ranks start
a step together) or CUDA events (GPU); only a few extra steps run under the profiler, for the
traces. Step indices: timed steps are 0..steps-1, the profiler's own warm-up step is ``steps``
(dropped), profiled steps are steps+1..steps+profile_steps, and the trace's
``ProfilerStep#N`` markers carry the same N. A 2+-rank bucketed/torch_ddp job then spends
2·``--calibration-steps``+1 untimed steps on the what-if calibration (:mod:`dpcore.write.training.calibration`).
"""
from __future__ import annotations

import math
import os
from typing import Any

import torch.distributed as dist

from dpcore.contract.config import TrainConfig
from dpcore.write.capture.comm_log import Recorder
from dpcore.write.capture.inject import HangInjection, Injections, missed_note
from dpcore.write.capture.rank_channel import RankChannel, connect, live_row
from dpcore.write.capture.run_lifecycle import JobSpec, steps_row
from dpcore.write.capture.tracing import TraceCapture
from dpcore.write.runtime.clock import measure_offset
from dpcore.write.runtime.context import DistContext
from dpcore.write.runtime.launch import settle_collectives
from dpcore.write.training.calibration import calibrate, wanted

#: no injected hang (rank -1 never matches)
NO_INJECTION = HangInjection(-1, -1)


def profile_job(ctx: DistContext, spec: JobSpec, cfg: TrainConfig,
                inject: Injections | None = None) -> dict[str, Any]:
    """Run one job on this rank; return its rows for the run directory (parent writes them).
    Each kept step's live.csv row goes to rank 0 through the job's store (:class:`RankChannel`),
    which also answers the hang watchdog; ``inject``: ``--inject-delay`` and ``--inject-hang``."""
    channel = RankChannel(connect(ctx.store_addr), spec.job_id, ctx.rank, ctx.world_size)
    try:
        return _profile_job(ctx, spec, cfg, inject or Injections(), channel)
    finally:
        channel.close()


def _profile_job(ctx: DistContext, spec: JobSpec, cfg: TrainConfig, injections: Injections,
                 channel: RankChannel) -> dict[str, Any]:
    from dpcore.write.capture.memory import measure_step
    from dpcore.write.training.trainer import make_trainer

    offset, rtt = measure_offset(ctx)
    if os.environ.get("DPCORE_FAIL_JOB") == spec.job_id and ctx.rank == ctx.world_size - 1:
        # fault injection for tests and demos: this job's last rank raises
        raise RuntimeError(f"injected failure (DPCORE_FAIL_JOB={spec.job_id})")
    rec = Recorder(spec.job_id, ctx.rank, offset)
    # the job's bucket size and comm hook come from its spec only (cfg.bucket_mb is the run's
    # --bucket-mb, the base the jobs were planned from)
    trainer = make_trainer(spec.variant, ctx, cfg, recorder=rec, replicas=spec.world_size,
                           bucket_mb=spec.bucket_mb, comm_hook=spec.comm_hook,
                           delay_s=injections.delay_s(ctx.rank))
    inject = injections.hang or NO_INJECTION
    if trainer.skip_reason:
        return {"skip_reason": trainer.skip_reason}
    # the phases on the recorder's clock (the trainer set it): one clock, one anchor for the
    # step's phases and its collectives' edges
    timer = rec.phase_timer()
    profile_steps = cfg.profile_steps if spec.trace_dir else 0
    rows: list[dict] = []
    losses: dict[int, float] = {}  # kept step -> this rank's loss (run.json's loss after K steps)
    done = 0
    missed: list[str] = []  # the injection's note, when its step ran without firing

    def one_step(step: int, profiled: bool, keep: bool) -> None:
        nonlocal done
        x, y = trainer.batch(step + cfg.warmup)  # this rank's shard, on its device
        if ctx.world_size > 1:
            dist.barrier()  # every rank starts the step together
        rec.step = step
        mark = rec.collective_count()
        with inject.during(ctx.rank, step) as fired:
            loss = trainer.step(x, y, timer)
        if (ctx.rank, step) == (inject.rank, inject.step) and not fired:
            missed.append(missed_note(inject, spec.variant))
        rec.step = -1
        if not math.isfinite(loss):  # a diverged job measures nothing worth keeping as complete
            raise FloatingPointError(f"the loss became {loss} at step {step} (training diverged; "
                                     f"lower --lr, now {cfg.lr:g}, or check the model)")
        if keep:
            losses[step] = loss
            row = steps_row(spec, ctx.rank, step, profiled, timer.finish(),
                            trainer.samples_per_step)
            rows.append(row)
            channel.put(live_row(row), rec.rows_since(mark))
        done += 1
        ctx.report({"done": done, "phase": "warmup" if step < 0 else
                    ("profiled" if profiled else "timed")})

    memory: list[dict] = []

    def measured(step: int) -> None:
        # memory.csv: ONE untimed step sampled by dpcore.write.capture.memory (no timed step pays)
        memory.append(measure_step(trainer, lambda: one_step(step, False, False),
                                   job_id=spec.job_id, variant=spec.variant,
                                   world_size=spec.world_size, rank=ctx.rank))

    for w in range(cfg.warmup):
        if w == cfg.warmup - 1:
            measured(w - cfg.warmup)  # the last warm-up step is the measured one
        else:
            one_step(w - cfg.warmup, False, False)
    rec.clear()
    for s in range(cfg.steps):
        one_step(s, False, True)
    if not cfg.warmup:
        measured(-1)  # no warm-up step to sample: an extra one, after the timed steps

    capture = None
    if profile_steps:
        first = cfg.steps  # the profiler's warm-up step; ProfilerStep#N == our step index N
        capture = TraceCapture(spec.trace_dir, ctx.rank, spec.job_id, offset, first=first + 1,
                               last=first + profile_steps, warmup_step=first, cuda=ctx.is_cuda,
                               settle=settle_collectives)
        capture.start()
        try:
            for step in range(first, first + profile_steps + 1):
                if step > first:
                    capture.markers(rec.now)
                one_step(step, step > first, step > first)
                capture.step()
        finally:
            capture.stop()
    # the what-if calibration: extra untimed steps with a second bucket plan, after every timed
    # and traced step (dpcore.write.training.calibration); its steps are never written as rows
    cal = None
    if wanted(spec.variant, ctx.world_size, cfg.calibration_steps):
        try:
            cal = calibrate(ctx, spec.variant, spec.bucket_mb, cfg, rec, timer, trainer, spec.world_size,
                            steps=cfg.calibration_steps, comm_hook=spec.comm_hook)
        except Exception as exc:  # noqa: BLE001 - the measured steps must survive a failed calibration
            cal = {"error": f"{type(exc).__name__}: {exc}"}
    trace_file = capture.trace_file if capture else None
    trace_error = capture.error if capture else ""
    keep = {r["step"] for r in rows}
    coll = [c for c in rec.collective_rows() if c["step"] in keep]
    msgs = [m for m in rec.message_rows() if m["step"] in keep]
    grads = [g for g in rec.grad_rows() if g["step"] in keep]
    calls = [c for c in rec.call_rows() if c["step"] in keep]
    return {"steps": rows, "collectives": coll, "loss": _last_loss(losses, cfg),
            "hook_ms": _hook_ms(trainer, cfg), "messages": msgs, "grads": grads, "memory": memory,
            "comm_calls": calls, "calibration": cal, "notes": missed,
            "offset_ns": offset,
            "rtt_ns": rtt, "trace": str(trace_file) if trace_file else None,
            "trace_error": trace_error, "sync": capture.sync if capture else [],
            "threads": ctx.threads, "cpus": list(ctx.cpus)}


def _last_loss(losses: dict[int, float], cfg: TrainConfig) -> dict[str, Any] | None:
    """This rank's loss at the last timed step, after K = warm-up + timed steps - 1 optimizer
    steps: every job of a run starts from the same seed and data, so a comm hook's job set
    beside the plain one differs by what the compression did to training."""
    last = cfg.steps - 1
    return {"after_steps": cfg.warmup + last, "value": losses[last]} if last in losses else None


def _hook_ms(trainer: Any, cfg: TrainConfig) -> list[tuple[int, float, float]] | None:
    """(step, compress ms, decompress ms) of each timed step of a ``torch_ddp`` job with 2+ ranks:
    its comm hook's own compute (the job's HookClock); 0.0 for the plain job, whose hook only
    averages and sends. None for every other job (no DDP comm hook to time)."""
    model = trainer.model
    state = getattr(model, "_hook_state", None) if getattr(model, "name", None) == "torch_ddp" else None
    if state is None or state.world_size < 2:  # one rank: nothing to compress for
        return None
    clock, steps = model.hook_clock, range(cfg.steps)
    if clock is None:
        return [(s, 0.0, 0.0) for s in steps] if model.comm_hook == "none" else None
    return clock.ms(steps)
