"""Top-level rank functions for launcher tests (must be importable by spawned ranks)."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def sum_ranks(ctx, scale: float):
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return {"rank": ctx.rank, "value": t.item() * scale, "threads": ctx.threads,
            "pid": os.getpid(), "ws": dist.get_world_size()}


def raise_on_rank1(ctx):
    if ctx.rank == 1:
        raise ValueError("boom from the test")
    dist.barrier()
    return os.getpid()


def hang_rank0(ctx):
    if ctx.rank == 0:
        time.sleep(60)
    dist.barrier()


def exit_hard(ctx):
    if ctx.rank == 1:
        os._exit(7)
    time.sleep(30)


def clock_offset(ctx):
    from dpcore.write.runtime.clock import measure_offset
    return measure_offset(ctx)


def report_progress(ctx):
    for i in range(3):
        ctx.report({"done": i + 1})
    return ctx.rank


def sigkill_rank1(ctx):
    """Rank 1 dies by SIGKILL (no exception, no result); rank 0 then fails in the barrier
    with a connection error of its own, which must not take the blame."""
    if ctx.rank == 1:
        time.sleep(0.2)
        os.kill(os.getpid(), 9)
    dist.barrier()
    time.sleep(30)


def hanging_workload():
    """``--model tests.workers:hanging_workload``: trains normally for its first forwards, then
    hangs for good from the 4th forward of a rank on (with --warmup 1 --steps 2 that is the
    profiler's own warm-up step, while the rank's stderr goes to rank<r>.profiler.log)."""
    import dpcore

    calls = {"n": 0}

    class Hang(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            calls["n"] += 1
            if calls["n"] >= 4:
                time.sleep(120)
            return self.lin(x)

    def make_batch(n, gen):
        return torch.randn(n, 4, generator=gen), torch.randn(n, 2, generator=gen)

    return dpcore.Workload(Hang(), make_batch, torch.nn.functional.mse_loss, batch_size=4)


def wait_for_go(ctx, folder: str):
    """Rank 0 says it is running (``ready``), then every rank waits until the test writes
    ``go``: the job, and the launcher's store, stay up while the test looks at them."""
    from pathlib import Path
    d = Path(folder)
    if ctx.rank == 0:
        (d / "ready").write_text("1")
    end = time.monotonic() + 60
    while not (d / "go").exists() and time.monotonic() < end:
        time.sleep(0.05)
    dist.barrier()
    return ctx.rank
