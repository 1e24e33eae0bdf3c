"""How a ``dpcore.record`` recording attaches to the user's model.

Kept apart from :mod:`dpcore.write.commands.record` (the recording's steps and phases) because
these are the pieces that depend on what the user brought: the kind of model (PyTorch DDP, a
``dpcore.wrap`` wrapper, anything else) and DDP's comm-hook protocol. The user's process group
(or none) is :class:`dpcore.write.runtime.world.UserWorld`.

The what-if calibration of a recorded DDP job (:func:`calibrate_recording`, when the user asks
for it) is here too, because it runs on what the user brought: ``profile`` calibrates with its own
trainers (:mod:`dpcore.write.training.calibration`), which know the model, data and loss; a
recording knows only the user's DDP model, so the user hands over a ``calibrate`` function
``loss = fn(model)`` (one forward on a batch of theirs) and the same protocol runs on it: one
warm-up step of a second bucket plan (:func:`dpcore.contract.calibration.second_plan_mb`, a
second ``DistributedDataParallel`` over the same module), then ``steps`` alternating steps per
plan (own, second, ...), each a forward and a backward whose all-reduces the recording's comm
hook logs. The per-rank result has the shape
:func:`dpcore.write.capture.run_lifecycle.calibration_entry` takes, so run.json's
``whatif_calibration`` is profile's. It runs after the user's loop, so no recorded step is
touched, and its steps (indices from ``CAL_STEP_BASE``) never become rows. No optimizer step
runs: the user's trained weights stay as they were, and every parameter's ``.grad`` is put back
as the loop left it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from dpcore.contract.calibration import CAL_STEP_BASE, end_ms, second_plan_mb, step_entry
from dpcore.write.capture.backward_end import BackwardEnd
from dpcore.write.capture.collective_tap import CollectiveTap
from dpcore.write.dp.variants.base import Wrapper

__all__ = ["CollectiveTap", "HookState", "calibrate_recording", "describe", "recording_allreduce_hook",
           "user_comm_hook"]

USER_VARIANT = "user"  # a loop whose data parallelism dpcore does not know


def describe(model: nn.Module | None) -> tuple[str, float | None, str]:
    """(variant, bucket MB or None, model class name) of what the user recorded."""
    if isinstance(model, DistributedDataParallel):  # dpcore's torch_ddp is one too
        # DDP stores int(bucket_cap_mb * 2**20) bytes: round back to the MB the user wrote
        return "torch_ddp", round(model.bucket_bytes_cap / 2**20, 4), type(model.module).__name__
    if isinstance(model, Wrapper):
        return model.name, getattr(model, "bucket_mb", None), type(model.module).__name__
    return USER_VARIANT, None, type(model).__name__ if model is not None else ""


class HookState:
    """What the DDP comm hook needs; ``recorder`` becomes the null one when recording ends."""

    __slots__ = ("group", "recorder", "world_size", "recording")

    def __init__(self, group: Any, recording: Any) -> None:
        self.group, self.recording, self.recorder = group, recording, recording.rec
        self.world_size = dist.get_world_size(group)


def recording_allreduce_hook(state, bucket):  # annotated below, as real objects
    """Average a DDP bucket as DDP's default hook does (divide by N, async all-reduce) and log
    it. Leaner than the ``torch_ddp`` variant's hook because a user's loop pays for it on
    every step: the end time is stamped in the one completion callback DDP needs anyway
    (each extra Python callback on the backend's thread costs a GIL hand-off per bucket), and
    the ``bucket<i>`` trace range is opened only while the profiler runs."""
    buf = bucket.buffer()
    rec = state.recorder
    tracing = state.recording._tracing
    rf_ctx = torch.profiler.record_function(f"bucket{bucket.index()}") if tracing else None
    if rf_ctx is not None:
        rf_ctx.__enter__()
    buf.div_(state.world_size)
    idx = rec.launch("all_reduce", "native", buf.numel() * buf.element_size(), bucket.index())
    fut = dist.all_reduce(buf, group=state.group, async_op=True).get_future()
    rec.returned(idx)
    if rf_ctx is not None:
        rf_ctx.__exit__(None, None, None)

    def finished(f: torch.futures.Future) -> torch.Tensor:
        rec.finished(idx)  # runs on the backend's thread as the all-reduce completes
        return f.value()[0]

    return fut.then(finished)


# DDP checks a comm hook's annotations at run time, and this module's are strings
# (``from __future__ import annotations``): give the hook the objects it compares against.
recording_allreduce_hook.__annotations__ = {
    "state": HookState, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def user_comm_hook(model: nn.Module | None) -> str | None:
    """The name of the comm hook the user registered on a DDP model (``None``: none yet)."""
    hooks = getattr(model, "_comm_hooks", None) if isinstance(model, DistributedDataParallel) else None
    if not hooks:
        return None
    fn = hooks[0][0]
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def second_ddp(model: DistributedDataParallel, bucket_mb: float, recording: Any) -> DistributedDataParallel:
    """A DDP over the user's module with ``bucket_mb`` buckets and the recording comm hook (the
    parameters are the same tensors, so the user's model is unchanged)."""
    ddp = DistributedDataParallel(model.module, device_ids=model.device_ids, process_group=model.process_group,
                                  bucket_cap_mb=bucket_mb, find_unused_parameters=model.find_unused_parameters,
                                  gradient_as_bucket_view=model.gradient_as_bucket_view)
    ddp.register_comm_hook(HookState(model.process_group, recording), recording_allreduce_hook)
    return ddp


def calibrate_recording(recording: Any, model: DistributedDataParallel, loss_fn: Callable[[Any], Any],
                        bucket_mb: float, steps: int) -> dict:
    """This rank's calibration steps (see the module docstring): per plan and step, backward's
    window and the all-reduces, in ms on the run's one clock; ``cost_ms`` the wall time it took.

    Backward's window and the launches are on the scale of the all-reduces' ends. On the host
    clock (a CPU job) the window is from the call of ``backward()`` to the last gradient's
    accumulation and a launch is the host time of the call, as ever. With an event clock (a
    CUDA job, :meth:`Recorder.time_on`) the ends are the stream's times and the host runs ahead
    of the stream, so the window is two marks on the stream: one before ``backward()``, one where
    backward's computation ended, before DDP's wait for the buckets (the stream reaches it once
    backward's kernels ran: :class:`~dpcore.write.capture.backward_end.BackwardEnd`), and a
    launch is the stream's time at the call (:func:`dpcore.contract.calibration.launch_ns`)."""
    t0 = time.perf_counter()
    rec, ctx = recording.rec, recording.ctx
    events = rec.clock is not None
    params = [p for p in model.module.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    mb2 = second_plan_mb(bucket_mb)
    plans = [(model, bucket_mb), (second_ddp(model, mb2, recording), mb2)]
    order = [(1, -1)] + [(k, s) for s in range(steps) for k in (0, 1)]  # a warm-up of the new plan first
    marks: dict[int, tuple[Any, Any]] = {}
    # backward's end is where its computation ended, before DDP's wait for the buckets inside
    # backward() (on CUDA that wait makes the stream wait for the all-reduces): BackwardEnd
    bwd_end = BackwardEnd(rec.clock)
    handles = bwd_end.attach(params)
    try:
        for k, s in order:
            ddp = plans[k][0]
            idx = CAL_STEP_BASE + 1000 * k + s
            for p in params:
                p.grad = None
            dist.barrier(group=model.process_group)
            rec.step = idx
            loss = loss_fn(ddp)
            bwd_end.take()
            start = rec.mark() if events else time.perf_counter_ns()
            loss.backward()
            end = bwd_end.take(0 if events else start)
            if end is None:  # no gradient became ready: backward() is all there is
                if not events and ctx.device.type == "cuda":
                    torch.cuda.synchronize()
                end = rec.mark() if events else time.perf_counter_ns()
            rec.step = -1
            if s >= 0:
                marks[idx] = (start, end)
        windows = _windows(rec, marks, events)
        coll = _collectives(rec, windows)
    finally:
        rec.step = -1
        for h in handles:
            h.remove()
        for p, g in zip(params, saved):
            p.grad = g
    out = []
    for k, (_, mb) in enumerate(plans):
        idxs = [CAL_STEP_BASE + 1000 * k + s for s in range(steps)]
        out.append({"bucket_mb": mb, "steps": [step_entry(ctx.rank, idx, *windows[idx], coll.get(idx, []), events)
                                               for idx in idxs]})
    return {"plans": out, "cost_ms": (time.perf_counter() - t0) * 1e3}


def _windows(rec: Any, marks: dict[int, tuple[Any, Any]], events: bool) -> dict[int, tuple[float, float]]:
    """Backward's window per calibration step in ms on the run's one clock: host ns plus the
    rank's offset, or the event clock's marks resolved (after the steps, never inside one)."""
    keys = sorted(marks)
    if events:
        times = rec.clock.resolve([ev for k in keys for ev in marks[k]])
        flat = [t + rec.offset_ns for t in times]
    else:
        flat = [t + rec.offset_ns for k in keys for t in marks[k]]
    return {k: (flat[2 * i] / 1e6, flat[2 * i + 1] / 1e6) for i, k in enumerate(keys)}


def _collectives(rec: Any, windows: dict[int, tuple[float, float]]) -> dict[int, list[dict]]:
    """The calibration steps' all-reduce rows, once every end is stamped (DDP's completion
    callback may run on the backend's thread just after backward returns)."""
    deadline = time.monotonic() + 1.0
    while True:
        rows = [c for c in rec.collective_rows() if c["step"] in windows and c["op"] == "all_reduce"]
        if all(end_ms(c["t_end_ns"]) is not None for c in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    out: dict[int, list[dict]] = {}
    for c in rows:
        out.setdefault(c["step"], []).append(c)
    return out
