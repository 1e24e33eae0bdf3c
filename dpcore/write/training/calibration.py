"""The what-if calibration of one profiling job: a few extra, untimed steps with a second bucket
plan (:mod:`dpcore.contract.calibration` says what is measured and why).

Runs after the job's timed and traced steps, so none of them is touched; its steps never reach
steps.csv or collectives.csv (their indices start at ``CAL_STEP_BASE`` and only the kept steps'
rows are written). The two plans alternate step by step (own, second, own, ...) so a change of
load on a shared machine hits both alike. Its wall time is returned and stated in run.json.
"""
from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist

from dpcore.contract.calibration import CAL_STEP_BASE, CAL_STEPS, second_plan_mb
from dpcore.contract.config import TrainConfig
from dpcore.write.capture.comm_log import PhaseTimer, Recorder
from dpcore.write.runtime.context import DistContext

#: Variants the what-if model replays (dpcore.read.whatif.predict.WHATIF_VARIANTS).
CALIBRATED_VARIANTS = ("bucketed", "torch_ddp")


def wanted(variant: str, world_size: int, steps: int) -> bool:
    """A calibration runs for a 2+-rank bucketed/torch_ddp job when ``steps`` > 0."""
    return variant in CALIBRATED_VARIANTS and world_size >= 2 and steps > 0


def calibrate(ctx: DistContext, variant: str, bucket_mb: float, cfg: TrainConfig, rec: Recorder,
              timer: PhaseTimer, own: Any, replicas: int, steps: int = CAL_STEPS,
              comm_hook: str = "none") -> dict:
    """This rank's calibration steps: per plan, per step, backward's window and the all-reduces
    (ms on the run's one clock: the host's on CPU, the stream's resolved onto it on CUDA, see
    :func:`launch_ns`); ``cost_ms`` the wall time it took (model build included)."""
    from dpcore.write.training.trainer import make_trainer

    t0 = time.perf_counter()
    mb2 = second_plan_mb(bucket_mb)
    second = make_trainer(variant, ctx, cfg, recorder=rec, replicas=replicas, bucket_mb=mb2, comm_hook=comm_hook)
    plans = [(own, bucket_mb), (second, mb2)]
    order = [(1, -1)] + [(k, s) for s in range(steps) for k in (0, 1)]  # a warm-up of the new plan first
    timing: dict[int, dict] = {}
    for k, s in order:
        trainer = plans[k][0]
        idx = CAL_STEP_BASE + 1000 * k + s
        x, y = trainer.batch(s)
        if ctx.world_size > 1:
            dist.barrier()
        rec.step = idx
        trainer.step(x, y, timer)
        rec.step = -1
        if s >= 0:
            timing[idx] = timer.finish()
    coll: dict[int, list[dict]] = {}
    for c in rec.collective_rows():
        if c["step"] in timing and c["op"] == "all_reduce":
            coll.setdefault(c["step"], []).append(c)
    events = rec.clock is not None
    out = []
    for k, (_, mb) in enumerate(plans):
        out.append({"bucket_mb": mb, "steps": [
            step_row(ctx.rank, idx, timing[idx], coll.get(idx, []), events)
            for idx in (CAL_STEP_BASE + 1000 * k + s for s in range(steps))]})
    return {"plans": out, "cost_ms": (time.perf_counter() - t0) * 1e3}


def launch_ns(row: dict, events: bool) -> int:
    """When a collective could begin, on the scale of its end and of the phase marks.

    Why: the fit (:func:`dpcore.contract.calibration.fit`) takes each all-reduce's service time
    as end - max(launch, previous end) and its time in flight during backward from the launch, so
    the launch must be on the scale the end and backward's edges are on. On the host clock (CPU
    jobs) that is ``t_launch_ns``, the host time of the call, as ever. With an event clock (CUDA
    jobs) the end and the phase marks are the *stream's* times, and the host runs ahead of the
    stream: the host time of the call can lie before the backward that launched it even began on
    the device. There ``t_start_ns`` is the stream's time at the launch (an event recorded right
    before the call; the collective cannot begin before it), the one launch on that scale."""
    if events:
        start = row.get("t_start_ns")
        if isinstance(start, int) and start > 0:
            return start
    return int(row["t_launch_ns"])


def step_row(rank: int, idx: int, timing: dict, colls: list[dict], events: bool) -> dict:
    """One calibration rank-step for the fit: backward's window from the phase timer, each
    all-reduce's bytes, launch (:func:`launch_ns`) and end, ms on the run's one clock, in launch
    order. ``events``: the recorder timed with an event clock (then the phase timer did too: both
    pick CUDA events on a CUDA device, so backward's window is the stream's as well)."""
    cs = sorted(colls, key=lambda c: c["seq"])
    start = timing["t_start_ns"] / 1e6 + timing["fwd_ms"]
    return {"rank": rank, "step": idx, "bwd_start_ms": round(start, 4),
            "bwd_end_ms": round(start + timing["bwd_ms"], 4),
            "bytes": [int(c["bytes"]) for c in cs],
            "launch_ms": [round(launch_ns(c, events) / 1e6, 4) for c in cs],
            "end_ms": [_end_ms(c["t_end_ns"]) for c in cs]}


def _end_ms(end: Any) -> float | None:
    """A collective's end in ms; None while it has none (-1, or an event clock's end stamped
    after the rows were resolved: still an event, not ns)."""
    if isinstance(end, str) and end.lstrip("-").isdigit():
        end = int(end)
    return round(end / 1e6, 4) if isinstance(end, int) and end > 0 else None
