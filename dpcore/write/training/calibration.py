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

from dpcore.contract.calibration import CAL_STEP_BASE, CAL_STEPS, launch_ns, second_plan_mb, step_entry

__all__ = ["calibrate", "launch_ns", "step_row", "wanted"]  # launch_ns: the rule lives in the contract
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


def step_row(rank: int, idx: int, timing: dict, colls: list[dict], events: bool) -> dict:
    """One calibration rank-step for the fit (:func:`dpcore.contract.calibration.step_entry`),
    backward's window from the phase timer. ``events``: the recorder timed with an event clock
    (then the phase timer did too: both pick CUDA events on a CUDA device, so backward's window
    is the stream's as well)."""
    start = timing["t_start_ns"] / 1e6 + timing["fwd_ms"]
    return step_entry(rank, idx, start, start + timing["bwd_ms"], colls, events)
