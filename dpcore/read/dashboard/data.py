"""Cached, path-checked access to runs for the dashboard (the only place the app touches disk).

Why: every script rerun must be cheap (view switches < 1 s), so loads and analysis results are
memoised with `st.cache_data`, keyed by the run's path plus a stamp of its files' mtimes and sizes
(a run still being written reloads when a file is replaced). Why the path checks: the profiles
folder is the trust boundary; a symlink or a crafted name must never make the app read elsewhere.
Nothing here executes data from a run: only JSON/CSV via `dpcore.read.analysis` loaders.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import streamlit as st

from dpcore.contract import runformat as rf
from dpcore.contract.tracefile import MAX_TRACE_FILE_BYTES, open_regular
from dpcore.read import analysis as A
from dpcore.read.rundir.load import printable

APP_DIR = Path(__file__).resolve().parents[3]  # the repository root, where app.py lives


def profiles_root() -> Path:
    """`profiles/` next to app.py, or $DPCORE_PROFILES."""
    return Path(os.environ.get("DPCORE_PROFILES") or APP_DIR / "profiles").resolve()


def inside(path: Path | str, root: Path) -> bool:
    """True when `path` (after resolving symlinks) lies inside `root`."""
    try:
        return Path(path).resolve().is_relative_to(root.resolve())
    except (OSError, ValueError):
        return False


def _stamp(run_dir: Path) -> tuple:
    """Cheap fingerprint of a run's files: reload when any is rewritten (they are replaced atomically)."""
    out = []
    for name in rf.RUN_FILES:
        try:
            s = (run_dir / name).stat()
            out.append((name, s.st_mtime_ns, s.st_size))
        except OSError:
            out.append((name, 0, 0))
    return tuple(out)


def root_stamp(root: Path) -> tuple:
    """Fingerprint of the profiles folder: names and run.json mtimes of its children."""
    if not root.is_dir():
        return ()
    items = []
    for child in sorted(root.iterdir()):
        name = printable(child.name)  # Streamlit's cache hashes the stamp as UTF-8
        try:
            items.append((name, (child / rf.RUN_JSON).stat().st_mtime_ns))
        except OSError:
            items.append((name, 0))
    return tuple(items)


@st.cache_data(show_spinner=False, max_entries=8)
def _list_runs(root: str, stamp: tuple) -> tuple[pd.DataFrame, list[str]]:
    # each run goes through the per-run cache: a run.json rewrite of one run (a profile started
    # from this page writes one after every job) re-parses that run only
    # the folder is checked against root before anything in it is read (a link out of the
    # profiles folder is reported by load_run(root=...), not parsed and then filtered)
    return A.list_runs(root, loader=lambda d: load_run(d, Path(root)))


def list_runs(root: Path) -> tuple[pd.DataFrame, list[str]]:
    """All loadable runs under root, newest first, plus one warning per unreadable run (cached)."""
    if not root.is_dir():
        return pd.DataFrame(), []
    runs, warnings = _list_runs(str(root), root_stamp(root))
    warnings = list(warnings)
    if not runs.empty:
        ok = [inside(p, root) for p in runs["path"]]
        warnings += [f"{p} resolves outside the profiles folder {root}; ignored" for p, k in zip(runs["path"], ok) if not k]
        runs = runs[ok].reset_index(drop=True)
        runs["status"] = [_live_status(p, s, root) for p, s in zip(runs["path"], runs["status"])]
    return runs, warnings


def _live_status(path: str, status: object, root: Path) -> object:
    """'stale' for a run still marked running whose writer is gone (checked on every rerun, not
    cached: a killed launcher changes no file, so no cache key would notice)."""
    if status != "running":
        return status
    try:
        return "stale" if rf.is_stale(load_run(path, root).meta) else status
    except Exception:  # noqa: BLE001 - an unreadable run keeps the status it listed with
        return status


@st.cache_data(show_spinner=False, max_entries=8)
def _load(path: str, stamp: tuple, root: str) -> A.Run:
    # root confines every file the loader opens (run files and, later, the run's traces)
    return A.load_run(path, root=root)


def load_run(path: Path | str, root: Path) -> A.Run:
    """Load one run (cached). Raises RunLoadError for a bad run or a path outside root."""
    if not inside(path, root):
        raise A.RunLoadError(f"{path} resolves outside the profiles folder {root}; not read")
    return _load(str(Path(path).resolve()), _stamp(Path(path)), str(root.resolve()))


def key(run: A.Run) -> tuple:
    """Cache key of a loaded run (its path and file stamp)."""
    return str(run.path), _stamp(Path(run.path))


@st.cache_data(show_spinner=False, max_entries=16)
def trace_steps(_run: A.Run, run_key: tuple) -> pd.DataFrame:
    # per-step overlap of every job's traces: read once per run, shared by every view
    return A.trace_step_metrics(_run)


@st.cache_data(show_spinner=False, max_entries=16)
def job_summary(_run: A.Run, run_key: tuple) -> pd.DataFrame:
    return A.job_summary(_run, trace_steps(_run, run_key))


@st.cache_data(show_spinner=False, max_entries=16)
def step_metrics(_run: A.Run, run_key: tuple) -> pd.DataFrame:
    return A.step_metrics(_run.steps, _run.collectives, trace_steps(_run, run_key), _run.comm_calls)


@st.cache_data(show_spinner=False, max_entries=16)
def scaling(_run: A.Run, run_key: tuple, mode: str) -> pd.DataFrame:
    bucket = (_run.meta.get("config") or {}).get("bucket_mb")
    bucket = bucket if isinstance(bucket, (int, float)) else None  # foreign run.json: ignore
    return A.scaling(job_summary(_run, run_key), mode, default_bucket=bucket)


@st.cache_data(show_spinner=False, max_entries=16)
def bucket_sweep(_run: A.Run, run_key: tuple) -> pd.DataFrame:
    return A.bucket_sweep(job_summary(_run, run_key))


@st.cache_data(show_spinner=False, max_entries=16)
def bandwidth(_run: A.Run, run_key: tuple) -> pd.DataFrame:
    return A.allreduce_bandwidth(_run.allreduce)


@st.cache_resource(show_spinner=False, max_entries=4)
def _job_events(_run: A.Run, run_key: tuple, job_id: str) -> pd.DataFrame | None:
    # cache_resource: a job's trace events can be a million rows; keep one read-only copy
    # instead of pickling a copy per access, and read the traces once per job, not per step
    return A.job_trace_events(_run, job_id)


@st.cache_data(show_spinner=False, max_entries=32)
def timeline(_run: A.Run, run_key: tuple, job_id: str, step: int) -> pd.DataFrame:
    events = _job_events(_run, run_key, job_id) if step in _run.traced_steps(job_id) else None
    return A.timeline(_run, job_id, step, events=events)


@st.cache_data(show_spinner=False, max_entries=16)
def ring_step_times(_run: A.Run, run_key: tuple) -> pd.DataFrame:
    return A.ring_step_times(_run.messages)


@st.cache_data(show_spinner=False, max_entries=16)
def message_counts(_run: A.Run, run_key: tuple) -> pd.DataFrame:
    return A.message_counts(_run.messages)


@st.cache_data(show_spinner=False, max_entries=16)
def chunk_matrix(world_size: int) -> pd.DataFrame:
    return A.chunk_matrix(world_size)


def trace_files(run: A.Run, job_id: str, root: Path) -> dict[str, Path]:
    """The job's trace files that exist and lie inside the profiles folder."""
    try:
        files = run.trace_files(job_id)
    except Exception:  # a broken traces folder must not break the page
        return {}
    return {name: Path(p) for name, p in files.items() if inside(p, root) and Path(p).is_file()}


def file_reader(path: Path, root: Path):
    """A zero-argument reader for `st.download_button` so a trace is read only when clicked."""
    if not inside(path, root):
        raise ValueError(f"{path} is outside the profiles folder {root}")

    def read() -> bytes:  # checked again when clicked: the file may have been replaced since
        if not inside(path, root):
            raise ValueError(f"{path} is outside the profiles folder {root}")
        with open_regular(path, MAX_TRACE_FILE_BYTES) as fh:
            return fh.read()
    return read
