"""Record your own DistributedDataParallel loop with ``dpcore.record``.

Under torchrun (any number of ranks, any number of nodes)::

    torchrun --standalone --nproc-per-node 2 examples/record_ddp.py --steps 30

or on its own, where it spawns ``--nproc`` gloo ranks on this host::

    python examples/record_ddp.py --nproc 2 --steps 30

Then open the run in the dashboard (``streamlit run app.py``) or summarise it:
``python -m dpcore summarize profiles/<run_id>``. Nothing below is dpcore-specific except the
``record`` block and its ``step`` / ``phase`` marks.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed
import dpcore  # noqa: E402


def train(args: argparse.Namespace) -> None:
    """One rank's ordinary DDP training loop, recorded."""
    rank = dist.get_rank()
    torch.manual_seed(0)  # DDP broadcasts rank 0's weights anyway
    net = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(),
                        nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10))
    cuda = dist.get_backend() == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    model = DistributedDataParallel(net.to(dev), device_ids=[dev] if cuda else None,
                                    bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of the data

    with dpcore.record(args.out, name=args.name, model=model, warmup=2, profile_steps=3,
                       samples=args.batch) as rec:
        for _ in range(args.steps):
            x = torch.randn(args.batch, args.width, generator=g).to(dev)
            y = torch.randint(0, 10, (args.batch,), generator=g).to(dev)
            with rec.step():
                with rec.phase("forward"):
                    loss = nn.functional.cross_entropy(model(x), y)
                with rec.phase("backward"):
                    loss.backward()  # DDP's all-reduces run here; dpcore logs each bucket
                with rec.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    if rank == 0:
        print(f"recorded {rec.run_dir} ({rec.status}); try: python -m dpcore summarize {rec.run_dir}")


def _spawned(rank: int, args: argparse.Namespace, store: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.nproc))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=args.nproc, timeout=_dt.timedelta(seconds=120))
    try:
        train(args)
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    ap.add_argument("--nproc", type=int, default=2, help="ranks to spawn without torchrun")
    ap.add_argument("--out", default="profiles")
    ap.add_argument("--name", default="record-ddp")
    args = ap.parse_args()
    if "RANK" in os.environ:  # torchrun made the world
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        try:
            train(args)
        finally:
            dist.destroy_process_group()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_spawned, args=(args, str(Path(tmp) / "store")), nprocs=args.nproc)


if __name__ == "__main__":
    main()
