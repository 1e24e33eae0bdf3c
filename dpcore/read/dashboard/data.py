"""What several dashboard pages share: the run listing, cached run loading, the path checks, and
the analysis results more than one page draws (per-step trace overlap, the per-job summary).

The dashboard's one caching pattern, used here and by every page for its own results: an
``@st.cache_data`` function whose first two arguments are ``(_run, run_key)``. ``_run`` (not
hashed: the leading underscore) is the loaded run, ``run_key = key(run)`` its path plus a stamp of
its files' mtimes and sizes, so a run still being written is recomputed when a file is replaced.
Figures are cached the same way (unpickling a figure costs a fraction of building it), except the
first chart a reload draws (Overview's breakdown): ``st.cache_resource`` with the same arguments,
which hands back the one figure without unpickling it, since only ``st.plotly_chart`` reads it.
One exception, the per-step traces (:func:`cached_trace_steps`): a bounded cache of its own, the
same arguments, because the pages ask whether a run's traces are read yet (:func:`traces_read`)
and only a cache that can be asked answers that without a second record that drifts from it.
Why: every script rerun must be cheap (page switches < 1 s on a busy 2-core box).

Why the path checks: the profiles folder is the trust boundary; a symlink or a crafted name must
never make the app read elsewhere. The pages read a run's files through :func:`cached_run`
(``root=`` confines the loader, the run's traces included) and :func:`file_reader`. Nothing here
executes data from a run: only JSON/CSV via `dpcore.read.rundir` loaders. (Elsewhere the app
touches disk twice, on the user's request: the Import page reads the traces it is pointed at and
writes a run, and the New run page starts a profile that writes one.)
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

import pandas as pd
import streamlit as st

from dpcore.contract import runformat as rf
from dpcore.contract.tracefile import MAX_TRACE_FILE_BYTES, open_regular
from dpcore.read.analysis import job_summary
from dpcore.read.analysis.gpu_kernels import KERNEL_COLUMNS
from dpcore.read.analysis.gpu_time import CAUSE_COLUMNS, LEDGER_COLUMNS
from dpcore.read.rundir import Run, RunLoadError, list_runs, load_run
from dpcore.read.rundir.load import printable
from dpcore.read.tables import run_gpu, run_trace_steps

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
    return list_runs(root, loader=lambda d: cached_run(d, Path(root)))


def cached_runs(root: Path) -> tuple[pd.DataFrame, list[str]]:
    """All loadable runs under root, newest first, plus one warning per unreadable run (cached)."""
    if not root.is_dir():
        return pd.DataFrame(), []
    runs, warnings = _list_runs(str(root), root_stamp(root))
    warnings = list(warnings)
    if not runs.empty:
        ok = [inside(p, root) for p in runs["path"]]
        warnings += [f"{p} resolves outside the profiles folder {root}; ignored"
                     for p, k in zip(runs["path"], ok) if not k]
        runs = runs[ok].reset_index(drop=True)
        runs["status"] = [_live_status(p, s, root) for p, s in zip(runs["path"], runs["status"])]
    return runs, warnings


def _live_status(path: str, status: object, root: Path) -> object:
    """'stale' for a run still marked running whose writer is gone (checked on every rerun, not
    cached: a killed launcher changes no file, so no cache key would notice)."""
    if status != "running":
        return status
    try:
        return "stale" if rf.is_stale(cached_run(path, root).meta) else status
    except Exception:  # noqa: BLE001 - an unreadable run keeps the status it listed with
        return status


@st.cache_data(show_spinner=False, max_entries=8)
def _load(path: str, stamp: tuple, root: str) -> Run:
    # root confines every file the loader opens (run files and, later, the run's traces)
    return load_run(path, root=root)


def cached_run(path: Path | str, root: Path) -> Run:
    """Load one run (cached). Raises RunLoadError for a bad run or a path outside root."""
    if not inside(path, root):
        raise RunLoadError(f"{path} resolves outside the profiles folder {root}; not read")
    return _load(str(Path(path).resolve()), _stamp(Path(path)), str(root.resolve()))


def key(run: Run) -> tuple:
    """Cache key of a loaded run (its path and file stamp)."""
    return str(run.path), _stamp(Path(run.path))


#: How many runs' per-step trace tables the server keeps (the least recently used goes first).
TRACE_STEPS_ENTRIES = 16
#: run_key -> :func:`cached_trace_steps`' frame: the cache itself, and so the one record of which
#: runs' traces are read (a separate "read" set drifted from an evicting cache: it said "read"
#: after the entry was gone, and the page then blocked on a cold read without its steps-first view).
_trace_steps: OrderedDict[tuple, pd.DataFrame] = OrderedDict()
_trace_steps_lock = threading.Lock()


def cached_trace_steps(_run: Run, run_key: tuple) -> pd.DataFrame:
    """Per-step overlap of every job's traces (`trace_step_metrics`' rows, from the per-rank tables
    in the run's cache/, :mod:`dpcore.read.ranks`): read once per run, shared by the pages (the
    per-job summary, the Timeline's step cards). ``attrs["problems"]``: one line per job whose rank
    traces were missing, unreadable or refused (:func:`trace_problems`). Kept in
    :data:`_trace_steps` (TRACE_STEPS_ENTRIES runs, least recently used out first; the caller
    gets a copy, as ``st.cache_data`` hands out), so :func:`traces_read` asks the cache itself."""
    with _trace_steps_lock:
        hit = _trace_steps.get(run_key)
        if hit is not None:
            _trace_steps.move_to_end(run_key)
            return hit.copy()
    problems: list[str] = []
    with st.spinner("Reading the run's traces…"):
        out = run_trace_steps(_run, problems=problems)
    out.attrs["problems"] = problems
    with _trace_steps_lock:
        _trace_steps[run_key] = out
        _trace_steps.move_to_end(run_key)
        while len(_trace_steps) > TRACE_STEPS_ENTRIES:
            _trace_steps.popitem(last=False)
    return out.copy()


def traces_read(run: Run) -> bool:
    """Whether :func:`cached_trace_steps` holds the run's traces now (then reading them is a cache
    hit): False on a cold first visit, or after the run's entry made room for others, where the
    read takes seconds (9-16 s on the samples on a busy 2-core machine) and
    :func:`frame.steps_while_traces_are_read` shows steps.csv first."""
    with _trace_steps_lock:
        return key(run) in _trace_steps


@st.cache_data(show_spinner=False, max_entries=16)
def cached_timed_steps(_run: Run, run_key: tuple) -> pd.DataFrame:
    """Each training job's step time from steps.csv alone (`job_summary` without traces: the same
    step_ms, p10 and p90 as the full summary, which takes them from the timed steps too)."""
    return job_summary(_run, None)[["job_id", "status", "step_ms", "step_ms_p10", "step_ms_p90"]]


def trace_problems(run: Run) -> list[str]:
    """The jobs of the run whose traces were not used, one line each naming the file (cached
    with :func:`cached_trace_steps`, which the pages that show trace numbers read anyway)."""
    return list(cached_trace_steps(run, key(run)).attrs.get("problems", []))


def may_have_gpu(run: Run) -> bool:
    """Whether the run's machine had a GPU (run.json: ``gpus`` > 0 or device ``cuda``). Only then
    are its traces read for the GPU ledger: on a CPU run the ledger is empty, and its lazy tables
    would cost one more pass over every rank's trace (1,024 ranks: many seconds)."""
    env = run.meta.get("environment") if isinstance(run.meta, dict) else None
    env = env if isinstance(env, dict) else {}
    gpus = env.get("gpus")
    return (isinstance(gpus, (int, float)) and gpus > 0) or str(env.get("device") or "").startswith("cuda")


@st.cache_data(show_spinner="Reading the GPU time ledger…", max_entries=16)
def cached_gpu(_run: Run, run_key: tuple) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(ledger, causes, kernel classes) of every traced job (`dpcore.read.tables.run_gpu`, what the
    ``gpu`` command prints), from the rank cache: the GPU page and Overview's GPU column. Jobs
    without GPU events have no rows; a run whose machine had no GPU (:func:`may_have_gpu`) has none
    and is not read."""
    if not may_have_gpu(_run):
        return (pd.DataFrame(columns=["job_id", *LEDGER_COLUMNS]), pd.DataFrame(columns=["job_id", *CAUSE_COLUMNS]),
                pd.DataFrame(columns=["job_id", *KERNEL_COLUMNS]))
    return run_gpu(_run)


@st.cache_data(show_spinner=False, max_entries=16)
def cached_summary(_run: Run, run_key: tuple) -> pd.DataFrame:
    """`job_summary` of the run: Overview, Timeline, Scaling, Buckets, Memory and compare mode."""
    return job_summary(_run, cached_trace_steps(_run, run_key))


def trace_files(run: Run, job_id: str, root: Path) -> dict[str, Path]:
    """The job's trace files that exist and lie inside the profiles folder."""
    try:
        files = run.trace_files(job_id)
    except Exception:  # noqa: BLE001 - a broken traces folder must not break the page
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
