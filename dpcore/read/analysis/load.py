"""Run-directory loaders: the only analysis code that reads run files (traces: traces.py).

Only JSON and CSV are read (never pickle): opening someone's run must not execute anything.
Every problem is reported as RunLoadError naming the offending file, so the dashboard can warn
about one bad run and still list the others.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from dpcore.contract import runformat as rf

COLUMNS = rf.TABLES
JOB_COLUMNS = rf.JOB_FIELDS
RUN_COLUMNS = ["run_id", "path", "created", "finished", "status", "model", "size", "variants", "world_sizes",
               "backend", "device", "kinds", "oversubscribed"]


class RunLoadError(Exception):
    """A run directory or one of its files is missing, truncated or not a dpcore run."""


@dataclass(frozen=True)
class Run:
    """One loaded run directory (DESIGN.md 'The run directory')."""

    path: Path
    meta: dict
    jobs: pd.DataFrame
    steps: pd.DataFrame
    collectives: pd.DataFrame
    messages: pd.DataFrame
    allreduce: pd.DataFrame

    def trace_files(self, job_id: str) -> dict[str, Path]:
        """{"rank0": path, ..., "merged": path} of the job's traces that exist on disk."""
        d = rf.trace_dir(self.path, job_id)
        out: dict[str, Path] = {}
        if not d.is_dir():
            return out
        for f in sorted(d.iterdir()):
            key = rf.trace_key(f.name)
            if key is not None and f.is_file():
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


def _read_meta(path: Path) -> dict:
    f = path / rf.RUN_JSON
    if not f.is_file():
        raise RunLoadError(f"not a run directory (no {rf.RUN_JSON}): {path}")
    try:
        meta = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunLoadError(f"truncated or invalid JSON in {f}: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("jobs", []), list) or \
            not ({"run_id", "jobs", "config"} & meta.keys()):
        raise RunLoadError(f"not a dpcore run.json (expected an object with run_id/config/jobs): {f}")
    return meta


def _read_csv(path: Path, table: str) -> pd.DataFrame:
    f = path / rf.table_file(table)
    cols = COLUMNS[table]
    if not f.exists():
        return pd.DataFrame(columns=cols)
    data = f.read_bytes()
    if not data.strip():
        return pd.DataFrame(columns=cols)
    if not data.endswith(b"\n"):
        raise RunLoadError(f"truncated CSV (no final newline): {f}")
    try:
        df = pd.read_csv(io.BytesIO(data))
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise RunLoadError(f"truncated or malformed CSV {f}: {str(exc).splitlines()[0]}") from None
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise RunLoadError(f"not a dpcore {table}.csv (missing columns {', '.join(missing)}): {f}")
    for col, kind in rf.SCHEMA[table].items():
        if kind == "bool":  # "True"/"False" from Python's csv, 1/0 or true/false by hand
            df[col] = pd.Series(rf.parse_bools(df[col].tolist()), index=df.index, dtype=bool)
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


def load_run(path: str | Path) -> Run:
    """Load a run directory; raises RunLoadError naming the missing/truncated/foreign file."""
    p = Path(path)
    if not p.is_dir():
        raise RunLoadError(f"run directory not found: {p}")
    meta = _read_meta(p)
    tables = {t: _read_csv(p, t) for t in COLUMNS}
    return Run(path=p, meta=meta, jobs=_jobs_frame(meta), **tables)


def _join(values: "pd.Series") -> str:
    vals = sorted({v for v in values.dropna().tolist()}, key=lambda v: (str(type(v)), v))
    return ",".join(str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in vals)


def run_row(run: Run) -> dict:
    """The list_runs row of one loaded run."""
    m, env, cfg = run.meta, run.meta.get("environment") or {}, run.meta.get("config") or {}
    jobs = run.jobs
    device = env.get("device") or ",".join(map(str, env.get("devices") or []))
    return {"run_id": m.get("run_id", run.path.name), "path": str(run.path), "created": m.get("created"),
            "finished": m.get("finished"), "status": m.get("status"), "model": cfg.get("model"),
            "size": cfg.get("size"), "variants": _join(jobs["variant"]), "world_sizes": _join(jobs["world_size"]),
            "backend": env.get("backend"), "device": device, "kinds": _join(jobs["kind"]),
            "oversubscribed": bool(env.get("oversubscribed")) or bool(jobs["oversubscribed"].fillna(False).any())}


def list_runs(root: str | Path = "profiles",
              loader: "Callable[[Path], Run] | None" = None) -> tuple[pd.DataFrame, list[str]]:
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
        if not d.is_dir() or d.name.startswith((".", "_")):
            continue
        try:
            rows.append(run_row(loader(d)))
        except RunLoadError as exc:
            warnings.append(str(exc))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            warnings.append(f"cannot load run {d}: {exc}")
    df = pd.DataFrame(rows, columns=RUN_COLUMNS)
    if not df.empty:
        df = df.assign(_k=df["created"].fillna("").astype(str)).sort_values(
            ["_k", "run_id"], ascending=False).drop(columns="_k").reset_index(drop=True)
    return df, warnings
