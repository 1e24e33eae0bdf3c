"""``python -m dpcore allreduce``: nccl-tests-style all-reduce benchmark of every algorithm.

Each cell (algorithm, world size, size) runs warm-up calls, then timed repeats; a repeat's
time is the slowest rank's (the collective is done only when every rank is done), and the
cell reports the median. algbw = bytes / time; busbw = algbw * 2(N-1)/N, nccl-tests'
convention, which makes the number comparable to the link bandwidth whatever N is.
One call per from-scratch cell is run with the message recorder on, for the ring view.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpcore.contract.metrics import bus_factor
from dpcore.write.clock import measure_offset
from dpcore.contract.errors import JobFailed
from dpcore.write.recorder import Recorder
from dpcore.write.launch import DistContext, launch, resolve_backend
from dpcore.write.resources import physical_cores, pinning, threads_per_rank
from dpcore.write.progress import Progress
from dpcore.contract.runformat import EXIT_CODES, allreduce_job_id
from dpcore.write.rundir import RunOptions, RunWriter, environment


@dataclass(frozen=True)
class AllreduceOptions(RunOptions):
    algos: tuple[str, ...]
    world_sizes: tuple[int, ...]
    sizes: tuple[int, ...]          # bytes
    warmup: int = 3
    repeats: int = 0                # 0 == adaptive: more repeats for small sizes


def repeats_for(nbytes: int, requested: int) -> int:
    if requested > 0:
        return requested
    return 50 if nbytes <= 64 * 1024 else 20 if nbytes <= 4 * 2**20 else 10


def bench_worker(ctx: DistContext, job_id: str, algo: str, sizes: tuple[int, ...],
                 warmup: int, repeats: int) -> dict[str, Any]:
    """Per rank: time every size; returns per-repeat times and one recorded call's messages."""
    from dpcore.write.comm import all_reduce

    offset, _ = measure_offset(ctx)
    rec = Recorder(job_id, ctx.rank, offset)
    times: dict[int, list[float]] = {}
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
        if algo != "native":
            rec.step = si
            dist.barrier()
            all_reduce(t, algo, "sum", recorder=rec, call=si)
        ctx.report({"done": si + 1, "phase": f"{nbytes} B"})
    return {"times": times, "messages": rec.message_rows(), "offset_ns": offset}


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


def format_table(rows: list[dict]) -> str:
    head = f"{'algo':>8} {'ranks':>5} {'size(B)':>12} {'count':>11} {'time(us)':>10} " \
           f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"
    lines = ["# all-reduce, float32, sum; busbw = algbw * 2(N-1)/N (nccl-tests)", head]
    for r in rows:
        lines.append(f"{r['algo']:>8} {r['world_size']:>5} {r['bytes']:>12} {r['bytes'] // 4:>11} "
                     f"{r['time_ms'] * 1e3:>10.1f} {r['algbw_gbps']:>12.3f} {r['busbw_gbps']:>12.3f}")
    return "\n".join(lines)


def run_allreduce(opts: AllreduceOptions, argv: list[str]) -> int:
    backend = resolve_backend(opts.backend, max(opts.world_sizes))
    config = {"algos": list(opts.algos), "world_sizes": list(opts.world_sizes),
              "sizes": list(opts.sizes), "warmup": opts.warmup, "repeats": opts.repeats,
              "dtype": "float32"}
    top = max(opts.world_sizes)
    threads = threads_per_rank(top)  # one value for every cell, as in `profile`
    pin = pinning(top, threads) == "per-rank"
    writer = RunWriter(opts.out, opts.name, command=argv, config=config,
                       environment=environment(backend, list(opts.world_sizes), threads=threads, pin=pin),
                       kind="allreduce", run_id=opts.run_id)
    cells = [(a, n) for n in opts.world_sizes for a in opts.algos]
    progress = Progress(opts.progress, len(cells))
    progress.run_start(str(writer.run_dir))
    rows: list[dict] = []
    failed, status = 0, "failed"  # until the loop has really finished
    try:
        for algo, n in cells:
            jid = allreduce_job_id(algo, n)
            writer.add_job({"id": jid, "kind": "allreduce", "algo": algo, "variant": algo,
                            "world_size": n, "bucket_mb": None, "status": "running",
                            "oversubscribed": n > physical_cores()})
            progress.job_start(jid, len(opts.sizes))
            try:
                res = launch(bench_worker, n, backend=backend, timeout_s=opts.timeout_s,
                             args=(jid, algo, opts.sizes, opts.warmup, opts.repeats),
                             on_progress=progress.step, threads=threads, pin=pin)
                cell = cell_rows(jid, algo, n, res)
                rows += cell
                writer.append_rows("allreduce", cell)
                writer.append_rows("messages", [m for r in res for m in r["messages"]])
                writer.add_job({"id": jid, "status": "complete", "clock_offsets_ns":
                                {str(i): r["offset_ns"] for i, r in enumerate(res)}})
                progress.job_end(jid, "complete")
            except JobFailed as exc:
                failed += 1
                writer.add_job({"id": jid, "status": "failed", "error": exc.message.strip()})
                progress.job_end(jid, "failed", exc.message.splitlines()[0])
        status = "failed" if failed else "complete"
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        writer.close(status)
        progress.run_end(str(writer.run_dir), status)
    if opts.progress != "json":
        print(format_table(rows))
        print(f"\nrun {status}: {writer.run_dir}", file=sys.stderr)
    return EXIT_CODES[status]
