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
    from dpcore.write.clock import measure_offset
    return measure_offset(ctx)


def report_progress(ctx):
    for i in range(3):
        ctx.report({"done": i + 1})
    return ctx.rank
