"""``torchrun ... -m dpcore profile``: profile the world torchrun made; rank 0 writes the run.

Every rank runs the same job list (one job per multi-process variant at torchrun's world
size). Results are gathered to rank 0 with ``gather_object`` after each job, so the run
directory grows job by job exactly as in a local run. Across nodes, each rank writes its own
trace under the same run path on its own node's disk.
"""
from __future__ import annotations

import datetime as _dt
import os
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch.distributed as dist

from .config import TrainConfig
from .launch import launch, physical_cores
from .profile_worker import profile_job
from .progress import Progress
from .rundir import EXIT_CODES, RunWriter, environment


def run_profile_torchrun(opts: Any, cfg: TrainConfig, argv: list[str], backend: str) -> int:
    from .config import SINGLE_PROCESS
    from .profiler import plan_jobs, summary_table

    ws, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", ws))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=_dt.timedelta(seconds=opts.timeout_s))
    opts = replace(opts, world_sizes=(ws,))
    writer = None
    box: list[Any] = [None]
    if rank == 0:
        env = {**environment(backend, [ws], ranks_per_host=local_ws), "torchrun": True,
               "nnodes": ws // max(local_ws, 1)}
        config = {**cfg.to_dict(), "variants": list(opts.variants), "world_sizes": [ws],
                  "bucket_sweep": list(opts.bucket_sweep), "trace": opts.trace}
        writer = RunWriter(opts.out, opts.name, command=argv, config=config, environment=env,
                           run_id=opts.run_id)
        box[0] = str(writer.run_dir)
    dist.broadcast_object_list(box, src=0)
    run_dir = Path(box[0])
    skipped = [v for v in opts.variants if v in SINGLE_PROCESS]
    jobs = plan_jobs(replace(opts, variants=tuple(v for v in opts.variants
                                                  if v not in SINGLE_PROCESS)), cfg, run_dir)
    progress = Progress(opts.progress if rank == 0 else "none", len(jobs))
    steps_total = cfg.warmup + cfg.steps + (cfg.profile_steps + 1 if opts.trace else 0)
    if writer:
        progress.run_start(str(run_dir))
        for v in skipped:
            writer.add_job({"id": f"{v}-ws1", "kind": "train", "variant": v, "world_size": 1,
                            "status": "skipped", "skip_reason": "single-process variant: run "
                            "it without torchrun"})
    failed, status = 0, "failed"  # until the loop has really finished
    try:
        for spec in jobs:
            failed += _run_one(spec, cfg, opts, ws, rank, local_ws, backend, writer, progress,
                               steps_total)
        status = "failed" if failed else "complete"
    except KeyboardInterrupt:  # torchrun forwards Ctrl-C/SIGTERM to every rank
        status = "interrupted"
    finally:
        if writer:
            writer.close(status)
            progress.run_end(str(run_dir), status)
    if status == "interrupted":
        return EXIT_CODES[status]  # the other ranks are stopping too: no collective goodbye
    if writer and opts.progress != "json":
        print(summary_table(run_dir))
        print(f"\nrun {status}: {run_dir}")
    dist.barrier()
    dist.destroy_process_group()
    return EXIT_CODES[status]


def _run_one(spec: Any, cfg: TrainConfig, opts: Any, ws: int, rank: int, local_ws: int,
             backend: str, writer: RunWriter | None, progress: Progress, steps_total: int) -> int:
    """One job on every rank; rank 0 records it. Returns 1 if it failed, else 0."""
    from .profiler import _record_job

    if spec.trace_dir:
        Path(spec.trace_dir).mkdir(parents=True, exist_ok=True)
    job = {"id": spec.job_id, "kind": "train", "variant": spec.variant, "world_size": ws,
           "processes": ws, "bucket_mb": spec.bucket_mb,
           "oversubscribed": local_ws > physical_cores()}
    if writer:
        writer.add_job({**job, "status": "running"})
    progress.job_start(spec.job_id, steps_total)
    try:
        mine: Any = launch(profile_job, ws, backend=backend, args=(spec, cfg),
                           timeout_s=opts.timeout_s, on_progress=progress.step)[rank]
    except Exception as exc:  # noqa: BLE001 - reported through rank 0
        mine = {"error": f"rank {rank}: {type(exc).__name__}: {exc}\n"
                         f"{traceback.format_exc(limit=6)}"}
    gathered: list[Any] = [None] * ws if rank == 0 else []
    dist.gather_object(mine, gathered if rank == 0 else None, dst=0)
    if not writer:
        return 0
    errors = [g["error"] for g in gathered if g and "error" in g]
    if errors:
        job.update(status="failed", error=errors[0])
    else:
        job.update(_record_job(writer, spec, gathered))
    writer.add_job(job)
    progress.job_end(spec.job_id, job["status"], job.get("error", "")[:200])
    return 1 if errors else 0
