"""``python -m dpcore profile``: plan the jobs, run each one, write the run directory.

One loop serves both worlds dpcore runs in: ranks it spawns itself (:class:`LocalWorld`) and
the world ``torchrun`` made (:class:`TorchrunWorld`, where every rank runs the same jobs and
rank 0 writes). A world only says how a job runs and whose results reach the writer; planning,
recording, progress and the run's final status are written once, here.

A failing job never sinks the run: its error is recorded in run.json and the next job runs.
Ctrl-C (or SIGTERM) marks the run ``interrupted`` and keeps every finished job (all files were
written atomically as each job ended). The end-of-run table is printed by the CLI, which owns
the read side; this module never imports pandas or the analysis.
"""
from __future__ import annotations

import datetime as _dt
import os
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch.distributed as dist

from dpcore.contract import runformat as rf
from dpcore.contract.config import BUCKET_SENSITIVE, SINGLE_PROCESS, TrainConfig
from dpcore.contract.errors import JobFailed, UsageError
from dpcore.contract.intervals import comm_start, step_comm, union_length
from dpcore.write.capture.merged_trace import merge_job_traces
from dpcore.write.runtime.launch import in_torchrun, launch, resolve_backend
from dpcore.write.runtime.resources import (physical_cores, pinning,
                                     threads_per_rank)
from dpcore.write.runtime.progress import Progress
from dpcore.write.capture.run_writer import RunOptions, RunWriter, environment
from dpcore.write.commands.profile_rank import JobSpec, profile_job


@dataclass(frozen=True)
class ProfileOptions(RunOptions):
    variants: tuple[str, ...]
    world_sizes: tuple[int, ...]
    bucket_sweep: tuple[float, ...] = ()
    trace: bool = True
    threads_per_rank: int | None = None   # None: physical cores // largest world size
    pin: bool = True                      # pin each rank to its own CPUs where they fit


def plan_jobs(opts: ProfileOptions, cfg: TrainConfig, run_dir: Path | None) -> list[JobSpec]:
    """One job per (variant, world size[, bucket size]).

    Multi-process variants run at every world size, 1 included (their T(1) on the scaling
    curve). ``single`` runs once at 1; ``manual`` and ``data_parallel`` once, with as many
    replicas as the largest world size. A bucket sweep adds jobs for the bucket-sensitive
    variants at every world size.
    """
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
            jid = rf.job_id(variant, ws, b)
            tdir = str(rf.trace_dir(run_dir, jid)) if (opts.trace and run_dir) else None
            jobs.append(JobSpec(jid, variant, ws, procs, b, tdir))
    return jobs


def validate(opts: ProfileOptions, cfg: TrainConfig) -> str:
    """Refuse impossible requests before anything runs; returns the resolved backend."""
    if cfg.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {cfg.steps}")
    if cfg.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {cfg.warmup}")
    if opts.trace and not 0 < cfg.profile_steps <= cfg.steps:
        raise UsageError(f"--profile-steps must be between 1 and --steps ({cfg.steps}), got "
                         f"{cfg.profile_steps}; use --no-trace to skip tracing")
    if cfg.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if opts.threads_per_rank is not None and opts.threads_per_rank < 1:
        raise UsageError(f"--threads-per-rank must be >= 1, got {opts.threads_per_rank}")
    if cfg.bucket_mb <= 0 or any(b <= 0 for b in opts.bucket_sweep):
        raise UsageError("bucket sizes must be > 0 MB")
    for ws in opts.world_sizes:
        cfg.local_batch(ws)  # raises the divisibility error for strong scaling
    multi = [v for v in opts.variants if v not in SINGLE_PROCESS]
    top = max(opts.world_sizes) if multi else 1
    return resolve_backend(opts.backend, top)


def attach_comm(steps: list[dict], collectives: list[dict]) -> None:
    """Fill steps.csv's comm_ms / comm_ops / comm_bytes: the union of the rank's collective
    intervals clipped to the step window, none at world size 1 (``contract.intervals.step_comm``,
    the function the analysis uses too, so the file and every view agree)."""
    by_step: dict[tuple, list[dict]] = {}
    for c in collectives:
        by_step.setdefault((c["job_id"], int(c["rank"]), int(c["step"])), []).append(c)
    for row in steps:
        mine = by_step.get((row["job_id"], int(row["rank"]), int(row["step"])), [])
        start = comm_start([c["t_launch_ns"] for c in mine],
                           [rf.parse_ns(c["t_start_ns"]) or -1 for c in mine])
        clipped = step_comm(start, [c["t_end_ns"] for c in mine], row["t_start_ns"], row["step_ms"],
                            row.get("world_size"))
        row.update(comm_ms=round(union_length(*clipped) / 1e6, 6), comm_ops=len(mine),
                   comm_bytes=sum(int(c["bytes"]) for c in mine))


def record_job(writer: RunWriter, spec: JobSpec, results: list[Any]) -> dict:
    """Write one finished job's rows and merged trace; return its run.json fields."""
    first = results[0]
    if first.get("skip_reason"):
        return {"status": "skipped", "skip_reason": first["skip_reason"]}
    steps = [row for r in results for row in r["steps"]]
    attach_comm(steps, [row for r in results for row in r["collectives"]])
    writer.append_rows("steps", steps)
    for table in rf.JOB_TABLES:
        writer.append_rows(table, [row for r in results for row in r.get(table, [])])
    extra: dict[str, Any] = {
        "clock_offsets_ns": {str(i): r["offset_ns"] for i, r in enumerate(results)},
        "clock_rtt_ns": {str(i): r["rtt_ns"] for i, r in enumerate(results)},
        # (t_a, t_b) shared-clock brackets of each rank's dpcore_clock_sync#k markers
        "clock_sync_ns": {str(i): r["sync"] for i, r in enumerate(results) if r.get("trace")},
        "threads_per_rank": first.get("threads"),
        "cpus_per_rank": {str(i): r.get("cpus", []) for i, r in enumerate(results)},
    }
    errors = [r["trace_error"] for r in results if r.get("trace_error")]
    if errors:
        extra["trace_error"] = errors[0]
    traces = {i: Path(r["trace"]) for i, r in enumerate(results) if r.get("trace")}
    if traces and all(p.exists() for p in traces.values()):
        tdir = Path(spec.trace_dir)
        msgs = [m for r in results for m in r["messages"]]
        extra["merged_trace"] = merge_job_traces(traces, {i: results[i]["sync"] for i in traces},
                                                 msgs, tdir / rf.MERGED_TRACE)
        extra["traces"] = sorted(p.name for p in tdir.iterdir() if rf.trace_key(p.name))
    return {"status": "complete", **extra}


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


def _set_resources(world: Any, opts: ProfileOptions, ranks_on_host: int) -> None:
    """Equal resources for every job of a run: the same threads per rank (cores // the most
    ranks any job puts on this host, unless --threads-per-rank), and every rank pinned to its
    own CPUs when all of them fit, so T(1) and T(N) differ only by what data parallelism adds."""
    world.threads = opts.threads_per_rank or threads_per_rank(ranks_on_host)
    world.pin = opts.pin and pinning(ranks_on_host, world.threads) == "per-rank"


class LocalWorld:
    """Ranks spawned by dpcore on this host, one launch per job; this process writes."""

    writes = True

    def __init__(self, opts: ProfileOptions, backend: str) -> None:
        self.opts, self.backend = opts, backend
        multi = [v for v in opts.variants if v not in SINGLE_PROCESS]
        self.ranks_on_host = max(opts.world_sizes) if multi else 1
        _set_resources(self, opts, self.ranks_on_host)

    def plan(self, cfg: TrainConfig, run_dir: Path) -> tuple[list[JobSpec], list[str]]:
        return plan_jobs(self.opts, cfg, run_dir), []

    def environment(self) -> dict:
        return environment(self.backend, list(self.opts.world_sizes), threads=self.threads,
                           pin=self.pin)

    def oversubscribed(self, spec: JobSpec) -> bool:
        return spec.processes > physical_cores()

    def run_dir(self, writer: RunWriter | None) -> Path:
        assert writer is not None
        return writer.run_dir

    def run(self, spec: JobSpec, cfg: TrainConfig, progress: Progress) -> list[Any] | None:
        """Every rank's result; JobFailed when a rank raised, died or timed out."""
        try:
            return launch(profile_job, spec.processes, backend=self.backend, args=(spec, cfg),
                          timeout_s=self.opts.timeout_s, on_progress=progress.step,
                          threads=self.threads, pin=self.pin)
        except BaseException:  # failed, timed out or interrupted: ranks were killed mid-trace
            drop_rank_leftovers(spec.trace_dir)
            raise

    def finish(self, status: str) -> None:
        """Nothing to tear down: launch() reaped every rank of every job."""


class TorchrunWorld:
    """The world torchrun made: every rank runs every job, results gathered to rank 0, which
    writes. Single-process variants cannot run here and are recorded as skipped."""

    def __init__(self, opts: ProfileOptions, backend: str) -> None:
        self.ws, self.rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        self.local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", self.ws))
        self.backend, self.writes = backend, self.rank == 0
        self.opts = replace(opts, world_sizes=(self.ws,))
        _set_resources(self, opts, self.local_ws)
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=_dt.timedelta(seconds=opts.timeout_s))

    def plan(self, cfg: TrainConfig, run_dir: Path) -> tuple[list[JobSpec], list[str]]:
        multi = tuple(v for v in self.opts.variants if v not in SINGLE_PROCESS)
        return (plan_jobs(replace(self.opts, variants=multi), cfg, run_dir),
                [v for v in self.opts.variants if v in SINGLE_PROCESS])

    def environment(self) -> dict:
        return {**environment(self.backend, [self.ws], ranks_per_host=self.local_ws,
                              threads=self.threads, pin=self.pin),
                "torchrun": True, "nnodes": self.ws // max(self.local_ws, 1)}

    def oversubscribed(self, spec: JobSpec) -> bool:
        return self.local_ws > physical_cores()

    def run_dir(self, writer: RunWriter | None) -> Path:
        """Rank 0 made the folder; every rank learns its path (traces go under it)."""
        box: list[Any] = [str(writer.run_dir) if writer else None]
        dist.broadcast_object_list(box, src=0)
        return Path(box[0])

    def run(self, spec: JobSpec, cfg: TrainConfig, progress: Progress) -> list[Any] | None:
        if spec.trace_dir:  # each node writes its own ranks' traces on its own disk
            Path(spec.trace_dir).mkdir(parents=True, exist_ok=True)
        try:
            mine: Any = launch(profile_job, self.ws, backend=self.backend, args=(spec, cfg),
                               timeout_s=self.opts.timeout_s, on_progress=progress.step,
                               threads=self.threads, pin=self.pin)[self.rank]
        except Exception as exc:  # noqa: BLE001 - reported through rank 0
            mine = {"error": f"rank {self.rank}: {type(exc).__name__}: {exc}\n"
                             f"{traceback.format_exc(limit=6)}"}
        gathered: list[Any] = [None] * self.ws if self.writes else []
        dist.gather_object(mine, gathered if self.writes else None, dst=0)
        if not self.writes:
            return None
        failed = [(i, g["error"]) for i, g in enumerate(gathered) if g and "error" in g]
        if failed:
            raise JobFailed(*failed[0])
        return gathered

    def finish(self, status: str) -> None:
        """A clean goodbye, except after Ctrl-C: the other ranks are stopping too."""
        if status != "interrupted":
            dist.barrier()
            dist.destroy_process_group()


def run_profile(opts: ProfileOptions, cfg: TrainConfig, argv: list[str]) -> tuple[int, Path | None]:
    """Run every job. Returns the exit status (0 complete, 1 some job failed, 130 Ctrl-C) and,
    on the process that wrote it, the run directory (None on torchrun's other ranks)."""
    backend = validate(opts, cfg)
    world: LocalWorld | TorchrunWorld = (TorchrunWorld(opts, backend) if in_torchrun()
                                         else LocalWorld(opts, backend))
    wopts = world.opts
    writer = None
    if world.writes:
        config = {**cfg.to_dict(), "variants": list(wopts.variants),
                  "world_sizes": list(wopts.world_sizes), "bucket_sweep": list(wopts.bucket_sweep),
                  "trace": wopts.trace}
        writer = RunWriter(wopts.out, wopts.name, command=argv, config=config,
                           environment=world.environment(), run_id=wopts.run_id)
    run_dir = world.run_dir(writer)
    failed, status = 0, "failed"  # until the loop has really finished
    progress: Progress | None = None
    # One try from the moment run.json exists: a Ctrl-C while jobs are planned or listed
    # must end the run "interrupted", never leave it "running" with nobody writing it.
    try:
        jobs, skipped = world.plan(cfg, run_dir)
        steps_total = cfg.warmup + cfg.steps + (cfg.profile_steps + 1 if wopts.trace else 0)
        progress = Progress(wopts.progress if world.writes else "none", len(jobs))
        progress.run_start(str(run_dir))
        if writer:
            for v in skipped:
                writer.add_job({"id": rf.job_id(v, 1, cfg.bucket_mb), "kind": "train", "variant": v,
                                "world_size": 1, "status": "skipped",
                                "skip_reason": "single-process variant: run it without torchrun"})
            for spec in jobs:
                writer.add_job({"id": spec.job_id, "kind": "train", "variant": spec.variant,
                                "world_size": spec.world_size, "processes": spec.processes,
                                "bucket_mb": spec.bucket_mb, "status": "pending",
                                "oversubscribed": world.oversubscribed(spec)})
        for spec in jobs:
            if writer:
                writer.add_job({"id": spec.job_id, "status": "running"})
            progress.job_start(spec.job_id, steps_total)
            try:
                results = world.run(spec, cfg, progress)
                fields = record_job(writer, spec, results) if writer and results else {"status": "complete"}
            except JobFailed as exc:
                failed += 1
                fields = {"status": "failed", "error": exc.message.strip(), "failed_rank": exc.rank}
            if writer:
                writer.add_job({"id": spec.job_id, **fields})
            first_line = (fields.get("error") or fields.get("skip_reason") or "").splitlines()
            progress.job_end(spec.job_id, fields["status"], first_line[0][:200] if first_line else "")
        status = "failed" if failed else "complete"
    except KeyboardInterrupt:  # torchrun forwards Ctrl-C/SIGTERM to every rank
        status = "interrupted"
    finally:
        if writer:
            writer.close(status)  # whatever ended the loop, no job stays "running"
        if progress is not None:
            progress.run_end(str(run_dir), status)
    world.finish(status)
    return rf.EXIT_CODES[status], (run_dir if writer else None)
