"""The CUDA event clock on a real GPU (skipped without one, tests/conftest.py).

What the CPU tests (test_event_timing.py, on the ``dpcore_async`` test backend) cannot show:
that a CUDA event recorded where dpcore records it completes when the GPU work did. A kernel
that spins for a known time (``torch.cuda._sleep``) stands in for a long collective: the host
returns from its launch at once, the events around it do not. The one-rank NCCL check runs a
real ProcessGroupNCCL all-reduce queued behind such a kernel (NCCL's stream waits for the
current stream), so its end, stamped in the future's callback, must come after the kernel.
"""
from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dpcore.write.capture.comm_log import CudaEventClock, PhaseTimer, Recorder

pytestmark = pytest.mark.gpu

SPIN_CYCLES = 100_000_000  # ~50-70 ms at the clocks of current data-centre GPUs


def _spin_ms() -> float:
    """How long one SPIN_CYCLES kernel takes on this GPU, by events around it alone."""
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(SPIN_CYCLES)
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def test_anchor_puts_an_event_on_the_host_clock() -> None:
    clock = CudaEventClock()
    torch.cuda.synchronize()
    t_a = time.perf_counter_ns()
    ev = clock.mark()
    ev.synchronize()
    t_b = time.perf_counter_ns()
    (got,) = clock.resolve([ev])
    assert t_a - 200_000 <= got <= t_b + 200_000  # within 0.2 ms of when it ran


def test_blocking_edge_ends_after_the_gpu_work() -> None:
    spin = _spin_ms()
    rec = Recorder("gpu", 0, clock=CudaEventClock())
    torch.cuda.synchronize()
    idx = rec.launch("all_reduce", "native", 4)
    torch.cuda._sleep(SPIN_CYCLES)  # returns at once, as an NCCL call does
    rec.done(idx)
    row, call = rec.collective_rows()[0], rec.call_rows()[0]
    host_ms = (call["t_end_ns"] - call["t_begin_ns"]) / 1e6  # the thread's time in the call
    dev_ms = (row["t_end_ns"] - int(row["t_start_ns"])) / 1e6
    assert host_ms < spin / 2
    assert dev_ms == pytest.approx(spin, rel=0.2)


def test_phase_timer_resolves_on_the_shared_clock() -> None:
    spin = _spin_ms()
    timer = PhaseTimer(torch.device("cuda"), offset_ns=1000)
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    timer.start()
    torch.cuda._sleep(SPIN_CYCLES)
    for p in PhaseTimer.PHASES:
        timer.mark(p)
    out = timer.finish()
    assert out["fwd_ms"] == pytest.approx(spin, rel=0.2)
    assert out["step_ms"] >= out["fwd_ms"]
    assert abs(out["t_start_ns"] - 1000 - t0) < 5_000_000  # started right after t0


def test_nccl_future_callback_end_follows_the_collective(tmp_path: Path) -> None:
    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, timeout=timedelta(seconds=60))
    try:
        spin = _spin_ms()
        host = Recorder("gpu", 0)
        dev = Recorder("gpu", 0, clock=CudaEventClock())
        t = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        torch.cuda._sleep(SPIN_CYCLES)  # the all-reduce is queued behind this on NCCL's stream
        ih, idv = host.launch("all_reduce", "native", 4), dev.launch("all_reduce", "native", 4)
        work = dist.all_reduce(t, async_op=True)
        wh, wd = host.track(ih, work), dev.track(idv, work)
        wh.wait()
        wd.wait()
        h, d = host.collective_rows()[0], dev.collective_rows()[0]
        # the host stamp came from the callback NCCL ran at enqueue: long before the spin ended
        assert (h["t_end_ns"] - h["t_launch_ns"]) / 1e6 < spin / 2
        # the event stamp: after the spin (and the collective behind it) finished
        assert (d["t_end_ns"] - d["t_launch_ns"]) / 1e6 >= spin * 0.8
    finally:
        dist.destroy_process_group()
