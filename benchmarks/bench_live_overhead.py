"""Does the live view slow the steps it reports? Timed-step medians of one ``flat`` job on 2
gloo ranks, with and without live.csv's machinery (``python -m benchmarks.bench_live_overhead``).

Arm ``live``: every rank queues each step's row (:class:`RankChannel.put`, as ``profile`` does)
and its channel thread sends the rows and watches for a hang request every 0.5 s; rank 0 also
runs the collector (a :class:`MonitorThread` appending to a live.csv), which is how torchrun and
``dpcore.record`` run it (a spawned ``profile`` polls from the launcher instead, so this arm is
the worse case for the ranks). Arm ``off``: nothing. Both arms run in the same rank processes,
in interleaved blocks whose order flips every repeat, so a shared machine's drift hits both.
A block's value is the median ``step_ms`` of rank 0 (every step ends in the same all-reduce on
both ranks); the result is the ratio of the medians over blocks (live / off), and the median of
the per-repeat ratios.

    python -m benchmarks.bench_live_overhead --repeats 8 --steps 40
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from dpcore.contract.config import TrainConfig
from dpcore.write.capture.comm_log import PhaseTimer, Recorder
from dpcore.write.capture.job_monitor import JobMonitor
from dpcore.write.capture.rank_channel import RankChannel, connect, live_row
from dpcore.write.capture.run_lifecycle import JobSpec, steps_row
from dpcore.write.runtime.context import DistContext
from dpcore.write.runtime.launch import launch
from dpcore.write.runtime.world import MonitorThread
from dpcore.write.training.trainer import make_trainer

ARMS = ("off", "live")


def _bench_rank(ctx: DistContext, cfg: TrainConfig, repeats: int, steps: int, warmup: int,
                out: str) -> dict[str, Any]:
    rec = Recorder("bench", ctx.rank)
    trainer = make_trainer("flat", ctx, cfg, rec)
    batches = [trainer.batch(s) for s in range(4)]
    blocks: dict[str, list[float]] = {a: [] for a in ARMS}
    cost = {"put_ns": 0, "thread_ns": 0, "poll_ns": 0, "rows": 0, "wall_ns": 0}
    for r in range(repeats):
        for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
            job = f"bench-{r}-{arm}"
            spec = JobSpec(job, "flat", ctx.world_size, ctx.world_size, cfg.bucket_mb, None)
            channel = poller = None
            if arm == "live":
                channel = RankChannel(connect(ctx.store_addr), job, ctx.rank, ctx.world_size)
                if ctx.rank == 0:
                    poller = MonitorThread(JobMonitor(job, ctx.world_size, Path(out), watch=False),
                                           connect(ctx.store_addr))
            times = []
            t_block = time.perf_counter_ns()
            for s in range(warmup + steps):
                dist.barrier()
                timer = PhaseTimer(ctx.device)
                mark = rec.collective_count()
                rec.step = s
                trainer.step(*batches[s % len(batches)], timer)
                ph = timer.finish()
                if s >= warmup:
                    times.append(ph["step_ms"])
                    if channel is not None:
                        t0 = time.perf_counter_ns()
                        channel.put(live_row(steps_row(spec, ctx.rank, s, False, ph, None)),
                                    rec.rows_since(mark))
                        cost["put_ns"] += time.perf_counter_ns() - t0
                        cost["rows"] += 1
            rec.clear()
            if arm == "live":
                cost["wall_ns"] += time.perf_counter_ns() - t_block
            if channel is not None:
                channel.close()
                cost["thread_ns"] += channel.cpu_ns
            dist.barrier()
            if poller is not None:
                poller.stop()
                cost["poll_ns"] += poller.cpu_ns
            blocks[arm].append(statistics.median(times))
    return {"blocks": blocks, "cost": cost}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--size", default="small")
    a = ap.parse_args()
    cfg = TrainConfig(model=a.model, size=a.size, steps=a.steps, warmup=a.warmup)
    with tempfile.TemporaryDirectory() as tmp:
        res = launch(_bench_rank, 2, backend="gloo", args=(cfg, a.repeats, a.steps, a.warmup, tmp),
                     timeout_s=1800, preload=("dpcore.write.training.trainer",))
        rows = sum(1 for _ in open(Path(tmp) / "live.csv")) - 1
    b = res[0]["blocks"]
    off, live = statistics.median(b["off"]), statistics.median(b["live"])
    paired = statistics.median(y / x for x, y in zip(b["off"], b["live"]))
    print("block medians, ms (rank 0): off  " + ", ".join(f"{v:.3f}" for v in b["off"]))
    print("                            live " + ", ".join(f"{v:.3f}" for v in b["live"]))
    print(f"off {off:.3f} ms, live {live:.3f} ms per step: ratio of medians {live / off:.4f}, "
          f"median of per-repeat ratios {paired:.4f} ({rows} live rows written)")
    # The added work itself, independent of the machine's noise: rank 0's CPU time per step
    # (the main thread's put, its channel thread, and its collector thread), against a step.
    c = res[0]["cost"]
    per_step_us = (c["put_ns"] + c["thread_ns"] + c["poll_ns"]) / max(1, c["rows"]) / 1e3
    print(f"rank 0 added CPU per step: put {c['put_ns'] / max(1, c['rows']) / 1e3:.1f} us, channel "
          f"thread {c['thread_ns'] / max(1, c['rows']) / 1e3:.1f} us, collector "
          f"{c['poll_ns'] / max(1, c['rows']) / 1e3:.1f} us = {per_step_us:.1f} us, "
          f"{100 * per_step_us / 1e3 / off:.3f} % of the median step; "
          f"{(c['put_ns'] + c['thread_ns'] + c['poll_ns']) / max(1, c['wall_ns']) * 100:.3f} % of "
          "one core over the live arm's wall time")


if __name__ == "__main__":
    main()
