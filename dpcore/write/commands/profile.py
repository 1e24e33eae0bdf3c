"""``python -m dpcore profile``: plan the jobs, run each one, write the run directory.

One loop serves both worlds dpcore runs jobs in (:mod:`dpcore.write.runtime.world`): ranks it
spawns itself, and the world ``torchrun`` made (every rank runs the same jobs, rank 0 writes;
single-process variants cannot run there and are recorded as skipped). The run's life cycle
(statuses, a failing job, Ctrl-C) is :class:`~dpcore.write.capture.run_lifecycle.RunLife`,
shared with ``allreduce`` and ``dpcore.record``; this module says which jobs a profile has and
how one runs. Its options are validated when they are built (:class:`ProfileOptions`).

A failing job never sinks the run: its error is recorded in run.json and the next job runs.
Ctrl-C (or SIGTERM) marks the run ``interrupted`` and keeps every finished job (all files were
written atomically as each job ended). The end-of-run table is printed by the CLI, which owns
the read side; this module never imports pandas or the analysis.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from dpcore.contract import runformat
from dpcore.contract.config import BUCKET_SENSITIVE, SINGLE_PROCESS
from dpcore.contract.options import ProfileOptions
from dpcore.write.capture.inject import Injections
from dpcore.write.capture.job_monitor import JobMonitor
from dpcore.write.capture.run_lifecycle import JobSpec, RunLife, train_job_entry, write_job
from dpcore.write.capture.run_writer import RunWriter
from dpcore.write.commands.profile_rank import profile_job
from dpcore.write.runtime.progress import Progress
from dpcore.write.runtime.world import LocalWorld, TorchrunWorld, open_world
from dpcore.write.training.precision import resolve_dtype

#: What the spawned ranks of a profile job run: the forkserver imports these once.
PRELOAD = ("dpcore.write.training.trainer", "dpcore.write.commands.profile_rank",
           "dpcore.write.dp.comm", "dpcore.write.capture.rank_channel")


def plan_jobs(opts: ProfileOptions, run_dir: Path | None) -> list[JobSpec]:
    """One job per (variant, world size[, bucket size]).

    Multi-process variants run at every world size, 1 included (their T(1) on the scaling
    curve). ``single`` runs once at 1; ``manual`` and ``data_parallel`` once, with as many
    replicas as the largest world size. A bucket sweep adds jobs for the bucket-sensitive
    variants at every world size. ``--comm-hook`` adds one ``torch_ddp`` job per hook at every
    world size >= 2 (``torch_ddp-ws2-b25-powersgd``), beside the plain one they are compared with.
    """
    cfg = opts.train
    jobs: list[JobSpec] = []
    top = max(opts.world_sizes)
    buckets = sorted(set(opts.bucket_sweep) | {cfg.bucket_mb})
    for variant in opts.variants:
        if variant in SINGLE_PROCESS:
            ws = 1 if variant == "single" else top
            cells = [(ws, 1, cfg.bucket_mb)]
        else:
            cells = [(ws, ws, b) for ws in opts.world_sizes
                     for b in (buckets if variant in BUCKET_SENSITIVE else [cfg.bucket_mb])]
        for ws, procs, b in cells:
            hooks = [h for h in opts.comm_hooks if h != "none" or "none" in opts.comm_hooks] \
                if variant == "torch_ddp" and ws > 1 else ["none"]
            for hook in dict.fromkeys(["none", *hooks]):  # the plain job always: the reference
                jid = runformat.job_id(variant, ws, b) + ("" if hook == "none" else f"-{hook}")
                tdir = str(runformat.trace_dir(run_dir, jid)) if (opts.trace and run_dir) else None
                jobs.append(JobSpec(jid, variant, ws, procs, b, tdir, hook))
    return jobs


def drop_rank_leftovers(trace_dir: str | None) -> None:
    """Remove what killed ranks leave in a job's trace folder: ``rank<r>.profiler.log`` (a
    rank's stderr while tracing, normally removed by the rank itself when it holds only
    Kineto's chatter) and half-exported ``.rank<r>.<pid>.tmp.json.gz`` files; then the folder
    itself if nothing else is in it. A rank killed at --timeout or by Ctrl-C runs no cleanup
    of its own, and these files are noise in the run directory, never a trace."""
    if not trace_dir:
        return
    tdir = Path(trace_dir)
    for pattern in ("rank*.profiler.log", ".rank*.tmp.json.gz"):
        for path in tdir.glob(pattern):
            path.unlink(missing_ok=True)
    try:
        tdir.rmdir()  # only succeeds when empty
    except OSError:
        pass


def ranks_on_host(opts: ProfileOptions) -> int:
    """The most ranks any job of the run puts on this host (1 when only single-process
    variants run): what threads per rank and pinning are sized for."""
    return max(opts.world_sizes) if any(v not in SINGLE_PROCESS for v in opts.variants) else 1


def plan(world: LocalWorld | TorchrunWorld, opts: ProfileOptions,
         run_dir: Path) -> tuple[list[JobSpec], list[str]]:
    """The jobs this world runs, and the variants it cannot run (single-process ones under
    torchrun, whose processes are torchrun's)."""
    if world.spawns:
        return plan_jobs(opts, run_dir), []
    multi = tuple(v for v in opts.variants if v not in SINGLE_PROCESS)
    return (plan_jobs(replace(opts, variants=multi), run_dir),
            [v for v in opts.variants if v in SINGLE_PROCESS])


def steps_total(opts: ProfileOptions) -> tuple[int, str]:
    """Steps rank 0 reports for one job, and what they are (the progress bar's note): warm-up,
    timed, then (traced) the profiler's own warm-up step and the profiled ones; no warm-up adds
    one untimed memory step after the timed ones (profile_rank samples memory on a step no
    timing pays for). The hang monitor and the progress bar both count with this."""
    cfg = opts.train
    traced = cfg.profile_steps + 1 if opts.trace else 0
    memory = 0 if cfg.warmup else 1
    note = (f"{cfg.warmup} warm-up + {cfg.steps} timed" + (f" + {memory} memory" if memory else "")
            + (f" + {traced} under the profiler" if traced else ""))
    return cfg.warmup + cfg.steps + memory + traced, note


def run_job(world: LocalWorld | TorchrunWorld, writer: RunWriter | None, spec: JobSpec,
            opts: ProfileOptions, progress: Progress) -> dict[str, Any]:
    """Run one job in ``world``; on the writing rank write its rows and return its run.json
    fields (JobFailed when a rank raised, died or timed out)."""
    if spec.trace_dir and not world.spawns:  # each node writes its own ranks' traces on its own disk
        Path(spec.trace_dir).mkdir(parents=True, exist_ok=True)
    inject = Injections.of(opts.inject_delay, opts.inject_hang)
    monitor = JobMonitor(spec.job_id, spec.processes, writer.run_dir if writer else None,
                         hang_timeout_s=opts.hang_timeout_s, timeout_s=opts.timeout_s,
                         watch=world.spawns, steps_total=steps_total(opts)[0])
    try:
        results = world.run(profile_job, spec.processes, (spec, opts.train, inject),
                            progress.step, monitor=monitor)
    except BaseException:  # failed, timed out or interrupted: spawned ranks were killed mid-trace
        if world.spawns:
            drop_rank_leftovers(spec.trace_dir)
        raise
    return write_job(writer, spec, results) if writer and results else {}


def run_profile(opts: ProfileOptions, argv: list[str]) -> tuple[int, Path | None]:
    """Run every job. Returns the exit status (0 complete, 1 some job failed, 130 Ctrl-C) and,
    on the process that wrote it, the run directory (None on torchrun's other ranks)."""
    world = open_world(opts.backend, opts.world_sizes, ranks_on_host=ranks_on_host(opts),
                       timeout_s=opts.timeout_s, threads=opts.threads_per_rank, pin=opts.pin,
                       preload=PRELOAD, device=opts.device)
    # one precision for every job, resolved where the device is known (run.json says which)
    opts = replace(opts, world_sizes=world.world_sizes,
                   train=replace(opts.train, dtype=resolve_dtype(opts.train.dtype, world.device)))
    cfg = opts.train
    # comm_hook: the plain jobs' (none); a hook job names its own in its job entry.
    # delay_rank / delay_ms: --inject-delay (-1: nobody)
    delay = opts.inject_delay or (-1, 0.0)
    config = {**cfg.to_dict(), "comm_hook": "none", "delay_rank": delay[0], "delay_ms": delay[1],
              "variants": list(opts.variants),
              "world_sizes": list(opts.world_sizes), "bucket_sweep": list(opts.bucket_sweep),
              "trace": opts.trace}
    life = RunLife(world, lambda: RunWriter(opts.out, opts.name, command=argv, config=config,
                                            environment=world.environment(), run_id=opts.run_id))
    # From the moment run.json exists: a Ctrl-C while jobs are planned or listed must end the
    # run "interrupted", never leave it "running" with nobody writing it.
    with life:
        if world.writes:  # before the first job (and once --out proved writable): where each world size runs, and why
            print(f"dpcore: {world.placement.describe(opts.world_sizes)}", file=sys.stderr, flush=True)
        jobs, skipped = plan(world, opts, life.run_dir)
        steps, steps_note = steps_total(opts)
        progress = Progress(opts.progress if world.writes else "none", len(jobs))
        life.start(progress)
        for v in skipped:
            life.add_job({"id": runformat.job_id(v, 1, cfg.bucket_mb), "kind": "train", "variant": v,
                          "world_size": 1, "status": "skipped", **world.placement.job_fields(1),
                          "skip_reason": "single-process variant: run it without torchrun"})
        for spec in jobs:
            life.add_job({**train_job_entry(spec, "pending", world.oversubscribed(spec.processes)),
                          **world.placement.job_fields(spec.processes)})
        for spec in jobs:
            life.run_job(spec.job_id, steps,
                         functools.partial(run_job, world, life.writer, spec, opts, progress), steps_note)
    return runformat.EXIT_CODES[life.status], (life.run_dir if life.writer else None)
