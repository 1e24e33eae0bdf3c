"""One run's life cycle, shared by every command that writes a run (``profile``, ``allreduce``,
``dpcore.record``): open the run folder, mark each job pending, running, then complete, failed
or skipped, survive a failing job, end ``interrupted`` on Ctrl-C/SIGTERM, close.

Why once, here: the rules are the run format's promises (docs/DESIGN.md), and three copies drifted
(``allreduce`` could not run under torchrun because its copy had no world). The rules:

- The writing rank makes the folder; every rank learns its path, or the reason it could not be
  made (a bad ``--out``, an existing ``--run-id``), so no rank waits for a run that never began.
- A job that fails (:class:`JobFailed`) is recorded with its error and failing rank, and the
  next job runs; the run ends ``failed``.
- Ctrl-C or SIGTERM (as KeyboardInterrupt) ends the run ``interrupted``; every finished job's
  rows were written atomically when it ended, so nothing measured is lost.
- Whatever ends the run, no job stays ``running`` or ``pending`` (:meth:`RunWriter.close`);
  a second Ctrl-C while the run is being closed waits until run.json says how it ended.

Also here, because ``profile`` and ``dpcore.record`` write a training job the same way: the job
(:class:`JobSpec`), its run.json entry, its steps.csv row (:func:`steps_row`, the one builder)
and :func:`write_job`, which turns every rank's rows into the job's tables and merged trace.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from dpcore.contract import runformat
from dpcore.contract.calibration import fit as cal_fit
from dpcore.contract.errors import JobFailed, UsageError
from dpcore.contract.intervals import comm_start, step_comm, union_length
from dpcore.write.capture.merged_trace import merge_job_traces
from dpcore.write.capture.run_writer import RunWriter
from dpcore.write.runtime.launch import signals_deferred
from dpcore.write.runtime.progress import Progress

#: steps.csv's phase columns, as :meth:`PhaseTimer.finish` returns them.
PHASE_COLUMNS = ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms")


@dataclass(frozen=True)
class JobSpec:
    """One training job of a run: a cell of ``profile``'s sweep, or a recorded loop.
    ``world_size`` is the logical data-parallel degree (replicas); ``processes`` is how many
    ranks run it (1 for single-process variants). ``bucket_mb`` is None where the job has no
    bucket size (a user's loop without one)."""

    job_id: str
    variant: str
    world_size: int
    processes: int
    bucket_mb: float | None
    trace_dir: str | None  # None == no trace
    comm_hook: str = "none"  # torch_ddp: DDP's comm hook (contract.config.COMM_HOOKS)


def train_job_entry(spec: JobSpec, status: str, oversubscribed: bool) -> dict[str, Any]:
    """A training job's run.json entry as it is first written (``pending`` or ``running``)."""
    return {"id": spec.job_id, "kind": "train", "variant": spec.variant,
            "world_size": spec.world_size, "processes": spec.processes,
            "bucket_mb": spec.bucket_mb, "status": status, "oversubscribed": oversubscribed,
            **({"comm_hook": spec.comm_hook} if spec.comm_hook != "none" else {})}


def steps_row(spec: JobSpec, rank: int, step: int, profiled: bool, timing: dict[str, Any],
              samples: int | None) -> dict[str, Any]:
    """One steps.csv row from a step's :meth:`PhaseTimer.finish` (``timing``); the comm
    columns are filled by :func:`attach_comm` when the job is written. None (no bucket size,
    samples unknown) is an empty cell."""
    return {"job_id": spec.job_id, "variant": spec.variant, "world_size": spec.world_size,
            "bucket_mb": spec.bucket_mb, "rank": rank, "step": step, "profiled": profiled,
            "t_start_ns": timing["t_start_ns"], "step_ms": round(timing["step_ms"], 6),
            **{k: round(timing[k], 6) for k in PHASE_COLUMNS}, "samples": samples}


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
                           [runformat.parse_ns(c["t_start_ns"]) or -1 for c in mine])
        clipped = step_comm(start, [c["t_end_ns"] for c in mine], row["t_start_ns"], row["step_ms"],
                            row.get("world_size"))
        row.update(comm_ms=round(union_length(*clipped) / 1e6, 6), comm_ops=len(mine),
                   comm_bytes=sum(int(c["bytes"]) for c in mine))


def _finite(v: Any) -> Any:
    """NaN -> None, in nested dicts/lists (run.json is strict JSON)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def calibration_entry(per_rank: list[dict]) -> dict:
    """The job's run.json ``whatif_calibration``: every rank's calibration steps merged per plan,
    the fit (:func:`dpcore.contract.calibration.fit`), the cost and the steps it came from."""
    errors = [r["error"] for r in per_rank if r.get("error")]
    if errors:  # the job's measured rows stand; the calibration says why it is missing
        return {"error": errors[0]}
    plans = [{"bucket_mb": p["bucket_mb"], "steps": [s for r in per_rank for s in r["plans"][k]["steps"]]}
             for k, p in enumerate(per_rank[0]["plans"])]
    return _finite({**cal_fit(plans), "cost_ms": round(max(r["cost_ms"] for r in per_rank), 1),
                    "steps_per_plan": len(plans[0]["steps"]) // max(len(per_rank), 1), "data": plans})


def write_job(writer: RunWriter, spec: JobSpec, results: list[Any]) -> dict:
    """Write one finished training job's rows (every rank's result, by rank) and merged trace;
    return its run.json fields."""
    first = results[0]
    if first.get("skip_reason"):
        return {"status": "skipped", "skip_reason": first["skip_reason"]}
    steps = [row for r in results for row in r["steps"]]
    attach_comm(steps, [row for r in results for row in r["collectives"]])
    writer.append_rows("steps", steps)
    for table in runformat.JOB_TABLES:
        writer.append_rows(table, [row for r in results for row in r.get(table, [])])
    extra: dict[str, Any] = {
        "clock_offsets_ns": {str(i): r["offset_ns"] for i, r in enumerate(results)},
        "clock_rtt_ns": {str(i): r["rtt_ns"] for i, r in enumerate(results)},
        # (t_a, t_b) shared-clock brackets of each rank's dpcore_clock_sync#k markers
        "clock_sync_ns": {str(i): r["sync"] for i, r in enumerate(results) if r.get("trace")},
        "threads_per_rank": first.get("threads"),
        "cpus_per_rank": {str(i): r.get("cpus", []) for i, r in enumerate(results)},
    }
    extra.update(hook_entry(results))
    notes = list(dict.fromkeys(n for r in results for n in r.get("notes", [])))
    if notes:  # shown by summarize and at the run's end beside the job's numbers
        extra["notes"] = notes
    cals = [r["calibration"] for r in results if r.get("calibration")]
    if cals:
        extra["whatif_calibration"] = calibration_entry(cals)
    errors = trace_errors(results)
    if errors:
        extra["trace_error"] = errors[0]
    traces = {i: Path(r["trace"]) for i, r in enumerate(results) if r.get("trace")}
    if traces and all(p.exists() for p in traces.values()):
        tdir = Path(spec.trace_dir or "")
        msgs = [m for r in results for m in r["messages"]]
        extra["merged_trace"] = merge_job_traces(traces, {i: results[i]["sync"] for i in traces},
                                                 msgs, tdir / runformat.MERGED_TRACE)
        extra["traces"] = sorted(p.name for p in tdir.iterdir() if runformat.trace_key(p.name))
    if errors:  # the rows are kept, but a job whose traces are not all there did not complete
        return {"status": "failed", "error": "; ".join(errors), **extra}
    return {"status": "complete", **extra}


def hook_entry(results: list[Any]) -> dict[str, Any]:
    """run.json's ``loss`` / ``loss_after_steps`` (mean over ranks of the loss at the last timed
    step; the ranks hold the same parameters, so this is the global batch's loss) and, for a
    ``torch_ddp`` job with 2+ ranks, ``hook_compress_ms`` / ``hook_decompress_ms``: its comm
    hook's own compute per step, median over (rank, timed step), apart from its collectives
    (0.0 for the plain job). Why in run.json: one number per job, read beside its bytes."""
    out: dict[str, Any] = {}
    losses = [r["loss"] for r in results if r.get("loss")]
    if losses and len(losses) == len(results):
        out["loss"] = sum(v["value"] for v in losses) / len(losses)  # unrounded: fp16 moves it by ~1e-7
        out["loss_after_steps"] = losses[0]["after_steps"]
    per = [row for r in results for row in (r.get("hook_ms") or [])]
    if per:
        for i, key in ((1, "hook_compress_ms"), (2, "hook_decompress_ms")):
            vals = sorted(row[i] for row in per)
            mid = len(vals) // 2
            out[key] = round(vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2, 6)
    return out


def trace_errors(results: list[Any]) -> list[str]:
    """One line per rank whose trace failed to write (its export error), or that profiled steps
    and wrote none: a job missing a rank's trace must not end ``complete`` (a reader would
    otherwise average the ranks that are there)."""
    out = []
    for i, r in enumerate(results):
        if r.get("trace_error"):
            out.append(str(r["trace_error"]))
        elif not r.get("trace") and any(row.get("profiled") for row in r.get("steps", [])):
            out.append(f"rank {i} profiled steps but wrote no trace")
    return out


class World(Protocol):
    """What the life cycle needs of a world (:mod:`dpcore.write.runtime.world`)."""

    writes: bool

    def broadcast(self, box: list[Any]) -> None: ...

    def finish(self, status: str) -> None: ...

    def shared_during_job(self) -> dict[int, list[int]]: ...


def open_run(world: World, make_writer: Callable[[], RunWriter]) -> tuple[RunWriter | None, Path]:
    """Make the run folder on the writing rank and tell every rank where it is.

    A failure to make it reaches every rank: the writing rank re-raises it; the others raise a
    :class:`UsageError` with the same line (bad input) or a RuntimeError naming it."""
    box: list[Any] = [None, "", False]  # run folder, error text, error is a UsageError
    writer: RunWriter | None = None
    error: Exception | None = None
    if world.writes:
        try:
            writer = make_writer()
            box[0] = str(writer.run_dir)
        except Exception as exc:  # noqa: BLE001 - every rank must learn it, then raise
            error = exc
            box[1], box[2] = str(exc), isinstance(exc, UsageError)
            if not box[2]:
                box[1] = f"{type(exc).__name__}: {exc}"
    world.broadcast(box)
    if error is not None:
        raise error
    if box[1]:
        raise UsageError(box[1]) if box[2] else RuntimeError(
            f"rank 0 could not create the run: {box[1]}")
    return writer, Path(box[0])


class RunLife:
    """One run from the moment its folder exists to its final status.

    Used as ``with RunLife(world, make_writer) as life:`` by commands that run jobs: inside,
    :meth:`run_job` runs each job; a Ctrl-C/SIGTERM inside the block ends the run
    ``interrupted`` and is absorbed (the caller returns :attr:`status`'s exit code, 130); any
    other exception ends it ``failed`` and propagates. ``dpcore.record``, whose run spans a
    user's block, calls :meth:`outcome`, :meth:`end_job` and :meth:`close` itself. On ranks
    that do not write (torchrun's others) every write is skipped; the rules still apply."""

    def __init__(self, world: World, make_writer: Callable[[], RunWriter]) -> None:
        self.world = world
        self.writer, self.run_dir = open_run(world, make_writer)
        self.progress: Progress | None = None
        self.failed = 0
        self.status = "running"

    def start(self, progress: Progress) -> None:
        """Jobs are planned: progress reporting begins."""
        self.progress = progress
        progress.run_start(str(self.run_dir))

    def add_job(self, entry: dict[str, Any]) -> None:
        """Insert or update (by ``id``) a job's run.json entry."""
        if self.writer is not None:
            self.writer.add_job(entry)

    def run_job(self, job_id: str, steps_total: int, body: Callable[[], dict[str, Any]],
                steps_note: str = "") -> dict:
        """Mark the job running, run ``body`` (which returns the job's run.json fields, e.g.
        from :func:`write_job`; ``status`` defaults to complete), record the outcome. A
        :class:`JobFailed` is recorded as the job's failure and the run goes on."""
        self.add_job({"id": job_id, "status": "running"})
        if self.progress is not None:
            self.progress.job_start(job_id, steps_total, steps_note)
        try:
            fields = {"status": "complete", **body()}
            self.failed += fields["status"] == "failed"  # e.g. a rank's trace failed to write
        except JobFailed as exc:
            self.failed += 1
            fields = {"status": "failed", "error": exc.message.strip(), "failed_rank": exc.rank}
        self._note_shared(fields)
        self.end_job(job_id, fields)
        return fields

    def _note_shared(self, fields: dict[str, Any]) -> None:
        """Another dpcore run pinned to this job's CPUs while it ran (it may have started after
        this run did): the job and the run's environment are oversubscribed."""
        shared = self.world.shared_during_job()
        if not shared:
            return
        fields["oversubscribed"] = True
        if self.writer is not None:
            env = self.writer.meta.setdefault("environment", {})
            env["cpus_shared_with"] = {**env.get("cpus_shared_with", {}),
                                       **{str(pid): cpus for pid, cpus in shared.items()}}
            env["oversubscribed"] = True

    def end_job(self, job_id: str, fields: dict[str, Any]) -> None:
        """Write a finished job's fields (``status`` among them) and report its end."""
        self.add_job({"id": job_id, **fields})
        if self.progress is not None:
            first = (fields.get("error") or fields.get("skip_reason") or "").splitlines()
            self.progress.job_end(job_id, fields["status"], first[0][:200] if first else "")

    def outcome(self, exc_type: type[BaseException] | None) -> str:
        """The run's status when ended by ``exc_type`` (None: ran to its end)."""
        if exc_type is None:
            return "failed" if self.failed else "complete"
        return "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"

    def close(self, status: str, why: str = "") -> None:
        """The final status: no job stays running, progress reports the end; ``why``: what
        ended a failed run early, the error of its jobs that were left (RunWriter.close)."""
        self.status = status
        if self.writer is not None:
            self.writer.close(status, why)
        if self.progress is not None:
            self.progress.run_end(str(self.run_dir), status)

    def __enter__(self) -> RunLife:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        status = self.outcome(exc_type)
        # a second Ctrl-C (people press it twice) lands here more often than anywhere: held
        # until run.json is final, then delivered (the CLI exits 130), never a run left running
        why = f"{exc_type.__name__}: {exc}" if exc_type is not None and exc is not None else ""
        with signals_deferred():
            self.close(status, why)
        if exc_type is not None and status != "interrupted":
            return False  # a bug or a broken disk: the CLI reports it; the run says failed
        self.world.finish(status)
        return True
