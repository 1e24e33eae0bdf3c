"""``python -m dpcore allreduce``: nccl-tests-style all-reduce benchmark of every algorithm.

Each cell (algorithm, world size, size) runs warm-up calls, then timed repeats; a repeat's
time is the slowest rank's (the collective is done only when every rank is done), and the
cell reports the median. algbw = bytes / time; busbw = algbw * 2(N-1)/N, nccl-tests'
convention, which makes the number comparable to the link bandwidth whatever N is.
One call per from-scratch cell is run with the message recorder on, for the ring view.

Like nccl-tests' ``#wrong``, every cell also checks the result: one more call on inputs whose
sum is known exactly (:func:`check_input`: small integers, exact in float32 whatever order the
algorithm adds them in) counts the elements that differ from the expected sum, summed over
ranks. The counts go into the job's run.json entry (``wrong_elements``: {bytes: count}), so
allreduce.csv keeps docs/DESIGN.md's columns; ``summarize`` and this command print them.

The run's life cycle (statuses, a failing cell, Ctrl-C) is the one ``profile`` uses
(:class:`~dpcore.write.capture.run_lifecycle.RunLife`), and so are its worlds: cells run on
ranks spawned here, or, under ``torchrun``, on torchrun's ranks (across nodes; its one world
size), rank 0 writing. Options are validated when built (:class:`AllreduceOptions`).
"""
from __future__ import annotations

import functools
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dpcore.contract.bandwidth import bus_factor
from dpcore.contract.config import gloo_cuda_refusal
from dpcore.contract.options import AllreduceOptions
from dpcore.contract.runformat import EXIT_CODES, allreduce_job_id
from dpcore.write.capture.comm_log import Recorder
from dpcore.write.capture.run_lifecycle import RunLife
from dpcore.write.capture.run_writer import RunWriter
from dpcore.write.runtime.clock import measure_offset
from dpcore.write.runtime.context import DistContext
from dpcore.write.runtime.progress import Progress
from dpcore.write.runtime.world import LocalWorld, TorchrunWorld, open_world

#: What the spawned ranks of a cell run: the forkserver imports these once.
PRELOAD = ("dpcore.write.commands.allreduce", "dpcore.write.dp.comm")


def repeats_for(nbytes: int, requested: int) -> int:
    if requested > 0:
        return requested
    return 50 if nbytes <= 64 * 1024 else 20 if nbytes <= 4 * 2**20 else 10


#: Input values repeat with this period along the tensor, so a chunk delivered to the wrong
#: place is caught, while every sum stays a small integer (exact in float32).
CHECK_PERIOD = 1024


def check_input(numel: int, rank: int, device: Any = "cpu") -> torch.Tensor:
    """Rank r's input of the correctness call: x[i] = (i mod 1024) + r + 1."""
    return (torch.arange(numel, device=device) % CHECK_PERIOD).to(torch.float32) + float(rank + 1)


def expected_sum(numel: int, world_size: int, device: Any = "cpu") -> torch.Tensor:
    """The exact all-reduce sum of :func:`check_input` over ``world_size`` ranks:
    N·(i mod 1024) + N(N+1)/2."""
    n = world_size
    return (torch.arange(numel, device=device) % CHECK_PERIOD).to(torch.float32) * n + n * (n + 1) / 2


def count_wrong(result: torch.Tensor, world_size: int) -> int:
    """Elements of an all-reduce result of :func:`check_input` that differ from the exact sum."""
    return int((result != expected_sum(result.numel(), world_size, result.device)).sum().item())


def bench_worker(ctx: DistContext, job_id: str, algo: str, sizes: tuple[int, ...],
                 warmup: int, repeats: int) -> dict[str, Any]:
    """Per rank: time every size; returns per-repeat times, one recorded call's messages and,
    per size, how many elements of a checked call were wrong on this rank."""
    from dpcore.write.dp.comm import all_reduce

    offset, _ = measure_offset(ctx)
    rec = Recorder(job_id, ctx.rank, offset)
    rec.time_on(ctx.device)  # a CUDA job's messages end when the stream says so, not at NCCL's return
    times: dict[int, list[float]] = {}
    wrong: dict[int, int] = {}
    sync = (lambda: torch.cuda.synchronize()) if ctx.is_cuda else (lambda: None)
    for si, nbytes in enumerate(sizes):
        numel = nbytes // 4  # sizes are validated to be whole float32 counts
        t = torch.full((numel,), float(ctx.rank + 1), device=ctx.device)
        n = repeats_for(nbytes, repeats)
        for _ in range(warmup):
            all_reduce(t, algo, "sum")
        out = []
        for _ in range(n):
            dist.barrier()
            sync()
            t0 = time.perf_counter_ns()
            all_reduce(t, algo, "sum")
            sync()
            out.append((time.perf_counter_ns() - t0) / 1e6)
        times[nbytes] = out
        t.copy_(check_input(numel, ctx.rank, ctx.device))  # the recorded call is the checked call
        dist.barrier()
        if algo != "native":
            rec.step = si
            all_reduce(t, algo, "sum", recorder=rec, call=si)
        else:
            all_reduce(t, algo, "sum")
        sync()
        wrong[nbytes] = count_wrong(t, ctx.world_size)
        ctx.report({"done": si + 1, "phase": f"{nbytes} B"})
    return {"times": times, "wrong": wrong, "messages": rec.message_rows(), "offset_ns": offset}


def wrong_elements(results: list[dict]) -> dict[str, int]:
    """{bytes (as a JSON key): wrong elements summed over ranks} of one cell."""
    total: dict[str, int] = {}
    for r in results:
        for nbytes, n in r.get("wrong", {}).items():
            total[str(nbytes)] = total.get(str(nbytes), 0) + int(n)
    return total


def cell_rows(job_id: str, algo: str, n: int, results: list[dict]) -> list[dict]:
    """allreduce.csv rows: per size, the median over repeats of the slowest rank's time."""
    rows = []
    for nbytes in results[0]["times"]:
        per_rank = [r["times"][nbytes] for r in results]
        slowest = [max(ts) for ts in zip(*per_rank)]
        ms = statistics.median(slowest)
        algbw = nbytes / (ms / 1e3) / 1e9 if ms > 0 else 0.0
        rows.append({"job_id": job_id, "algo": algo, "world_size": n, "bytes": nbytes,
                     "repeats": len(slowest), "time_ms": round(ms, 6),
                     "algbw_gbps": round(algbw, 6),
                     "busbw_gbps": round(algbw * bus_factor("all_reduce", n), 6)})
    return rows


def run_cell(world: LocalWorld | TorchrunWorld, writer: RunWriter | None, jid: str, algo: str,
             n: int, opts: AllreduceOptions, progress: Progress) -> dict[str, Any]:
    """Run one (algorithm, world size) cell; on the writing rank write its allreduce.csv and
    messages.csv rows and return its run.json fields (JobFailed when a rank failed)."""
    res = world.run(bench_worker, n, (jid, algo, opts.sizes, opts.warmup, opts.repeats),
                    progress.step)
    if writer is None or not res:
        return {}
    writer.append_rows("allreduce", cell_rows(jid, algo, n, res))
    writer.append_rows("messages", [m for r in res for m in r["messages"]])
    return {"wrong_elements": wrong_elements(res),
            "clock_offsets_ns": {str(i): r["offset_ns"] for i, r in enumerate(res)}}


def run_allreduce(opts: AllreduceOptions, argv: list[str]) -> tuple[int, Path | None]:
    """Run every (algorithm, world size) cell into a run directory; returns the exit code and,
    on the process that wrote it, the run directory (None on torchrun's other ranks). The CLI
    prints its table through the read wing, as `summarize` does."""
    # one threads-per-rank value for every cell (cores // largest world size), as in `profile`
    world = open_world(opts.backend, opts.world_sizes, timeout_s=opts.timeout_s, preload=PRELOAD,
                       device=opts.device)
    opts = replace(opts, world_sizes=world.world_sizes)
    config = {"algos": list(opts.algos), "world_sizes": list(opts.world_sizes),
              "sizes": list(opts.sizes), "warmup": opts.warmup, "repeats": opts.repeats,
              "dtype": "float32"}
    life = RunLife(world, lambda: RunWriter(opts.out, opts.name, command=argv, config=config,
                                            environment=world.environment(), kind="allreduce",
                                            run_id=opts.run_id))
    with life:
        if world.writes:  # before the first job (and once --out proved writable): where each world size runs, and why
            print(f"dpcore: {world.placement.describe(opts.world_sizes)}", file=sys.stderr, flush=True)
        cells = [(a, n) for n in opts.world_sizes for a in opts.algos]
        progress = Progress(opts.progress if world.writes else "none", len(cells))
        life.start(progress)
        for algo, n in cells:
            life.add_job({"id": allreduce_job_id(algo, n), "kind": "allreduce", "algo": algo,
                          "variant": algo, "world_size": n, "bucket_mb": None,
                          "status": "pending", "oversubscribed": world.oversubscribed(n),
                          **world.placement.job_fields(n)})
        refused = {a: gloo_cuda_refusal(a, world.backend, world.device) for a in opts.algos}
        for algo, n in cells:
            jid = allreduce_job_id(algo, n)
            if refused[algo]:  # ranks sharing GPUs over gloo: no send/recv on CUDA tensors
                life.add_job({"id": jid, "status": "skipped", "skip_reason": refused[algo]})
                continue
            life.run_job(jid, len(opts.sizes),
                         functools.partial(run_cell, world, life.writer, jid, algo, n, opts, progress))
    return EXIT_CODES[life.status], (life.run_dir if life.writer else None)
