"""Run-directory loader: the only reader of run.json and the CSV tables (traces: job_traces.py).

Only JSON and CSV are read (never pickle): opening someone's run must not execute anything.
Every problem is reported as RunLoadError naming the offending file, so the dashboard can warn
about one bad run and still list the others. A profiles folder is user-supplied, so a file is
opened only when it is a regular file below MAX_RUN_FILE_BYTES (a FIFO would block the reader,
/dev/zero would fill the memory), run.json must have the shape the rest of the code assumes,
and with ``root`` given (the dashboard) nothing that resolves outside ``root`` is opened; with
or without it, no run file is read through a link that leaves the run
(:func:`dpcore.contract.files.open_inside`, the one opener of run files here, in live.py and in
hang.py; a trace file that resolves outside the run is not one of its traces). A job
id must be one path component (``../..`` would lead a reader out of the run), and what the run
claims is checked against its tables (:mod:`dpcore.read.rundir.checks`): damaged content is
named in ``Run.warnings``, not averaged.
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dpcore.contract import runformat as rf
from dpcore.contract.config import model_size_text
from dpcore.contract.files import open_inside
from dpcore.contract.tracefile import NotRegularFileError
from dpcore.read.rundir.checks import check_content

COLUMNS = rf.TABLES
JOB_COLUMNS = rf.JOB_FIELDS
#: Largest run.json or CSV table read; far above any real run, small enough to keep a hostile
#: or runaway file from exhausting the memory.
MAX_RUN_FILE_BYTES = 512 << 20
RUN_COLUMNS = ["run_id", "path", "created", "finished", "status", "model", "size", "variants", "world_sizes",
               "backend", "device", "kinds", "oversubscribed"]


class RunLoadError(Exception):
    """A run directory or one of its files is missing, truncated or not a dpcore run."""


@dataclass(frozen=True)
class Run:
    """One loaded run directory (docs/DESIGN.md 'The run directory')."""

    path: Path
    meta: dict
    jobs: pd.DataFrame
    steps: pd.DataFrame
    collectives: pd.DataFrame
    messages: pd.DataFrame
    allreduce: pd.DataFrame
    #: dpcore's additions (runformat's docstring): per-gradient ready times, memory per rank,
    #: communication calls.
    grads: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=rf.GRAD_COLUMNS))
    memory: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=rf.MEMORY_COLUMNS))
    #: When each rank's thread was inside a communication call (empty for older runs).
    comm_calls: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=rf.CALL_COLUMNS))
    #: The folder the run was confined to when loaded (the dashboard's profiles folder), else None.
    root: Path | None = None
    #: One line per problem the loader worked around (rows with unreadable numbers, skipped).
    warnings: tuple[str, ...] = ()

    def trace_files(self, job_id: str) -> dict[str, Path]:
        """{"rank0": path, ..., "merged": path} of the job's traces that exist on disk (regular
        files that resolve inside the run; with ``root`` set, inside it too)."""
        d = rf.trace_dir(self.path, job_id)
        out: dict[str, Path] = {}
        if not d.is_dir() or not inside_root(d, self.path) or \
                (self.root is not None and not inside_root(d, self.root)):
            return out
        for f in sorted(d.iterdir()):
            key = rf.trace_key(f.name)
            if key is not None and f.is_file() and inside_root(f, self.path) \
                    and (self.root is None or inside_root(f, self.root)):
                out.setdefault(key, f)
        return out

    def traced_steps(self, job_id: str) -> list[int]:
        """The job's steps that a trace covers: profiled in steps.csv AND the job has rank traces.

        The one answer to "is this step traced?" for the timeline, its step picker and the
        dashboard's trace loading (a profiled step whose traces were lost is not traced).
        """
        st = self.steps
        rows = st[(st["job_id"] == job_id) & st["profiled"].astype(bool)] if "profiled" in st else st.iloc[0:0]
        if rows.empty or not self.rank_trace_files(job_id):
            return []
        return sorted(int(s) for s in rows["step"].unique())

    def rank_trace_files(self, job_id: str) -> list[Path]:
        """The job's per-rank traces (``rank<r>``), in rank-name order; [] when it has none."""
        return [f for k, f in self.trace_files(job_id).items() if rf.is_rank_trace(k)]


def inside_root(path: Path, root: Path) -> bool:
    """True when ``path``, symlinks resolved, lies inside ``root`` (also resolved)."""
    try:
        return Path(path).resolve().is_relative_to(Path(root).resolve())
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop
        return False


def _read_file(f: Path, root: Path | None) -> bytes | None:
    """The bytes of one run file (``f`` directly in its run folder), None when it does not
    exist; RunLoadError naming the file when it lies outside ``root`` or (links resolved)
    outside its run, is not a regular file, or is larger than MAX_RUN_FILE_BYTES."""
    if root is not None and (os.path.lexists(f) and not inside_root(f, root)):
        raise RunLoadError(f"{f} resolves outside the profiles folder {root}; not read")
    try:
        with open_inside(f, f.parent, MAX_RUN_FILE_BYTES) as fh:
            data = fh.read(MAX_RUN_FILE_BYTES + 1)  # the file may grow after the size check
    except FileNotFoundError:
        return None
    except NotRegularFileError as exc:
        raise RunLoadError(str(exc)) from None
    except OSError as exc:
        raise RunLoadError(f"cannot read {f}: {exc.strerror or exc}") from None
    if len(data) > MAX_RUN_FILE_BYTES:
        raise RunLoadError(f"file larger than {MAX_RUN_FILE_BYTES >> 20} MiB: {f}")
    return data


def _check_meta(meta: object, f: Path) -> dict:
    """run.json as the loaders and views use it, or RunLoadError naming the file.

    Why every field is checked here: the code downstream calls ``.get`` on config/environment
    and iterates jobs; one hand-edited run.json with a string there must fail as *this* run's
    warning, not as an AttributeError that takes the whole run list down.
    """
    if not isinstance(meta, dict) or not isinstance(meta.get("jobs", []), list) or \
            not ({"run_id", "jobs", "config"} & meta.keys()):
        raise RunLoadError(f"not a dpcore run.json (expected an object with run_id/config/jobs): {f}")
    for key in ("config", "environment"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise RunLoadError(f"malformed {f}: {key!r} must be an object, got {type(meta[key]).__name__}")
    for i, job in enumerate(meta.get("jobs") or []):
        if not isinstance(job, dict):
            raise RunLoadError(f"malformed {f}: jobs[{i}] must be an object, got {type(job).__name__}")
        jid = job.get("id", job.get("job_id"))
        if jid is not None and not isinstance(jid, str):
            raise RunLoadError(f"malformed {f}: jobs[{i}].id must be a string")
        if jid is not None and not rf.is_safe_job_id(jid):
            raise RunLoadError(f"malformed {f}: jobs[{i}].id {jid!r} is not a job id (one name, without "
                               "'/', '\\' or '..'); it would lead outside the run: not read")
    env = meta.get("environment") or {}
    for key in ("cpu_cores", "gpus"):
        v = env.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise RunLoadError(f"malformed {f}: environment.{key} must be a whole number >= 0, "
                               f"got {v!r}")
    for key in ("run_id", "created", "finished", "status"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise RunLoadError(f"malformed {f}: {key!r} must be a string, got {type(meta[key]).__name__}")
    return meta


def _read_meta(path: Path, root: Path | None = None) -> dict:
    f = path / rf.RUN_JSON
    data = _read_file(f, root)
    if data is None:
        raise RunLoadError(f"not a run directory (no {rf.RUN_JSON}): {path}")
    try:
        meta = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunLoadError(f"truncated or invalid JSON in {f}: {exc}") from None
    except RecursionError:
        raise RunLoadError(f"invalid {f}: JSON nested too deeply") from None
    return _check_meta(meta, f)


def _read_csv(path: Path, table: str, root: Path | None = None,
              warnings: list[str] | None = None) -> pd.DataFrame:
    f = path / rf.table_file(table)
    cols = COLUMNS[table]
    data = _read_file(f, root)
    if data is None or not data.strip():
        return pd.DataFrame(columns=cols)
    if not data.endswith(b"\n"):
        raise RunLoadError(f"truncated CSV (no final newline): {f}")
    try:
        df = pd.read_csv(io.BytesIO(data))
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise RunLoadError(f"truncated or malformed CSV {f}: {str(exc).splitlines()[0]}") from None
    optional = rf.OPTIONAL_COLUMNS.get(table, ())
    missing = [c for c in cols if c not in df.columns and c not in optional]
    if missing:
        raise RunLoadError(f"not a dpcore {table}.csv (missing columns {', '.join(missing)}): {f}")
    for c in optional:  # an older run: the column did not exist yet
        if c not in df.columns:
            df[c] = float("nan")
    for col, kind in rf.SCHEMA[table].items():
        if kind == "bool":  # "True"/"False" from Python's csv, 1/0 or true/false by hand
            df[col] = pd.Series(rf.parse_bools(df[col].tolist()), index=df.index, dtype=bool)
    return _drop_unreadable(df, table, f, warnings)


def _drop_unreadable(df: pd.DataFrame, table: str, f: Path, warnings: list[str] | None) -> pd.DataFrame:
    """Rows whose numeric cells do not parse (a hand-edited or damaged file) are dropped, named
    by line in one warning, instead of one bad cell failing every view of the run. Empty cells
    stay NaN: a writer may leave a number unknown (``t_start_ns``)."""
    bad = pd.Series(False, index=df.index)
    for col, kind in rf.SCHEMA[table].items():
        if kind not in ("int", "float", "ns") or df[col].dtype.kind in "iuf":
            continue
        num = pd.to_numeric(df[col], errors="coerce")
        bad |= num.isna() & df[col].notna() & (df[col].astype(str).str.strip() != "")
        df[col] = num
    if bad.any():
        lines = ", ".join(str(i + 2) for i in df.index[bad][:5]) + (" ..." if bad.sum() > 5 else "")
        msg = f"{f}: {int(bad.sum())} row(s) with unreadable numbers skipped (line {lines})"
        if warnings is not None:
            warnings.append(msg)
        df = df[~bad].reset_index(drop=True)
        for col, kind in rf.SCHEMA[table].items():  # whole numbers again once the bad rows are gone
            if kind == "int" and df[col].notna().all():
                df[col] = df[col].astype("int64")
    return df


def _jobs_frame(meta: dict) -> pd.DataFrame:
    env = meta.get("environment") or {}
    rows = []
    for j in meta.get("jobs", []):
        if not isinstance(j, dict):
            continue
        row = dict(j)
        row["job_id"] = row.pop("id", row.get("job_id"))
        if row.get("oversubscribed") is None:
            cores = env.get("cpu_cores")
            row["oversubscribed"] = bool(env.get("oversubscribed")) and bool(
                cores and (row.get("world_size") or 0) > cores)
        rows.append(row)
    df = pd.DataFrame(rows)
    for c in JOB_COLUMNS:
        if c not in df:
            df[c] = None
    extra = [c for c in df.columns if c not in JOB_COLUMNS]
    return df[JOB_COLUMNS + extra]


def load_run(path: str | Path, root: str | Path | None = None) -> Run:
    """Load a run directory; raises RunLoadError naming the missing/truncated/foreign file.

    ``root`` confines the load (the dashboard passes its profiles folder): the run folder and
    every file opened, trace files included (:meth:`Run.trace_files`), must resolve inside it,
    checked before anything is read. Without it (the CLI on a path the user named) the run
    folder may be a link, but no file is read through a link that leaves the run.
    """
    p = Path(path)
    r = Path(root) if root is not None else None
    if r is not None and not inside_root(p, r):
        raise RunLoadError(f"{p} resolves outside the profiles folder {r}; not read")
    if not p.is_dir():
        raise RunLoadError(f"not a run directory (a file, pipe or device): {p}" if p.exists()
                           else f"run directory not found: {p}")
    meta = _read_meta(p, r)
    warnings: list[str] = []
    tables = {t: _read_csv(p, t, r, warnings) for t in COLUMNS}
    # an import of some ranks of a larger job has rows for those ranks only: no warning for the rest
    jobs, tables, found = check_content(p, _jobs_frame(meta), tables, imported=meta.get("kind") == "import")
    return Run(path=p, meta=meta, jobs=jobs, root=r, warnings=(*warnings, *found), **tables)


def _join(values: pd.Series) -> str:
    vals = sorted({v for v in values.dropna().tolist()}, key=lambda v: (str(type(v)), v))
    return ",".join(str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in vals)


def run_row(run: Run) -> dict[str, Any]:
    """The list_runs row of one loaded run."""
    m, env, cfg = run.meta, run.meta.get("environment") or {}, run.meta.get("config") or {}
    jobs = run.jobs
    device = env.get("device") or ",".join(map(str, env.get("devices") or []))
    return {"run_id": m.get("run_id", run.path.name), "path": str(run.path), "created": m.get("created"),
            "finished": m.get("finished"), "status": m.get("status"), "model": cfg.get("model"),
            "size": model_size_text(cfg) or None,  # 'width 256' for mlp: --size is the transformer's
            "variants": _join(jobs["variant"]), "world_sizes": _join(jobs["world_size"]),
            "backend": env.get("backend"), "device": device, "kinds": _join(jobs["kind"]),
            "oversubscribed": bool(env.get("oversubscribed")) or bool(jobs["oversubscribed"].fillna(False).any())}


def is_utf8(name: str) -> bool:
    """Whether a file name decoded from the file system is valid UTF-8 (no surrogate escapes)."""
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def printable(path: str | Path) -> str:
    """A path as valid text: bytes that are not UTF-8 shown as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def list_runs(root: str | Path = "profiles",
              loader: Callable[[Path], Run] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """All loadable runs under root, newest first, plus one warning per unreadable run (names the file).

    ``loader`` (default :func:`load_run`) lets a caller with a per-run cache (the dashboard)
    list runs without re-parsing the ones that did not change.
    """
    loader = loader or load_run
    r = Path(root)
    rows, warnings = [], []
    if not r.is_dir():
        return pd.DataFrame(columns=RUN_COLUMNS), [f"profiles folder not found: {r}"]
    for d in sorted(r.iterdir()):
        if d.name.startswith((".", "_")) or not d.is_dir():
            continue
        if not is_utf8(d.name):  # cannot be shown, hashed by Streamlit's cache, or put in a URL
            warnings.append(f"run folder name is not valid UTF-8, skipped: {printable(d)}")
            continue
        try:
            rows.append(run_row(loader(d)))
        except RunLoadError as exc:
            warnings.append(str(exc))
        except RecursionError:
            warnings.append(f"cannot load run {d}: data nested too deeply")
        except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            # the loader validates what it reads; this is the net that keeps one run's surprise
            # (a bug, a file changed mid-read) from hiding every other run
            warnings.append(f"cannot load run {d}: {type(exc).__name__}: {exc}")
    df = pd.DataFrame(rows, columns=RUN_COLUMNS)
    if not df.empty:
        df = df.assign(_k=df["created"].fillna("").astype(str)).sort_values(
            ["_k", "run_id"], ascending=False).drop(columns="_k").reset_index(drop=True)
    return df, warnings
