"""The what-if calibration's times are on one scale: on an event clock (CUDA jobs) a collective's
launch is the stream's time at the launch, like its end and backward's edges; on the host clock
(CPU jobs) it is the host time of the call, as before.

Why it matters: the fit takes each all-reduce's service time as end - max(launch, previous end)
and its time in flight during backward from the launch. With the launch on the host clock and
everything else on the stream's, a collective launched from backward's hook can read as launched
before backward began on the device (the host runs ahead of the stream).

The distributed check runs a real ``calibrate`` on 2 ranks of ``tests/async_backend`` (NCCL's
semantics: the call returns at enqueue, the op finishes DELAY_MS later on the group's stream; a
DDP hook's future is complete at once), with :class:`tests.async_backend.StreamEventClock`
standing in for CUDA events in the recorder and the phase timer, and a model whose forward leaves
DELAY_MS of work on the stream (a GPU forward's kernels: the host runs ahead of the device).
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from dpcore.write.training.calibration import launch_ns, step_row
from tests.calibration_clock import (
    DELAY_MS,
    WIDTH,
    ForwardOnTheStream,
    assert_one_scale,
    host_launch_lead_ms,
    host_launches,
    rank_reports,
)


# ------------------------------------------------------------------ rows, no processes
def _coll(seq: int, launch: int, start: int | str, end: int, nbytes: int = 64) -> dict:
    return {"seq": seq, "bytes": nbytes, "t_launch_ns": launch, "t_start_ns": start, "t_end_ns": end}


TIMING = {"t_start_ns": 1_000_000_000, "fwd_ms": 5.0, "bwd_ms": 20.0}


def test_host_clock_launch_is_the_call_time_as_before() -> None:
    """CPU jobs: t_start_ns is an empty cell there; launch_ms is t_launch_ns, unchanged."""
    colls = [_coll(1, 1_012_000_000, "", 1_030_000_000), _coll(0, 1_006_000_000, "", 1_020_000_000)]
    row = step_row(0, 7, TIMING, colls, events=False)
    assert row == {"rank": 0, "step": 7, "bwd_start_ms": 1005.0, "bwd_end_ms": 1025.0, "bytes": [64, 64],
                   "launch_ms": [1006.0, 1012.0], "end_ms": [1020.0, 1030.0]}
    # even a stray start time does not change the host-clock path
    assert launch_ns(_coll(0, 5, 9, 10), events=False) == 5


def test_event_clock_launch_is_the_streams_time_at_the_launch() -> None:
    """CUDA jobs: the host called at 1001 ms, before backward began on the stream (1005 ms); the
    stream reached the launch at 1006 ms. launch_ms is 1006, inside backward, before the end."""
    colls = [_coll(0, 1_001_000_000, 1_006_000_000, 1_020_000_000)]
    row = step_row(1, 7, TIMING, colls, events=True)
    assert row["launch_ms"] == [1006.0] and row["end_ms"] == [1020.0]
    assert row["bwd_start_ms"] <= row["launch_ms"][0] <= row["bwd_end_ms"]
    # a row without a start time (none recorded) falls back to the call's time
    assert launch_ns(_coll(0, 5, "", 10), events=True) == 5
    # an end not known (yet): -1, or an event stamped after the rows were resolved
    ends = step_row(1, 7, TIMING, [_coll(0, 1, 2, -1), {**_coll(1, 3, 4, 0), "t_end_ns": object()}],
                    events=True)["end_ms"]
    assert ends == [None, None]


# ------------------------------------------------------------------ a real calibration, 2 ranks
def stream_workload() -> Any:
    """``--model tests.write.training.test_calibration_clock:stream_workload``."""
    from dpcore.write.training.workload import Workload

    def batch(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, WIDTH, generator=g), torch.randn(n, WIDTH, generator=g)

    return Workload(ForwardOnTheStream(), batch, torch.nn.functional.mse_loss)


def _profile_calibration(rank: int, n: int) -> dict:
    """A real ``calibrate`` of a torch_ddp job, recorder and phase timer on the stream's clock."""
    from dpcore.contract.config import TrainConfig
    from dpcore.write.capture.comm_log import PhaseTimer, Recorder
    from dpcore.write.runtime.context import DistContext
    from dpcore.write.training.calibration import calibrate
    from dpcore.write.training.trainer import make_trainer
    from tests import async_backend as ab

    world = ab.group_of()
    ctx = DistContext(rank=rank, world_size=n, local_rank=rank, backend=ab.BACKEND,
                      device=torch.device("cpu"), threads=1)
    cfg = TrainConfig(model=f"{__name__}:stream_workload", batch_size=8, steps=1, warmup=0,
                      profile_steps=0)
    rec = Recorder("t", rank, clock=ab.StreamEventClock(world))
    timer = PhaseTimer(ctx.device, 0, clock=ab.StreamEventClock(world))
    own = make_trainer("torch_ddp", ctx, cfg, recorder=rec, bucket_mb=1.0)
    world.synchronize()
    rec.clear()
    cal = calibrate(ctx, "torch_ddp", 1.0, cfg, rec, timer, own, n, steps=2)
    world.synchronize()
    return {"cal": cal, "host_launch_ms": host_launches(rec.collective_rows())}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return rank_reports(_profile_calibration, tmp_path_factory.mktemp("calibration-clock"))


@pytest.mark.slow
def test_calibration_launches_lie_inside_backward_and_before_their_ends(reports: list[dict]) -> None:
    """Each all-reduce is launched from backward's hook: on one scale its launch lies within
    backward's window and no later than its own end (and, one op at a time on the stream, no
    earlier than the previous one's end). On today's stream each op takes DELAY_MS, so a launch
    on the host clock reads up to DELAY_MS before backward began on the stream."""
    for rep in reports:
        assert_one_scale(rep["cal"])


@pytest.mark.slow
def test_the_host_clock_launch_would_precede_backward(reports: list[dict]) -> None:
    """The same run's host times of the calls (what launch_ms held before): the first launch of a
    step reads well before backward began on the stream, the inconsistent order the fix removes."""
    early = [ms for rep in reports for ms in host_launch_lead_ms(rep["cal"], rep["host_launch_ms"])]
    assert max(early) >= DELAY_MS / 2, early
