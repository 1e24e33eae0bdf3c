"""``dpcore.record``'s what-if calibration (``calibrate_recording``) on one time scale.

On a CUDA job the recording's collectives end on the stream (events), so backward's window and
each all-reduce's launch must be the stream's too: the host runs ahead of the stream, and a host
window with host launches against stream ends reads each bucket's all-reduce as starting before
the previous one ended on the stream (one op at a time there) and as running far longer than it
did. Checked on 2 ranks of ``tests/async_backend`` (NCCL's semantics: a call returns at enqueue,
the op finishes DELAY_MS later on the group's stream), the recorder on
:class:`tests.async_backend.StreamEventClock` (the stand-in for CUDA events), and a model whose
forward leaves DELAY_MS of work on the stream (a GPU forward's kernels). The same run on the host
clock (a CPU job) keeps the host times of the calls, as before.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.calibration_clock import (
    DELAY_MS,
    WIDTH,
    ForwardOnTheStream,
    assert_one_scale,
    cal_steps,
    host_launch_lead_ms,
    host_launches,
    rank_reports,
)


def _calibrate(rank: int, clock: Any) -> dict:
    """One ``calibrate_recording`` (2 steps a plan) of a fresh DDP on the async group, and the
    host times of its all-reduce calls by step."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from dpcore.write.capture.comm_log import Recorder
    from dpcore.write.commands.record_hooks import HookState, calibrate_recording, recording_allreduce_hook

    torch.manual_seed(0)
    rec = Recorder("t", rank, clock=clock)
    recording = SimpleNamespace(rec=rec, ctx=SimpleNamespace(rank=rank, device=torch.device("cpu")),
                                _tracing=False)
    model = DistributedDataParallel(ForwardOnTheStream(), bucket_cap_mb=1.0)
    model.register_comm_hook(HookState(model.process_group, recording), recording_allreduce_hook)
    x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(rank))
    cal = calibrate_recording(recording, model, lambda m: m(x).pow(2).mean(), 1.0, 2)
    dist.barrier()
    return {"cal": cal, "host_launch_ms": host_launches(rec.collective_rows())}


def _both_clocks(rank: int, ranks: int) -> dict:
    """The calibration on the stream's clock (a CUDA job's), then on the host's (a CPU job's)."""
    from tests import async_backend as ab
    world = ab.group_of()
    out = {"events": _calibrate(rank, ab.StreamEventClock(world))}
    world.synchronize()
    out["host"] = _calibrate(rank, None)
    world.synchronize()
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return rank_reports(_both_clocks, tmp_path_factory.mktemp("record-calibration-clock"))


@pytest.mark.slow
def test_event_clock_window_launches_and_ends_are_one_scale(reports: list[dict]) -> None:
    """Each all-reduce launches inside backward's window, no later than its own end, and (one op
    at a time on the stream) no earlier than the previous one's end; the stream spent at least
    DELAY_MS on it. Fails on the old code: host launches and a host window against stream ends,
    so a later bucket read as launched before the one ahead of it ended on the stream."""
    for rep in reports:
        assert_one_scale(rep["events"]["cal"])


@pytest.mark.slow
def test_event_clock_backward_begins_after_the_forwards_stream_work(reports: list[dict]) -> None:
    """The forward left DELAY_MS on the stream: backward began on the stream about that much
    after the host called it, so the host times of the calls (what launch_ms held before) read
    before backward began."""
    lead = [ms for rep in reports for ms in host_launch_lead_ms(rep["events"]["cal"], rep["events"]["host_launch_ms"])]
    assert max(lead) >= DELAY_MS / 2, lead


@pytest.mark.slow
def test_host_clock_keeps_the_calls_host_times(reports: list[dict]) -> None:
    """A CPU job (no event clock): launch_ms are the host times of the calls, exactly, and each
    lies after backward's host start (the window starts at the call of backward())."""
    for rep in reports:
        run = rep["host"]
        steps = cal_steps(run["cal"])
        assert len(steps) == 4, rep
        for st in steps:
            assert st["launch_ms"] == run["host_launch_ms"][str(st["step"])], st
            assert None not in st["end_ms"], st
            assert all(st["bwd_start_ms"] <= s for s in st["launch_ms"]), st
