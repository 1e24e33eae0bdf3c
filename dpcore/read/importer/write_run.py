"""`python -m dpcore import TRACES`: a folder of torch.profiler traces -> a run directory.

Why: most people already have traces (``tensorboard_trace_handler``, torchtitan's profiler,
their own ``export_chrome_trace``) and want dpcore's views on them without re-running anything.
The importer reads them with the read wing's trace reader (:mod:`dpcore.read.traces.reader`,
the same rules ``analyze`` and ``stragglers`` use), turns them into the run format's tables
(:mod:`dpcore.read.importer.rows`: only what the traces say; the rest left empty) and writes
them with the contract's atomic writes. The run appears whole or not at all: it is assembled in
a hidden folder (``.importing-*``, which run listings skip) and renamed into place. What the
command prints about it is :mod:`dpcore.read.report.importer`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dpcore.contract import runformat as rf
from dpcore.contract.errors import UsageError
from dpcore.contract.files import atomic_write_text, csv_text, new_run_id, now_iso
from dpcore.contract.tracefile import TraceFormatError
from dpcore.read.importer.rows import VARIANT, clock_offsets_ns, collective_rows, step_rows
from dpcore.read.traces.reader import concat_events, iteration_dirs, read_trace_meta, trace_files, trace_notes

ALIGN = ("auto", "always", "never")
#: steps.csv / collectives.csv columns a torch.profiler trace never carries.
NEVER_IN_TRACES = ["sync_ms", "samples", "bucket"]
#: ... and those only newer traces carry (the collectives' metadata: torch >= 2.1).
BYTES_COLUMNS = ["comm_bytes", "bytes"]


@dataclass(frozen=True)
class Imported:
    """What one import wrote: the run folder, its job and what the traces did not say."""

    run_dir: Path
    job_id: str
    ranks: list[int]
    steps: int
    collectives: int
    missing: list[str]
    alignment: str
    notes: tuple[str, ...] = ()


def _read(files: list[Path]) -> tuple[list[dict], pd.DataFrame, dict[int, Path]]:
    metas, frames, by_rank = [], [], {}
    for f in files:
        meta, ev = read_trace_meta(f, only=len(files) == 1)
        rank = int(ev["rank"].iloc[0]) if len(ev) else -1
        if rank in by_rank:
            raise TraceFormatError(f"two traces for rank {rank}: {by_rank[rank]} and {f} (several jobs or "
                                   "profiling cycles in one folder? point at one of them)")
        by_rank[rank] = f
        metas.append(meta)
        frames.append(ev)
    return metas, concat_events(frames), by_rank


def _environment(metas: list[dict], events: pd.DataFrame) -> dict:
    """What the traces say about where they ran; keys they do not have are left out."""
    info = next((m["distributedInfo"] for m in metas if isinstance(m.get("distributedInfo"), dict)), {})
    props = next((m["deviceProperties"] for m in metas if isinstance(m.get("deviceProperties"), list)), [])
    hosts = sorted({str(m["host_name"]) for m in metas if m.get("host_name")})
    gpu = bool((events["stream"] >= 0).any()) or bool(props)
    env: dict = {"backend": info.get("backend") or ("nccl" if gpu else "gloo"), "device": "cuda" if gpu else "cpu",
                 "source": "torch.profiler traces (imported)"}
    if hosts:
        env["host"] = ",".join(hosts)
        env["hosts"] = hosts
    names = [str(p.get("name")) for p in props if isinstance(p, dict) and p.get("name")]
    if names:
        env["devices"], env["gpus"] = names, len(names)
    if isinstance(info.get("world_size"), int):
        env["trace_world_size"] = info["world_size"]
    return env


def _offsets(events: pd.DataFrame, hosts: list[str], align: str) -> tuple[dict[int, int], str]:
    ranks = sorted(int(r) for r in events["rank"].unique())
    if align == "never" or (align == "auto" and len(hosts) <= 1):
        why = "never asked" if align == "never" else "one host: its clock is shared by every rank"
        return {r: 0 for r in ranks}, f"trace clocks used as they are ({why})"
    offsets, n = clock_offsets_ns(events)
    if n == 0:
        return offsets, "no collective matched across ranks: trace clocks used as they are"
    return offsets, f"aligned to rank 0 by the median end of {n} matched collectives"


def _missing(steps: list[dict], colls: list[dict]) -> list[str]:
    """Columns the traces could not fill (shown as missing in the views, never guessed)."""
    out = [c for c in ("fwd_ms", "bwd_ms", "opt_ms") if not steps or all(r[c] == "" for r in steps)]
    if not steps:
        out.insert(0, "steps (no events)")
    if not colls:
        out.append("collectives (no NCCL kernels or gloo spans)")
    unknown = BYTES_COLUMNS if not colls or any(c["bytes"] == "" for c in colls) else []
    return out + NEVER_IN_TRACES + unknown


def _staging(out: Path, name: str | None) -> tuple[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    while True:  # two imports in the same second get different ids
        run_id = new_run_id(name or "import")
        if not (out / run_id).exists():
            tmp = out / f".importing-{run_id}"
            tmp.mkdir()
            return run_id, tmp


def import_traces(src: str | Path, out: str | Path = "profiles", name: str | None = None, *,
                  iteration: int | None = None, align: str = "auto", command: list[str] | None = None) -> Imported:
    """Import the traces at ``src`` (a folder searched recursively, or one file) as a new run
    under ``out``; returns what was written. UsageError (one line) for bad input."""
    if align not in ALIGN:
        raise UsageError(f"bad clock alignment {align!r}; valid: {', '.join(ALIGN)}")
    src = Path(src)
    if not src.exists():
        raise UsageError(f"no such file or directory: {src}")
    try:
        files = trace_files(src, iteration)
        metas, events, by_rank = _read(files)
    except TraceFormatError as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    run_id, tmp = _staging(Path(out), name)
    try:
        job = f"{VARIANT}-ws{len(by_rank)}"
        names, tdir = {}, rf.trace_dir(tmp, job)
        tdir.mkdir(parents=True)
        for r, f in by_rank.items():  # the originals, byte for byte, under the run format's names
            shutil.copyfile(f, tdir / f"rank{r}{'.json.gz' if f.name.endswith('.gz') else '.json'}")
            names[str(r)] = str(f.relative_to(src) if src.is_dir() else f.name)
        iters = iteration_dirs(src) if src.is_dir() else {}
        config = {"source": str(src.resolve()),
                  "iteration": iteration if iteration is not None else max(iters) if iters else None}
        result = _write_tables(tmp, run_id, name, "import", metas, events, by_rank, align, config,
                               command or [], {"trace_sources": names})
        os.rename(tmp, Path(out) / run_id)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dataclasses.replace(result, run_dir=Path(out) / run_id)


def index_run(run_dir: str | Path, *, name: str | None = None, kind: str = "trace_handler",
              config: dict | None = None, command: list[str] | None = None) -> Imported:
    """Write steps.csv, collectives.csv and run.json of a run whose per-rank traces already lie
    in it (``traces/<job>/rank<r>.json[.gz]``, one job), by the same rules as ``import``.

    Why: ``dpcore.trace_handler`` writes each rank's trace straight into its run as the
    profiler hands it over; rank 0 then calls this after every cycle, so the run on disk always
    holds every cycle written so far. Each file is replaced atomically (a reader sees the
    previous cycle's tables or this one's, never half of one)."""
    run_dir = Path(run_dir)
    jobs = [d for d in sorted((run_dir / rf.TRACES_DIR).iterdir()) if d.is_dir()] \
        if (run_dir / rf.TRACES_DIR).is_dir() else []
    if len(jobs) != 1:
        raise UsageError(f"{run_dir}: expected the traces of one job under {rf.TRACES_DIR}/, found {len(jobs)}")
    try:
        metas, events, by_rank = _read(trace_files(jobs[0]))
    except TraceFormatError as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    return _write_tables(run_dir, run_dir.name, name, kind, metas, events, by_rank, "auto",
                         config or {}, command or [], {}, job=jobs[0].name)


def _write_tables(run_dir: Path, run_id: str, name: str | None, kind: str, metas: list[dict],
                  events: pd.DataFrame, by_rank: dict[int, Path], align: str, config: dict,
                  command: list[str], job_extra: dict, job: str | None = None) -> Imported:
    """The tables and run.json of one imported job, from its events (import and trace_handler)."""
    notes = trace_notes(events)
    ranks = sorted(by_rank)
    ws = len(ranks)
    job = job or f"{VARIANT}-ws{ws}"
    env = _environment(metas, events)
    offsets, how = _offsets(events, env.get("hosts", []), align)
    colls = collective_rows(events, job, env["backend"], offsets)
    steps = step_rows(events, colls, job, ws, offsets)
    missing = _missing(steps, colls)
    tables = {"steps": steps, "collectives": colls}
    for table, cols in rf.TABLES.items():
        atomic_write_text(run_dir / rf.table_file(table), csv_text(tables.get(table, []), cols))
    created = now_iso()
    meta = {
        "run_id": run_id, "name": name or "", "kind": kind, "created": created, "finished": created,
        "status": "complete", "command": command, "environment": env,
        "config": {**config, "steps": len({r["step"] for r in steps}), "model": config.get("model")},
        "jobs": [{"id": job, "kind": "train", "variant": VARIANT, "algo": None, "world_size": ws,
                  "bucket_mb": None, "status": "complete", "error": None, "ranks": ranks,
                  "clock_offsets_ns": {str(r): int(o) for r, o in offsets.items()},
                  "clock_shift_us": {str(r): -o / 1e3 for r, o in offsets.items()},
                  "clock_alignment": how, **job_extra, "missing": missing, "notes": notes}],
    }
    atomic_write_text(run_dir / rf.RUN_JSON, json.dumps(meta, indent=1, default=str))
    return Imported(run_dir, job, ranks, len(steps), len(colls), missing, how, tuple(notes))

