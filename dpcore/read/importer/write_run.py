"""`python -m dpcore import TRACES`: a folder of torch.profiler traces -> a run directory.

Why: most people already have traces (``tensorboard_trace_handler``, torchtitan's profiler,
their own ``export_chrome_trace``) and want dpcore's views on them without re-running anything.
The importer reads them with the read wing's trace reader (:mod:`dpcore.read.traces.reader`,
the same rules ``analyze`` and ``stragglers`` use) through the rank cache
(:mod:`dpcore.read.ranks`: each rank reduced once, in a worker, to compact tables, so an import
of a thousand ranks holds one rank's events per worker, and a second import of the same traces
parses nothing), turns those into the run format's tables
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
from dpcore.contract.files import atomic_file, atomic_write_text, csv_text, new_run_id, now_iso
from dpcore.contract.options import CLOCK_ALIGNMENTS
from dpcore.contract.tracefile import TraceFormatError
from dpcore.read.importer.rows import (
    IMPORT_COMM,
    IMPORT_FACTS,
    IMPORT_STEPS,
    IMPORT_TABLES,
    VARIANT,
    clock_offsets_ns,
    collective_rows,
    step_rows,
)
from dpcore.read.ranks import RankTables, Scale
from dpcore.read.tables import rank_tables
from dpcore.read.traces.files import iteration_dirs, trace_files
from dpcore.read.traces.world import check_one_world

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


@dataclass(frozen=True)
class _Trace:
    """What the import keeps of one trace file: its first rank, its ``import_facts`` row (host,
    time span, metadata) and the ranks' compact rows (:func:`dpcore.read.importer.rows.rank_rows`)."""

    path: Path
    rank: int
    facts: dict
    tables: RankTables

    @property
    def meta(self) -> dict:
        """The part of the trace's metadata the import reads (distributedInfo)."""
        info = self.facts["dist_info"]
        return {"distributedInfo": json.loads(info)} if info else {}


def _read(files: list[Path], root: Path, scale: Scale | None) -> tuple[list[_Trace], dict[int, Path]]:
    """Every trace's compact import tables (through the rank cache: one rank per worker, see
    :mod:`dpcore.read.ranks`), and which file is which rank. Refused by name (a
    TraceFormatError), in file order as they are found: a trace without events (an empty or
    metadata-only file, a JSON list of numbers), a rank beyond its world size or
    :data:`~dpcore.read.traces.world.MAX_RANK`, two traces of one rank, and traces that cannot
    be one job (different world sizes, or times that never overlap). ``root``: the folder the cache belongs to."""
    try:
        got = rank_tables(files, root, scale, only=len(files) == 1, need=IMPORT_TABLES)
    except ValueError as exc:  # --scheduler: no Dask installed, or no scheduler at that address
        if scale is None or not scale.scheduler:
            raise
        raise UsageError(str(exc).splitlines()[0]) from None
    traces: list[_Trace] = []
    for f, t in zip(files, got):
        if isinstance(t, TraceFormatError):
            raise t
        if not t.events:
            raise TraceFormatError(f"{f}: no trace events (an empty or metadata-only trace); a "
                                   "torch.profiler trace lists its events in traceEvents")
        traces.append(_Trace(f, t.rank, t[IMPORT_FACTS].iloc[0].to_dict(), t))
    check_one_world([(tr.path, tr.rank, tr.tables.world_size) for tr in traces])
    by_rank = {tr.rank: tr.path for tr in traces}
    _check_one_job(traces, by_rank)
    return traces, by_rank


def _check_one_job(traces: list[_Trace], by_rank: dict[int, Path]) -> None:
    """Ranks of one job run at the same time: two ranks of one host (one clock) whose traces
    never overlap in time come from different runs, and averaging them as one job would make
    up numbers. Across hosts clocks differ, so only ranks of the same host are compared."""
    spans: dict[str, list[tuple[float, float, int]]] = {}
    for t in traces:
        spans.setdefault(t.facts["host"], []).append((float(t.facts["ts_min"]), float(t.facts["end_max"]), t.rank))
    for items in spans.values():
        items.sort()
        reach, owner = items[0][1], items[0][2]
        for start, end, rank in items[1:]:
            if start > reach:
                raise TraceFormatError(f"{by_rank[rank]} starts after {by_rank[owner]} ends: traces of one "
                                       "host that never overlap in time are not one job; import one "
                                       "job's traces at a time")
            if end > reach:
                reach, owner = end, rank


def _environment(traces: list[_Trace]) -> dict:
    """What the traces say about where they ran; keys they do not have are left out. The first
    trace (in file order) with a distributedInfo object, or a deviceProperties list, speaks."""
    info: dict = next((t.meta["distributedInfo"] for t in traces if t.facts["dist_info"]), {})
    props = next((t.facts for t in traces if t.facts["props"] >= 0), None)
    hosts = sorted({t.facts["host"] for t in traces if t.facts["host"]})
    gpu = any(bool(t.facts["gpu"]) for t in traces) or bool(props and props["props"] > 0)
    seen = next((str(t.facts.get("comm_backend") or "") for t in traces if t.facts.get("comm_backend")), "")
    said = info.get("backend") if isinstance(info.get("backend"), str) and info.get("backend") else ""
    # what the traces say, else what their comm events are, else none seen: never a guess from the device
    env: dict = {"backend": said or seen or "none", "device": "cuda" if gpu else "cpu",
                 "backend_from": ("distributedInfo" if said else "comm events" if seen
                                  else "none: no distributedInfo and no comm events"),
                 "source": "torch.profiler traces (imported)"}
    if hosts:
        env["host"] = ",".join(hosts)
        env["hosts"] = hosts
    names = json.loads(props["device_names"]) if props else []
    if names:
        env["devices"], env["gpus"] = names, len(names)
    if isinstance(info.get("world_size"), int):
        env["trace_world_size"] = info["world_size"]
    return env


def gpus_shared(traces: list[_Trace], backend: str) -> bool:
    """Whether two ranks' traces ran on the same GPU of the same host: processes taking turns
    on one GPU, which is no scaling point (run.json's per-job ``gpus_shared``, as ``profile``
    records it). The evidence: two single-rank traces of one host (``host_name``; traces without
    one are one host, as the clock alignment takes them) whose GPU events ran on the same device
    id, on a backend other than NCCL (NCCL refuses two ranks on one GPU; and with one GPU visible
    per process, as CUDA_VISIBLE_DEVICES gives, every rank's GPU is device 0, so the id alone
    proves nothing there). A merged trace of several ranks cannot tell."""
    if backend == "nccl":
        return False
    used: set[tuple[str, int]] = set()
    for t in traces:
        dev = int(t.facts.get("gpu_device", -1))
        if dev < 0 or len(json.loads(t.facts["ranks"])) != 1:
            continue
        key = (str(t.facts["host"]), dev)
        if key in used:
            return True
        used.add(key)
    return False


def trace_precision(traces: list[_Trace]) -> str:
    """The precision most of the traces' ranks computed in (rows.trace_dtype per trace), "" unknown."""
    got = [str(t.facts.get("dtype") or "") for t in traces]
    got = [d for d in got if d]
    return max(sorted(set(got)), key=got.count) if got else ""


def job_world_size(env: dict, ranks: list[int]) -> int:
    """The imported job's world size: the traces' own ``distributedInfo.world_size``
    (``env["trace_world_size"]``) where they say one, else the ranks imported. Why the trace's:
    one rank of an 8-GPU job is a rank of a world of 8; as world size 1 its collectives would
    read as having no peer and every world-size comparison would place it at 1. Never fewer than
    the ranks present (``check_one_world`` refuses a rank outside its world)."""
    said = env.get("trace_world_size")
    return max(len(ranks), said if isinstance(said, int) and not isinstance(said, bool) and said > 0 else 0)


def _job_world(traces: list[_Trace]) -> tuple[dict, int]:
    """(run.json's environment, the job's world size) of the traces (:func:`_environment`,
    :func:`job_world_size`)."""
    env = _environment(traces)
    return env, job_world_size(env, _ranks(traces))


def _ranks(traces: list[_Trace]) -> list[int]:
    """Every rank the traces hold (a merged trace holds several)."""
    return sorted({int(r) for t in traces for r in json.loads(t.facts["ranks"])})


def _offsets(comm: pd.DataFrame, ranks: list[int], hosts: list[str], align: str) -> tuple[dict[int, int], str]:
    if align == "never" or (align == "auto" and len(hosts) <= 1):
        why = "never asked" if align == "never" else "one host: its clock is shared by every rank"
        return {r: 0 for r in ranks}, f"trace clocks used as they are ({why})"
    offsets, n = clock_offsets_ns(comm, ranks)
    if n == 0:
        return offsets, "no collective matched across ranks: trace clocks used as they are"
    return offsets, f"aligned to rank 0 by the median end of {n} matched collectives"


class _Seen:
    """What the rows written so far say, for run.json and :meth:`missing` (the rows themselves
    are written rank by rank and not kept)."""

    def __init__(self) -> None:
        self.steps = self.colls = 0
        self.step_ids: set[int] = set()
        self.unknown_bytes = False
        self.phases_seen: set[str] = set()  # the phases some step has a value for

    def add_steps(self, steps: list[dict]) -> None:
        self.steps += len(steps)
        self.step_ids |= {r["step"] for r in steps}
        self.phases_seen |= {c for c in ("fwd_ms", "bwd_ms", "opt_ms") if any(r[c] != "" for r in steps)}

    def missing(self) -> list[str]:
        """Columns the traces could not fill (shown as missing in the views, never guessed)."""
        out = [c for c in ("fwd_ms", "bwd_ms", "opt_ms") if c not in self.phases_seen]
        if not self.steps:
            out.insert(0, "steps (no events)")
        if not self.colls:
            out.append("collectives (no NCCL kernels or gloo spans)")
        unknown = BYTES_COLUMNS if not self.colls or self.unknown_bytes else []
        return out + NEVER_IN_TRACES + unknown


def _staging(out: Path, name: str | None) -> tuple[str, Path]:
    """A hidden folder under ``out`` to assemble the run in. An ``out`` that cannot hold it is
    bad input (one line, exit 2, as ``profile --out`` says it), found before anything is read."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"--out {out}: not a folder (a file is in the way); choose a writable "
                         "folder") from None
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create it ({exc.strerror}); choose a writable "
                         "folder") from None
    while True:  # two imports in the same second get different ids
        run_id = new_run_id(name or "import")
        if not (out / run_id).exists():
            tmp = out / f".importing-{run_id}"
            tmp.mkdir()
            return run_id, tmp


def import_traces(src: str | Path, out: str | Path = "profiles", name: str | None = None, *,
                  iteration: int | None = None, align: str = "auto", command: list[str] | None = None,
                  within: Path | None = None, scale: Scale | None = None) -> Imported:
    """Import the traces at ``src`` (a folder searched recursively, or one file) as a new run
    under ``out``; returns what was written. UsageError (one line) for bad input. ``within``:
    every trace file read must really lie under this folder (symbolic links resolved), as the
    dashboard requires of what it imports for a browser. ``scale``: how the ranks are read
    (workers, a Dask scheduler, the cache beside the traces: :class:`~dpcore.read.ranks.Scale`)."""
    if align not in CLOCK_ALIGNMENTS:
        raise UsageError(f"bad clock alignment {align!r}; valid: {', '.join(CLOCK_ALIGNMENTS)}")
    if not str(out).strip():  # Path("") is the current folder: never write there unasked
        raise UsageError("--out is empty; give the folder the run is written into, e.g. profiles")
    if not str(src).strip():  # nor read it unasked (an unset shell variable)
        raise UsageError("the path is empty; give a folder of torch.profiler traces or one trace file")
    src = Path(src)
    if not src.exists():
        raise UsageError(f"no such file or directory: {src}")
    try:
        files = trace_files(src, iteration)
        if within is not None:
            outside = [f for f in files if not f.resolve().is_relative_to(within.resolve())]
            if outside:
                raise UsageError(f"{outside[0]} leads outside {within.resolve()} (a symbolic link?); "
                                 "only traces under it can be imported here")
        traces, by_rank = _read(files, src if src.is_dir() else src.parent, scale)
    except TraceFormatError as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    run_id, tmp = _staging(Path(out), name)
    try:
        env, ws = _job_world(traces)  # once: the job's name and its run.json say the same
        job = f"{VARIANT}-ws{ws}"
        names, tdir = {}, rf.trace_dir(tmp, job)
        tdir.mkdir(parents=True)
        for r, f in by_rank.items():  # the originals, byte for byte, under the run format's names
            shutil.copyfile(f, tdir / f"rank{r}{'.json.gz' if f.name.endswith('.gz') else '.json'}")
            names[str(r)] = str(f.relative_to(src) if src.is_dir() else f.name)
        iters = iteration_dirs(src) if src.is_dir() else {}
        config = {"source": str(src.resolve()),
                  "iteration": iteration if iteration is not None else max(iters) if iters else None}
        result = _write_tables(tmp, run_id, name, "import", traces, by_rank, align, config,
                               command or [], {"trace_sources": names}, job=job, world=(env, ws))
        os.rename(tmp, Path(out) / run_id)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dataclasses.replace(result, run_dir=Path(out) / run_id)


def index_run(run_dir: str | Path, *, name: str | None = None, kind: str = "trace_handler",
              config: dict | None = None, command: list[str] | None = None,
              scale: Scale | None = None) -> Imported:
    """Write steps.csv, collectives.csv and run.json of a run whose per-rank traces already lie
    in it (``traces/<job>/rank<r>.json[.gz]``, one job), by the same rules as ``import``.

    Why: ``dpcore.trace_handler`` writes each rank's trace straight into its run as the
    profiler hands it over; rank 0 then calls this after every cycle, so the run on disk always
    holds every cycle written so far. Each file is replaced atomically (a reader sees the
    previous cycle's tables or this one's, never half of one). The ranks are read through the
    run's rank cache (``scale``), so a later ``analyze`` of the run reads them from there."""
    run_dir = Path(run_dir)
    jobs = [d for d in sorted((run_dir / rf.TRACES_DIR).iterdir()) if d.is_dir()] \
        if (run_dir / rf.TRACES_DIR).is_dir() else []
    if len(jobs) != 1:
        raise UsageError(f"{run_dir}: expected the traces of one job under {rf.TRACES_DIR}/, found {len(jobs)}")
    try:
        traces, by_rank = _read(trace_files(jobs[0]), run_dir, scale)
    except TraceFormatError as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    return _write_tables(run_dir, run_dir.name, name, kind, traces, by_rank, "auto",
                         config or {}, command or [], {}, job=jobs[0].name)


def _write_tables(run_dir: Path, run_id: str, name: str | None, kind: str, traces: list[_Trace],
                  by_rank: dict[int, Path], align: str, config: dict,
                  command: list[str], job_extra: dict, job: str | None = None,
                  world: tuple[dict, int] | None = None) -> Imported:
    """The tables and run.json of one imported job, from its traces' compact tables (import and
    trace_handler): only these, all ranks' rows at once, are ever concatenated. ``world``:
    :func:`_job_world` of the traces where the caller has it already."""
    notes = [n for t in traces for n in t.tables.notes]
    ranks = sorted(by_rank)
    env, ws = world or _job_world(traces)
    if ws > len(_ranks(traces)):
        here = len(_ranks(traces))
        notes.append(f"{here} of the job's {ws} ranks {'is' if here == 1 else 'are'} here (the traces' "
                     f"distributedInfo.world_size is {ws}): the job ran at world size {ws}, and its numbers "
                     "are those of the ranks imported")
    notes += [f"{t.path.name}: no metadata in the trace (a JSON array of events, the legacy autograd profiler's "
              "export): no rank, world size, devices or backend of its own; its steps are its ProfilerStep ranges "
              "(or its whole span)" for t in traces if bool(t.facts.get("bare"))]
    job = job or f"{VARIANT}-ws{ws}"
    comm = pd.concat([t.tables[IMPORT_COMM] for t in traces], ignore_index=True)
    offsets, how = _offsets(comm, _ranks(traces), env.get("hosts", []), align)
    all_steps = pd.concat([t.tables[IMPORT_STEPS] for t in traces], ignore_index=True)
    # rank by rank: the rows of one rank at a time are dicts (a 1,024-rank job has millions of
    # collectives: all of them as dicts took 2 GB); the files are the same as written at once
    seen = _Seen()
    comm_of = {int(r): g for r, g in comm.groupby("rank", sort=True)}
    steps_of = {int(r): g for r, g in all_steps.groupby("rank", sort=True)}

    with (atomic_file(run_dir / rf.table_file("steps")) as steps_f,
          atomic_file(run_dir / rf.table_file("collectives")) as colls_f):
        steps_f.write(csv_text([], rf.TABLES["steps"]).encode())
        colls_f.write(csv_text([], rf.TABLES["collectives"]).encode())
        for rank in sorted(set(comm_of) | set(steps_of)):
            colls = collective_rows(comm_of.get(rank, comm.iloc[0:0]), job, env["backend"], offsets)
            seen.colls += len(colls)
            seen.unknown_bytes |= any(c["bytes"] == "" for c in colls)
            colls_f.write(csv_text(colls, rf.TABLES["collectives"], header=False).encode())
            steps = step_rows(steps_of.get(rank, all_steps.iloc[0:0]), colls, job, ws, offsets)
            seen.add_steps(steps)
            steps_f.write(csv_text(steps, rf.TABLES["steps"], header=False).encode())
    for table, cols in rf.TABLES.items():
        if table not in ("steps", "collectives"):
            atomic_write_text(run_dir / rf.table_file(table), csv_text([], cols))
    missing = seen.missing()
    created = now_iso()
    dtype = trace_precision(traces)
    if dtype and not config.get("dtype"):  # trace_handler and import: the precision the traces show
        known_by = next(str(t.facts.get("dtype_from") or "") for t in traces if t.facts.get("dtype") == dtype)
        config = {**config, "dtype": dtype, "dtype_from": f"the traces' {known_by}"}
    meta = {
        "run_id": run_id, "name": name or "", "kind": kind, "created": created, "finished": created,
        "status": "complete", "command": command, "environment": env,
        "config": {**config, "steps": len(seen.step_ids), "model": config.get("model")},
        "jobs": [{"id": job, "kind": "train", "variant": VARIANT, "algo": None, "world_size": ws,
                  "bucket_mb": None, "status": "complete", "error": None, "ranks": ranks,
                  "backend": env["backend"], "device": env["device"],
                  "gpus_shared": gpus_shared(traces, env["backend"]),
                  "clock_offsets_ns": {str(r): int(o) for r, o in offsets.items()},
                  "clock_shift_us": {str(r): -o / 1e3 for r, o in offsets.items()},
                  "clock_alignment": how, **job_extra, "missing": missing, "notes": notes}],
    }
    atomic_write_text(run_dir / rf.RUN_JSON, json.dumps(meta, indent=1, default=str))
    return Imported(run_dir, job, ranks, seen.steps, seen.colls, missing, how, tuple(notes))

