"""The run-directory format (docs/DESIGN.md "The run directory"), in one torch-free, pandas-free place.

Why one module: the writer (``dpcore.write``), the loaders and dashboard (``dpcore.read``) and
the test fixtures must agree on every file name, column, dtype and path. Spelled out once here,
a new column or file is one edit, and a run written by any version of dpcore (or by hand) is
read with the same rules it was written with. Nothing else in dpcore names a run-format column.

A run is ``<out>/<run_id>/`` holding::

    run.json          config, environment, one entry per job with its status
    steps.csv         one row per (job, rank, step)
    collectives.csv   one row per (job, rank, collective call)
    messages.csv      one row per point-to-point message of the from-scratch algorithms
    allreduce.csv     one row per (allreduce job, size)
    grads.csv         one row per (job, rank, step, gradient): when backward produced it
    comm_calls.csv    one row per communication call of a rank's thread (launch, blocking, wait)
    memory.csv        one row per (job, rank): bytes of parameters, gradients, optimizer state, peak
    traces/<job_id>/rank<r>.json.gz   torch.profiler Chrome trace of one rank
    traces/<job_id>/merged.json.gz    all ranks on one clock, messages drawn as flows

Timestamps (``*_ns``) are integer nanoseconds on the job's shared clock; durations (``*_ms``)
are float milliseconds.
"""
from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dpcore.contract.config import BUCKET_SENSITIVE

RUN_JSON = "run.json"
TRACES_DIR = "traces"
MERGED_TRACE = "merged.json.gz"
TRACE_SUFFIXES = (".json.gz", ".json")

#: live.csv: appended (whole lines) by rank 0 while a run runs, kept when it ends. Not one of
#: SCHEMA's tables: RunWriter never writes it, and deleting it changes no other number.
LIVE_FILE = "live.csv"
LIVE_SCHEMA: dict[str, str] = {
    "job_id": "str", "rank": "int", "step": "int", "profiled": "bool", "t_end_ns": "ns",
    "wall_time": "float", "step_ms": "float", "comm_ms": "float", "exposed_comm_ms": "float",
}
LIVE_COLUMNS = list(LIVE_SCHEMA)
#: hang/<job_id>/: what the hang watchdog collected (rank<r>.fr.json, rank<r>.stack.txt,
#: verdict.json)
HANG_DIR = "hang"
VERDICT_FILE = "verdict.json"


def hang_dir(run_dir: Path | str, job: str) -> Path:
    """hang/<job_id>/ of a run."""
    return Path(run_dir) / HANG_DIR / job


def fr_dump_name(rank: int) -> str:
    """A rank's flight-recorder entries as JSON, in hang/<job_id>/."""
    return f"rank{rank}.fr.json"


def stack_name(rank: int) -> str:
    """A rank's Python stacks (faulthandler), in hang/<job_id>/."""
    return f"rank{rank}.stack.txt"


#: Column -> dtype kind of every CSV table: "str", "int", "float", "bool" or "ns" (an integer
#: nanosecond timestamp that may be empty when unknown). Order is the file's column order.
SCHEMA: dict[str, dict[str, str]] = {
    "steps": {
        "job_id": "str", "variant": "str", "world_size": "int", "bucket_mb": "float", "rank": "int",
        "step": "int", "profiled": "bool", "t_start_ns": "ns", "step_ms": "float", "fwd_ms": "float",
        "bwd_ms": "float", "sync_ms": "float", "opt_ms": "float", "comm_ms": "float",
        "comm_ops": "int", "comm_bytes": "int", "samples": "int",
    },
    "collectives": {
        "job_id": "str", "rank": "int", "step": "int", "seq": "int", "op": "str", "algo": "str",
        "bytes": "int", "t_launch_ns": "ns", "t_start_ns": "ns", "t_end_ns": "ns", "bucket": "int",
    },
    "messages": {
        "job_id": "str", "algo": "str", "rank": "int", "step": "int", "call": "int", "phase": "str",
        "ring_step": "int", "src": "int", "dst": "int", "chunk": "int", "bytes": "int",
        "t_post_ns": "ns", "t_done_ns": "ns", "side": "str",
    },
    "allreduce": {
        "job_id": "str", "algo": "str", "world_size": "int", "bytes": "int", "repeats": "int",
        "time_ms": "float", "algbw_gbps": "float", "busbw_gbps": "float",
    },
    # dpcore's additions to docs/DESIGN.md's four tables (older runs lack them: read as empty).
    # grads: one row per gradient per recorded step of a multi-process job; ``param`` is the
    # index among the model's trainable parameters in registration order, ``t_ready_ns`` the
    # moment autograd finished accumulating it (what a bucket's readiness is made of, and
    # what the what-if model re-packs into buckets of other sizes).
    "grads": {
        "job_id": "str", "rank": "int", "step": "int", "param": "int", "name": "str",
        "bytes": "int", "t_ready_ns": "ns",
    },
    # memory: one row per (job, rank): bytes this rank holds of each kind (each tensor storage
    # counted once), and the peak seen during a step (``peak_method`` says how it was taken).
    "memory": {
        "job_id": "str", "rank": "int", "variant": "str", "world_size": "int", "device": "str",
        "param_bytes": "int", "grad_bytes": "int", "optim_bytes": "int", "other_bytes": "int",
        "peak_bytes": "int", "peak_method": "str", "reserved_bytes": "int",
    },
    # comm_calls: when a rank's thread was inside a communication call for collective ``seq``
    # of collectives.csv: ``launch`` (the call that started an async collective), ``blocking``
    # (a blocking collective, launch to return) or ``wait`` (waiting for an async one). Compute
    # is the step's phases minus these: a thread blocked on communication is not computing.
    "comm_calls": {
        "job_id": "str", "rank": "int", "step": "int", "seq": "int", "call": "str",
        "t_begin_ns": "ns", "t_end_ns": "ns",
    },
}
#: Columns a reader accepts as absent (a run written before they existed): it adds them empty (NaN).
#: memory's ``reserved_bytes``: torch.cuda.max_memory_reserved over the measured step (the caching
#: allocator's peak reserve: the peak handed out plus what it kept cached); empty on CPU.
OPTIONAL_COLUMNS: dict[str, tuple[str, ...]] = {"memory": ("reserved_bytes",)}
#: The tables docs/DESIGN.md itself lists (the others are dpcore's documented additions).
DESIGN_TABLES = ("steps", "collectives", "messages", "allreduce")
TABLES: dict[str, list[str]] = {t: list(cols) for t, cols in SCHEMA.items()}
STEP_COLUMNS = TABLES["steps"]
COLLECTIVE_COLUMNS = TABLES["collectives"]
MESSAGE_COLUMNS = TABLES["messages"]
ALLREDUCE_COLUMNS = TABLES["allreduce"]
GRAD_COLUMNS = TABLES["grads"]
MEMORY_COLUMNS = TABLES["memory"]
CALL_COLUMNS = TABLES["comm_calls"]
#: Tables a profiling job's ranks fill (steps, written with comm columns attached, aside).
JOB_TABLES = ("collectives", "messages", "grads", "memory", "comm_calls")

#: The columns that name one point-to-point message on both of its sides (sender and receiver
#: log a row each); pipelined sub-messages of one chunk share the key (see ``contract.messages``).
MESSAGE_KEY = ["job_id", "algo", "step", "call", "phase", "ring_step", "src", "dst", "chunk"]

#: run.json job entries, as the loaders present them (``id`` becomes ``job_id``).
JOB_FIELDS = ["job_id", "kind", "variant", "algo", "world_size", "bucket_mb", "status", "error",
              "oversubscribed", "skip_reason"]
RUN_STATUSES = ("running", "complete", "failed", "interrupted")
JOB_STATUSES = ("pending", "running", "complete", "failed", "skipped", "interrupted")
JOB_KINDS = ("train", "allreduce")
#: Process exit status for each final run status (130 = interrupted, as a shell reports Ctrl-C).
EXIT_CODES = {"complete": 0, "failed": 1, "interrupted": 130}


def table_file(table: str) -> str:
    """``steps`` -> ``steps.csv`` (ValueError naming the valid tables otherwise)."""
    if table not in SCHEMA:
        raise ValueError(f"unknown table {table!r}; valid: {', '.join(SCHEMA)}")
    return f"{table}.csv"


#: Every file of a run directory that a reader's cache must watch.
RUN_FILES = (RUN_JSON, *(table_file(t) for t in SCHEMA))


def job_id(variant: str, world_size: int, bucket_mb: float) -> str:
    """``bucketed-ws2-b25``; the bucket part only where the bucket size matters."""
    base = f"{variant}-ws{world_size}"
    return f"{base}-b{bucket_mb:g}" if variant in BUCKET_SENSITIVE else base


def allreduce_job_id(algo: str, world_size: int) -> str:
    """``ring-ws2``: one all-reduce job per (algorithm, world size)."""
    return f"{algo}-ws{world_size}"


def is_safe_job_id(job: object) -> bool:
    """Whether ``job`` can name a folder inside ``traces/``: a non-empty string that is one
    path component (no ``/`` or ``\\``, not ``.`` or ``..``, no NUL). A job id comes from
    run.json, which anyone can edit: ``../../..`` or ``/etc`` must never lead a reader out of
    the run."""
    return (isinstance(job, str) and job not in ("", ".", "..")
            and not any(c in job for c in "/\\\0"))


def trace_dir(run_dir: Path | str, job: str) -> Path:
    """``<run>/traces/<job_id>/``, the folder of one job's Chrome traces (ValueError for a job
    id that is not one path component: :func:`is_safe_job_id`)."""
    if not is_safe_job_id(job):
        raise ValueError(f"job id {job!r} is not a single name (it contains '/', '\\' or is '..'): "
                         "its traces would lie outside the run")
    return Path(run_dir) / TRACES_DIR / job


def rank_trace_name(rank: int) -> str:
    """``rank3.json.gz``: the file name torch.profiler's trace of one rank is saved under."""
    return f"rank{int(rank)}.json.gz"


def trace_key(filename: str) -> str | None:
    """``rank0.json.gz`` -> ``rank0``, ``merged.json`` -> ``merged``; None if not a trace file."""
    for ext in TRACE_SUFFIXES:
        if filename.endswith(ext) and len(filename) > len(ext):
            return filename[: -len(ext)]
    return None


def is_rank_trace(key: str) -> bool:
    """True for the per-rank traces of a job (``rank<r>``), False for ``merged`` and others."""
    return re.fullmatch(r"rank\d+", key) is not None


_TRUE = frozenset({"true", "1", "yes", "t", "y"})
_FALSE = frozenset({"false", "0", "no", "f", "n", "", "nan", "none"})


def parse_bool(value: Any) -> bool:
    """A boolean cell as any writer spelled it: ``True``/``False`` (Python's CSV), ``1``/``0``,
    ``true``/``false``; an empty cell is False. ValueError for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and math.isnan(value):
            return False
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"not a boolean: {value!r}; expected True/False or 1/0")


def parse_bools(values: Iterable[Any]) -> list[bool]:
    """:func:`parse_bool` of each value; a cell it cannot read counts as False (not traced)."""
    out = []
    for v in values:
        try:
            out.append(parse_bool(v))
        except ValueError:
            out.append(False)
    return out


def parse_ns(value: Any) -> int | None:
    """A ``*_ns`` cell: an integer nanosecond timestamp, or None where the writer left it empty
    (``t_start_ns`` when the backend does not say when it began a collective)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    text = str(value).strip()
    if not text or text.lower() in ("nan", "none"):
        return None
    try:
        ns = int(float(text)) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise ValueError(f"not a nanosecond timestamp: {value!r}") from None
    return ns if ns >= 0 else None


def format_ns(ns: int | None) -> int | str:
    """The writer's side of :func:`parse_ns`: an unknown (None or negative) time is an empty cell."""
    return "" if ns is None or ns < 0 else int(ns)


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists on this host and is not a zombie (a killed launcher
    whose parent has not reaped it yet is as dead as one that was reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    except (OverflowError, ValueError):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (not Linux): kill(0) answered, so it exists


def is_stale(meta: dict[str, Any], *, alive: Callable[[int], bool] = pid_alive,
             host: str | None = None) -> bool:
    """True when run.json ``meta`` says ``running`` but the process writing it is gone.

    Why: a launcher killed by ``kill -9`` (or a power cut) never marks its run, which would
    then read ``running`` forever. RunWriter records ``owner: {pid, host}``; a run is stale
    when its owner ran on this host (``host``, default this machine's name) and ``alive(pid)``
    says it no longer exists. Runs from another host, or written before owners were recorded,
    are never called stale: nothing here can know. A reused pid makes a dead run look alive
    (a missed stale, never a false one)."""
    if meta.get("status") != "running":
        return False
    owner = meta.get("owner")
    if not isinstance(owner, dict):
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if owner.get("host") != (socket.gethostname() if host is None else host):
        return False
    return not alive(pid)
