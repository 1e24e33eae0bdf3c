"""The what-if calibration of a ``dpcore.record`` DDP job, when the user asks for it.

Why a module of its own: ``profile`` calibrates with its own trainers
(:mod:`dpcore.write.training.calibration`), which know the model, data and loss; a recording knows
only the user's DDP model, so the user hands over a ``calibrate`` function ``loss = fn(model)``
(one forward on a batch of theirs) and this module runs the same protocol on it: one warm-up
step of a second bucket plan (:func:`dpcore.contract.calibration.second_plan_mb`, a second
``DistributedDataParallel`` over the same module), then ``steps`` alternating steps per plan
(own, second, ...), each a forward and a backward whose all-reduces the recording's comm hook logs.
The per-rank result has the shape :func:`dpcore.write.capture.run_lifecycle.calibration_entry`
takes, so run.json's ``whatif_calibration`` is profile's.

It runs after the user's loop, so no recorded step is touched, and its steps (indices from
``CAL_STEP_BASE``) never become rows. No optimizer step runs: the user's trained weights stay as
they were, and every parameter's ``.grad`` is put back as the loop left it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dpcore.contract.calibration import CAL_STEP_BASE, second_plan_mb
from dpcore.write.commands.record_hooks import HookState, recording_allreduce_hook


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
    window (from the call of ``backward()`` to the last gradient's accumulation) and the
    all-reduces, in ms on the run's one clock; ``cost_ms`` the wall time it took."""
    t0 = time.perf_counter()
    rec, ctx = recording.rec, recording.ctx
    params = [p for p in model.module.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    mb2 = second_plan_mb(bucket_mb)
    plans = [(model, bucket_mb), (second_ddp(model, mb2, recording), mb2)]
    order = [(1, -1)] + [(k, s) for s in range(steps) for k in (0, 1)]  # a warm-up of the new plan first
    windows: dict[int, tuple[float, float]] = {}
    try:
        for k, s in order:
            ddp = plans[k][0]
            idx = CAL_STEP_BASE + 1000 * k + s
            for p in params:
                p.grad = None
            dist.barrier(group=model.process_group)
            rec.step = idx
            loss = loss_fn(ddp)
            recording._last_grad_ns = 0
            start = time.perf_counter_ns()
            loss.backward()
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            end = recording._last_grad_ns if recording._last_grad_ns > start else time.perf_counter_ns()
            rec.step = -1
            if s >= 0:
                windows[idx] = ((start + rec.offset_ns) / 1e6, (end + rec.offset_ns) / 1e6)
        coll = _collectives(rec, windows)
    finally:
        rec.step = -1
        for p, g in zip(params, saved):
            p.grad = g
    out = []
    for k, (_, mb) in enumerate(plans):
        rows = []
        for s in range(steps):
            idx = CAL_STEP_BASE + 1000 * k + s
            cs = sorted(coll.get(idx, []), key=lambda c: c["seq"])
            rows.append({"rank": ctx.rank, "step": idx, "bwd_start_ms": round(windows[idx][0], 4),
                         "bwd_end_ms": round(windows[idx][1], 4), "bytes": [int(c["bytes"]) for c in cs],
                         "launch_ms": [round(int(c["t_launch_ns"]) / 1e6, 4) for c in cs],
                         "end_ms": [round(int(c["t_end_ns"]) / 1e6, 4) if int(c["t_end_ns"]) > 0 else None
                                    for c in cs]})
        out.append({"bucket_mb": mb, "steps": rows})
    return {"plans": out, "cost_ms": (time.perf_counter() - t0) * 1e3}


def _collectives(rec: Any, windows: dict[int, tuple[float, float]]) -> dict[int, list[dict]]:
    """The calibration steps' all-reduce rows, once every end is stamped (DDP's completion
    callback may run on the backend's thread just after backward returns)."""
    deadline = time.monotonic() + 1.0
    while True:
        rows = [c for c in rec.collective_rows() if c["step"] in windows and c["op"] == "all_reduce"]
        if all(int(c["t_end_ns"]) > 0 for c in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    out: dict[int, list[dict]] = {}
    for c in rows:
        out.setdefault(c["step"], []).append(c)
    return out
