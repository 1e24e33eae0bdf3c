"""``python -m dpcore profile``: plan the jobs, run each under the launcher, write the run.

A failing job never sinks the run: its error is recorded in run.json and the next job runs.
Ctrl-C marks the run ``interrupted`` and keeps every finished job (all files were written
atomically as each job ended).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .chrome import merge_job_traces
from .config import BUCKET_SENSITIVE, SINGLE_PROCESS, TrainConfig
from .errors import JobFailed, UsageError
from .launch import in_torchrun, launch, resolve_backend
from .profile_worker import JobSpec, profile_job
from .progress import Progress
from .rundir import EXIT_CODES, RunWriter, environment



@dataclass(frozen=True)
class ProfileOptions:
    variants: tuple[str, ...]
    world_sizes: tuple[int, ...]
    bucket_sweep: tuple[float, ...] = ()
    trace: bool = True
    out: str = "profiles"
    name: str | None = None
    backend: str = "auto"
    timeout_s: float = 300.0
    progress: str = "bar"
    run_id: str | None = None


def job_id(variant: str, world_size: int, bucket_mb: float) -> str:
    """``bucketed-ws2-b25``; the bucket part only where the bucket size matters."""
    base = f"{variant}-ws{world_size}"
    return f"{base}-b{bucket_mb:g}" if variant in BUCKET_SENSITIVE else base


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
            jid = job_id(variant, ws, b)
            tdir = str(run_dir / "traces" / jid) if (opts.trace and run_dir) else None
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
    if cfg.bucket_mb <= 0 or any(b <= 0 for b in opts.bucket_sweep):
        raise UsageError("bucket sizes must be > 0 MB")
    for ws in opts.world_sizes:
        cfg.local_batch(ws)  # raises the divisibility error for strong scaling
    multi = [v for v in opts.variants if v not in SINGLE_PROCESS]
    top = max(opts.world_sizes) if multi else 1
    return resolve_backend(opts.backend, top)


def _attach_comm(steps: list[dict], collectives: list[dict]) -> None:
    """Fill steps.csv's comm_ms / comm_ops / comm_bytes with the analysis' own definition (the
    union of the rank's collective intervals clipped to the step), so the CSV column and the
    dashboard can never disagree."""
    import pandas as pd

    from .analysis.overlap import step_breakdown

    if not steps:
        return
    sdf, cdf = pd.DataFrame(steps), pd.DataFrame(collectives)
    bd = pd.concat([step_breakdown(sdf, cdf, profiled=flag) for flag in (False, True)])
    comm = {(r.job_id, int(r.rank), int(r.step)): (r.comm_ms, r.comm_ops, r.comm_bytes)
            for r in bd.itertuples()}
    for row in steps:
        ms, ops, nbytes = comm.get((row["job_id"], int(row["rank"]), int(row["step"])), (0.0, 0, 0))
        row.update(comm_ms=round(float(ms), 6), comm_ops=int(ops or 0), comm_bytes=int(nbytes or 0))


def _record_job(writer: RunWriter, spec: JobSpec, results: list[Any]) -> dict:
    """Write one finished job's rows and merged trace; return its run.json fields."""
    first = results[0]
    if first.get("skip_reason"):
        return {"status": "skipped", "skip_reason": first["skip_reason"]}
    steps = [row for r in results for row in r["steps"]]
    _attach_comm(steps, [row for r in results for row in r["collectives"]])
    writer.append_rows("steps", steps)
    for table in ("collectives", "messages"):
        writer.append_rows(table, [row for r in results for row in r[table]])
    extra: dict[str, Any] = {
        "clock_offsets_ns": {str(i): r["offset_ns"] for i, r in enumerate(results)},
        "clock_rtt_ns": {str(i): r["rtt_ns"] for i, r in enumerate(results)},
        # (t_a, t_b) shared-clock brackets of each rank's dpcore_clock_sync#k markers
        "clock_sync_ns": {str(i): r["sync"] for i, r in enumerate(results) if r.get("trace")},
        "threads_per_rank": first.get("threads"),
    }
    errors = [r["trace_error"] for r in results if r.get("trace_error")]
    if errors:
        extra["trace_error"] = errors[0]
    traces = {i: Path(r["trace"]) for i, r in enumerate(results) if r.get("trace")}
    if traces and all(p.exists() for p in traces.values()):
        merged = Path(spec.trace_dir) / "merged.json.gz"
        msgs = [m for r in results for m in r["messages"]]
        extra["merged_trace"] = merge_job_traces(traces, {i: results[i]["sync"] for i in traces},
                                                 msgs, merged)
        extra["traces"] = sorted(p.name for p in Path(spec.trace_dir).glob("*.json.gz"))
    return {"status": "complete", **extra}


def run_profile(opts: ProfileOptions, cfg: TrainConfig, argv: list[str]) -> int:
    """Run every job; return the exit status (0 complete, 1 some job failed, 130 Ctrl-C)."""
    from .launch import physical_cores

    backend = validate(opts, cfg)
    if in_torchrun():
        from .torchrun_profile import run_profile_torchrun
        return run_profile_torchrun(opts, cfg, argv, backend)
    env = environment(backend, list(opts.world_sizes))
    config = {**cfg.to_dict(), "variants": list(opts.variants),
              "world_sizes": list(opts.world_sizes), "bucket_sweep": list(opts.bucket_sweep),
              "trace": opts.trace}
    writer = RunWriter(opts.out, opts.name, command=argv, config=config, environment=env,
                       run_id=opts.run_id)
    jobs = plan_jobs(opts, cfg, writer.run_dir)
    steps_total = cfg.warmup + cfg.steps + (cfg.profile_steps + 1 if opts.trace else 0)
    progress = Progress(opts.progress, len(jobs))
    progress.run_start(str(writer.run_dir))
    for spec in jobs:
        writer.add_job({"id": spec.job_id, "kind": "train", "variant": spec.variant,
                        "world_size": spec.world_size, "processes": spec.processes,
                        "bucket_mb": spec.bucket_mb, "status": "pending",
                        "oversubscribed": spec.processes > physical_cores()})
    failed = 0
    status = "failed"  # until the loop has really finished
    try:
        for spec in jobs:
            writer.add_job({"id": spec.job_id, "status": "running"})
            progress.job_start(spec.job_id, steps_total)
            try:
                results = launch(profile_job, spec.processes, backend=backend,
                                 args=(spec, cfg), timeout_s=opts.timeout_s,
                                 on_progress=progress.step)
                fields = _record_job(writer, spec, results)
            except JobFailed as exc:
                failed += 1
                fields = {"status": "failed", "error": exc.message.strip(), "failed_rank": exc.rank}
            writer.add_job({"id": spec.job_id, **fields})
            first_line = (fields.get("error") or fields.get("skip_reason") or "").splitlines()
            progress.job_end(spec.job_id, fields["status"], first_line[0] if first_line else "")
        status = "failed" if failed else "complete"
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        writer.close(status)  # whatever ended the loop, no job stays "running"
        progress.run_end(str(writer.run_dir), status)
    if opts.progress != "json":
        print(summary_table(writer.run_dir))
        print(f"\nrun {status}: {writer.run_dir}" + (f" ({failed} job(s) failed; see run.json)"
                                                    if failed else ""), file=sys.stderr)
    return EXIT_CODES[status]


def summary_table(run_dir: Path) -> str:
    """The end-of-run table (same numbers as the dashboard: both call dpcore.analysis)."""
    from .analysis import job_summary, load_run

    run = load_run(run_dir)
    summary = job_summary(run)
    lines = []
    if "status" in summary.columns:
        summary = summary[summary["status"] == "complete"]
    if summary.empty:
        lines.append("(no completed training jobs)")
    else:
        cols = {"job_id": "job", "step_ms": "step ms (median)", "comm_fraction": "comm fraction",
                "overlap_pct": "overlap %", "throughput": "samples/s"}
        table = summary[[c for c in cols if c in summary.columns]].rename(columns=cols)
        lines.append(table.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
    for job in run.meta.get("jobs", []):
        if job.get("status") in ("failed", "skipped", "interrupted"):
            why = (job.get("error") or job.get("skip_reason") or "").strip().splitlines()
            lines.append(f"{job['id']}: {job['status']}" + (f" - {why[0]}" if why else ""))
    return "\n".join(lines)
