"""Benchmark: ``bucketed`` vs ``torch_ddp`` step time (``python -m benchmarks.bench_bucketed``).

Both trainers live in the same 2 rank processes and are timed in interleaved blocks (ABAB...,
the order flipping every repeat), so machine noise - other jobs on a shared box - hits both
alike. Each block: ranks aligned with a barrier, warm-up steps, then timed steps; a block's
value is its median step time (rank 0's clock; every step ends with the same collective wait
on both ranks), the result the median over blocks, and the ratio bucketed / torch_ddp.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch.distributed as dist

from dpcore.contract.config import TrainConfig
from dpcore.write.capture.comm_log import NULL_RECORDER, PhaseTimer, Recorder
from dpcore.write.runtime.context import DistContext
from dpcore.write.runtime.launch import launch
from dpcore.write.training.trainer import make_trainer

PAIR = ("bucketed", "torch_ddp")


def _bench_rank(ctx: DistContext, cfg: TrainConfig, repeats: int, steps: int, warmup: int,
                record: bool) -> dict[str, Any]:
    trainers = {v: make_trainer(v, ctx, cfg, Recorder(v, ctx.rank) if record else NULL_RECORDER)
                for v in PAIR}
    batches = [trainers[PAIR[0]].batch(s) for s in range(4)]
    blocks: dict[str, list[float]] = {v: [] for v in PAIR}
    phases: dict[str, list[dict[str, float]]] = {v: [] for v in PAIR}
    for r in range(repeats):
        for v in (PAIR if r % 2 == 0 else PAIR[::-1]):
            tr = trainers[v]
            times = []
            for s in range(warmup + steps):
                dist.barrier()
                timer = PhaseTimer(ctx.device)
                tr.step(*batches[s % len(batches)], timer)
                if s >= warmup:
                    ph = timer.finish()
                    times.append(ph["step_ms"])
                    phases[v].append(ph)
            blocks[v].append(statistics.median(times))
    phase_med = {v: {k: statistics.median(p[k] for p in phases[v])
                     for k in ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms")} for v in PAIR}
    return {"blocks": blocks, "phases": phase_med}


def run(world_size: int = 2, width: int = 512, batch: int = 32, bucket_mb: float = 25.0,
        repeats: int = 20, steps: int = 5, warmup: int = 1, record: bool = False,
        backend: str = "auto") -> dict[str, Any]:
    """Benchmark both variants; returns per-block medians, overall medians and the ratio."""
    cfg = TrainConfig(model="mlp", width=width, batch_size=batch, bucket_mb=bucket_mb)
    out = launch(_bench_rank, world_size, backend=backend,
                 args=(cfg, repeats, steps, warmup, record), timeout_s=600,
                 preload=("dpcore.write.training.trainer",))[0]
    blocks = out["blocks"]
    med = {v: statistics.median(b) for v, b in blocks.items()}
    ratios = [a / b for a, b in zip(blocks["bucketed"], blocks["torch_ddp"])]
    return {"blocks_ms": blocks, "median_ms": med, "phases_ms": out["phases"],
            "ratio": med["bucketed"] / med["torch_ddp"],
            "median_block_ratio": statistics.median(ratios)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32, help="per-rank batch")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per block")
    ap.add_argument("--record", action="store_true", help="attach Recorders (comm hook on DDP)")
    ap.add_argument("--backend", default="auto")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = run(a.world_size, a.width, a.batch, a.bucket_mb, a.repeats, a.steps, record=a.record,
              backend=a.backend)
    for v in PAIR:
        blocks = " ".join(f"{x:.1f}" for x in res["blocks_ms"][v])
        ph = " ".join(f"{k[:-3]} {x:.1f}" for k, x in res["phases_ms"][v].items())
        print(f"{v:10s} median {res['median_ms'][v]:8.2f} ms  ({ph})  blocks: {blocks}")
    print(f"ratio bucketed/torch_ddp = {res['ratio']:.3f} (median of per-block ratios "
          f"{res['median_block_ratio']:.3f}); mlp width {a.width}, batch {a.batch}/rank, "
          f"bucket {a.bucket_mb} MB, {a.world_size} ranks, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
