"""Write the traces of a plain PyTorch DDP job on gloo in which rank 1 is late in every step.

Why this script exists (issue 19, defect 9): dpcore's stragglers analysis was checked on its own
runs, whose collectives.csv records when each rank *enqueued* a collective. On a foreign trace
the only arrival it looked at was when gloo's worker thread started the work, and in a DDP job
that is the wrong moment: a rank that enqueued bucket k early has its gloo thread still busy
waiting for its peer in bucket k-1, so the thread picks k up only after the late rank has
enqueued it too. This script reproduces that job without dpcore: a hand-written DDP loop under
``torch.profiler`` (``tensorboard_trace_handler``, as users write it), 2 ranks on gloo, a small
MLP packed into several DDP buckets, and a ``DELAY_S`` sleep in rank 1's forward.

Known answer: rank 1 is the last to enqueue every all-reduce of every step, ``DELAY_S`` after
rank 0 (both ranks leave the previous step's last all-reduce together, then rank 1 sleeps), so
rank 0 waits about ``DELAY_S`` at each of them. Yet gloo's worker threads on rank 0 pick most
buckets up only after rank 1 has enqueued them too: the workers' start times alone do not
show who was late (tests/test_stragglers_real.py checks both).

Run from the repository root (takes a few seconds; the committed traces came from it):

    python tests/data/make_ddp_delay_trace.py [OUT_DIR]

OUT_DIR defaults to ``tests/data/ddp_gloo_delay_rank1``; its old trace files are removed first.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

WORLD_SIZE = 2
LATE_RANK = 1
DELAY_S = 0.030
WIDTH, LAYERS, BATCH = 256, 6, 32
BUCKET_MB = 0.25  # one 256x256 layer (256 KiB) per bucket: several all-reduces per step
WAIT, WARMUP, ACTIVE = 1, 1, 4
DEFAULT_OUT = Path(__file__).resolve().parent / "ddp_gloo_delay_rank1"


class LateMLP(nn.Module):
    """An MLP whose forward sleeps ``delay_s`` first: a rank with a slow input pipeline."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.net = nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.net(x)


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    model = DDP(LateMLP(DELAY_S if rank == LATE_RANK else 0.0), bucket_cap_mb=BUCKET_MB)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE),
                 on_trace_ready=tensorboard_trace_handler(out, worker_name=f"rank{rank}", use_gzip=True)) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            x = torch.randn(BATCH, WIDTH, generator=gen)
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(out: Path = DEFAULT_OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.pt.trace.json*"):
        old.unlink()
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
