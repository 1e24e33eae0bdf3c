"""What a run claims, checked against what its tables hold: damaged content is named, not averaged.

Why: a run folder is plain JSON and CSV that anyone can edit, and a copy can be damaged. Without
these checks a duplicated steps.csv doubled a job's throughput, a negative step time was shown as
one, a rank with no rows gave 100 % overlap, an ``inf`` step gave throughput 0 and a job id listed
twice in run.json showed every row twice, all with exit 0. Each check below returns the table
it can still trust (the rows that hold) and one line per problem naming the file, the job and
what does not hold; :func:`dpcore.read.rundir.load.load_run` puts the lines in ``Run.warnings``,
which every command prints and every dashboard page shows.

What holds for a run dpcore wrote: each job id once in run.json, with a world size that is a
whole number of ranks (1 .. :data:`MAX_WORLD`; 10**15 or 0 is ignored, named, never used in a
number: it once doubled a job's bus bytes silently); one steps.csv row per
(job, rank, step); durations finite and not negative; every rank of a complete job (0 ..
world_size-1, rank 0 alone for a one-process variant) has rows, and the same steps.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.contract import runformat as rf
from dpcore.contract.config import SINGLE_PROCESS

#: steps.csv durations that must be finite and >= 0 where present (empty = unknown is allowed,
#: but not for the step time itself).
DURATIONS = ("step_ms", "fwd_ms", "bwd_ms", "sync_ms", "opt_ms", "comm_ms")
_SHOWN = 3  # jobs or lines named per problem before "..."
#: the largest world size believed (:data:`dpcore.contract.flightrec.MAX_RANKS`): above any job
#: run so far; a larger one is a doctored or damaged field
MAX_WORLD = 1 << 20


def _some(items: list, n: int = _SHOWN) -> str:
    return ", ".join(map(str, items[:n])) + (" ..." if len(items) > n else "")


def unique_jobs(jobs: pd.DataFrame, f: Path) -> tuple[pd.DataFrame, list[str]]:
    """Jobs listed more than once in run.json: the first entry kept, the ids named."""
    dup = jobs["job_id"].duplicated(keep="first") & jobs["job_id"].notna()
    if not dup.any():
        return jobs, []
    ids = jobs.loc[dup, "job_id"].drop_duplicates().tolist()
    return (jobs[~dup].reset_index(drop=True),
            [f"{f}: job id{'s' if len(ids) > 1 else ''} {_some(ids)} listed more than once; the first entry is used"])


def valid_world_sizes(jobs: pd.DataFrame, f: Path) -> tuple[pd.DataFrame, list[str]]:
    """Jobs whose ``world_size`` is not a whole number 1 .. :data:`MAX_WORLD`: the field is
    ignored (None: unknown) and the jobs named, so no number is computed from a world of 0 or
    of 10**15."""
    if jobs.empty or "world_size" not in jobs:
        return jobs, []
    raw = jobs["world_size"]
    ws = pd.to_numeric(raw.where(raw.map(lambda v: not isinstance(v, bool))), errors="coerce")
    ok = ws.notna() & (ws >= 1) & (ws <= MAX_WORLD) & (ws == ws.round())
    bad = raw.notna() & ~ok
    if not bad.any():
        return jobs, []
    ids = jobs.loc[bad, "job_id"].astype(str).tolist()
    vals = raw[bad].tolist()
    jobs = jobs.copy()
    jobs["world_size"] = jobs["world_size"].astype(object).where(~bad, None)
    return jobs, [f"{f}: job{'s' if len(ids) > 1 else ''} {_some(ids)}: world size {_some(vals)} is not a "
                  f"whole number of ranks 1 .. {MAX_WORLD}; ignored (unknown), no number uses it"]


def valid_durations(steps: pd.DataFrame, f: Path) -> tuple[pd.DataFrame, list[str]]:
    """Rows with a negative or infinite duration, or no (or a zero) step time, dropped and named
    by line: a step takes time, and one impossible row would otherwise move every mean."""
    if steps.empty:
        return steps, []
    bad = pd.Series(False, index=steps.index)
    for col in DURATIONS:
        v = pd.to_numeric(steps[col], errors="coerce").to_numpy(dtype=float)
        wrong = np.isinf(v) | (v < 0) | ((np.isnan(v) | (v == 0)) if col == "step_ms" else False)
        bad |= pd.Series(wrong, index=steps.index)
    if not bad.any():
        return steps, []
    jobs = steps.loc[bad, "job_id"].astype(str).drop_duplicates().tolist()
    lines = (steps.index[bad] + 2).tolist()  # the header is line 1
    return (steps[~bad].reset_index(drop=True),
            [f"{f}: {int(bad.sum())} row(s) with a negative, infinite or missing duration (or a step time "
             f"of 0) skipped "
             f"(job {_some(jobs)}; line {_some(lines, 5)})"])


#: The key a row of each table is the only one of: a copy-paste or a concatenated file would
#: otherwise count every step (throughput x2) or every collective (bytes x2) twice.
KEYS = {"steps": ("job_id", "rank", "step"), "collectives": ("job_id", "rank", "step", "seq")}


def unique_rows(df: pd.DataFrame, key: tuple[str, ...], f: Path) -> tuple[pd.DataFrame, list[str]]:
    """Rows that repeat ``key``: the first kept, the jobs named."""
    if df.empty:
        return df, []
    dup = df.duplicated(list(key), keep="first")
    if not dup.any():
        return df, []
    jobs = df.loc[dup, "job_id"].astype(str).drop_duplicates().tolist()
    return (df[~dup].reset_index(drop=True),
            [f"{f}: {int(dup.sum())} duplicate row(s) of one ({', '.join(k.removesuffix('_id') for k in key)}) "
             f"skipped, the first kept (job {_some(jobs)})"])


def _expected_ranks(job: pd.Series, imported: bool = False) -> list[int] | None:
    """The ranks a job's rows should cover: every rank of its world, or for an imported job the
    ranks whose traces were imported (run.json's ``ranks``: one rank of an 8-rank job is a
    world of 8 with one rank's rows, as the import's note says)."""
    ranks = job.get("ranks")
    if imported and isinstance(ranks, list) and ranks and all(isinstance(r, int) for r in ranks):
        return sorted(ranks)
    ws = pd.to_numeric(pd.Series([job.get("world_size")]), errors="coerce").iloc[0]
    if pd.isna(ws) or not 0 < ws <= 1 << 16 or ws != int(ws):
        return None
    return [0] if job.get("variant") in SINGLE_PROCESS else list(range(int(ws)))


def complete_ranks(steps: pd.DataFrame, jobs: pd.DataFrame, f: Path, imported: bool = False) -> list[str]:
    """Complete jobs whose steps.csv rows lack a rank, or whose ranks have different steps:
    their numbers then cover only some ranks or steps, and the line says which."""
    out: list[str] = []
    if jobs.empty:
        return out
    by_job = {str(k): g for k, g in steps.groupby(steps["job_id"].astype(str), sort=False)} \
        if not steps.empty else {}
    empty = [str(j["job_id"]) for _, j in jobs.iterrows() if j.get("status") == "complete"
             and j.get("kind") in ("train", None) and str(j["job_id"]) not in by_job]
    if empty:  # complete, yet not one timed step: every number of theirs would be "unknown"
        out.append(f"{f}: {len(empty)} complete training job(s) have no rows ({_some(empty)}); "
                   "their step numbers are unknown (the table holds no data for them)")
    for _, job in jobs.iterrows():
        rows = by_job.get(str(job["job_id"]))
        expected = _expected_ranks(job, imported)
        if rows is None or expected is None or job.get("status") not in ("complete", None):
            continue
        have = set(pd.to_numeric(rows["rank"], errors="coerce").dropna().astype(int))
        missing = [r for r in expected if r not in have]
        extra = sorted(r for r in have if r not in expected)
        if missing or extra:
            out.append(f"{f}: job {job['job_id']} ran {len(expected)} rank(s) but has rows for rank(s) "
                       f"{_some(sorted(have), 8)}" + (f" (missing: {_some(missing, 8)})" if missing else "")
                       + (f" (not of this job: {_some(extra, 8)})" if extra else "")
                       + f"; its numbers cover rank(s) {_some(sorted(have & set(expected)), 8) or 'none'} only")
            continue
        counts = rows.groupby("rank")["step"].apply(lambda s: frozenset(s.tolist()))
        if counts.nunique() > 1:
            sizes = ", ".join(f"rank {r}: {len(s)}" for r, s in counts.items())
            out.append(f"{f}: job {job['job_id']}: its ranks recorded different steps ({sizes} steps)")
    return out


def check_content(run_dir: Path, jobs: pd.DataFrame, tables: dict[str, pd.DataFrame], imported: bool = False
                  ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], list[str]]:
    """(jobs, tables, warnings): every check above, on a loaded run's tables (returned with the
    rows that hold). ``imported``: the run is an ``import``, whose jobs' rows cover the ranks
    imported (run.json's ``ranks``), not every rank of the world the traces name."""
    jobs, out = unique_jobs(jobs, run_dir / rf.RUN_JSON)
    jobs, w = valid_world_sizes(jobs, run_dir / rf.RUN_JSON)
    out += w
    tables = dict(tables)
    f = run_dir / rf.table_file("steps")
    tables["steps"], w = valid_durations(tables["steps"], f)
    out += w
    for table, key in KEYS.items():
        tables[table], w = unique_rows(tables[table], key, run_dir / rf.table_file(table))
        out += w
    return jobs, tables, [*out, *complete_ranks(tables["steps"], jobs, f, imported)]
