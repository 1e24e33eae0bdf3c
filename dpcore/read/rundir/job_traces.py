"""Which of a job's rank traces a read may use: the ranks that should have one, the ones missing,
and the one line per problem a caller collects (the readers are :mod:`dpcore.read.ranks`'s).

Why here and not in analysis: which files of a run are a job's rank traces and which steps they
cover is run-directory knowledge (:meth:`Run.trace_files`, :meth:`Run.traced_steps`).

Why all ranks or none: a job's trace numbers are means over its ranks, so a trace set that
lacks a rank (missing, truncated, unreadable, refused as hostile) would silently change them
(rank 0's trace removed from a 2-rank bucketed job took its overlap from 52 % to 5 %). Such a
job's traces are not used: its numbers come from the recorded intervals of every rank, and the
``problems`` list a caller passes gets one line naming the file and saying so.
"""
from __future__ import annotations

import pandas as pd

from dpcore.contract import runformat as rf
from dpcore.contract.config import SINGLE_PROCESS
from dpcore.read.rundir.load import Run

#: What a job whose rank traces are incomplete shows instead (appended to each problem line).
FALLBACK = "its overlap, comm and compute come from the recorded intervals of all ranks, not the traces"


def expected_trace_ranks(run: Run, job_id: str) -> list[int]:
    """The ranks that should have a trace: those steps.csv records profiled steps of, else the
    job's processes (0 .. world_size-1 from run.json; rank 0 alone for a one-process variant)."""
    st = run.steps
    mine = st[st["job_id"] == job_id]
    if "profiled" in mine and len(mine):
        ranks = pd.to_numeric(mine.loc[mine["profiled"].astype(bool), "rank"], errors="coerce").dropna()
        if len(ranks):
            return sorted({int(r) for r in ranks})
    job = run.jobs[run.jobs["job_id"] == job_id]
    ws = pd.to_numeric(job["world_size"], errors="coerce").iloc[0] if len(job) else float("nan")
    if pd.isna(ws) or not 0 < ws <= 1 << 16:
        return []
    return [0] if job["variant"].iloc[0] in SINGLE_PROCESS else list(range(int(ws)))


def missing_rank_traces(run: Run, job_id: str) -> list[int]:
    """The job's :func:`expected_trace_ranks` that have no rank trace file, when it has at least
    one (a job without any was not traced: nothing is missing)."""
    have = {int(k[4:]) for k in run.trace_files(job_id) if rf.is_rank_trace(k)}
    return [r for r in expected_trace_ranks(run, job_id) if r not in have] if have else []


def missing_traces_noted(run: Run, job_id: str, problems: list[str] | None) -> bool:
    """Whether the job lacks a rank's trace (:func:`missing_rank_traces`); if so, one line naming
    the files goes to ``problems``: its numbers then come from the recorded intervals."""
    missing = missing_rank_traces(run, job_id)
    if missing:
        names = ", ".join(str(rf.trace_dir(run.path, job_id) / rf.rank_trace_name(r)) for r in missing[:4])
        note_problem(problems, f"job {job_id}: no trace for rank{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(map(str, missing[:4]))}{' ...' if len(missing) > 4 else ''} "
                               f"({names} missing); {FALLBACK}")
    return bool(missing)


def untraced_noted(run: Run, job_id: str, problems: list[str] | None) -> None:
    """A job with no traced step whose steps.csv still marks profiled steps lost its traces: one
    line in ``problems`` saying so (its numbers come from the recorded intervals)."""
    if has_profiled_steps(run, job_id) and not run.rank_trace_files(job_id):
        note_problem(problems, f"job {job_id}: steps.csv marks profiled steps but "
                               f"{rf.trace_dir(run.path, job_id)} has no rank trace; {FALLBACK}")


def has_profiled_steps(run: Run, job_id: str) -> bool:
    st = run.steps
    return "profiled" in st and bool((st["profiled"].astype(bool) & (st["job_id"] == job_id)).any())


def note_problem(problems: list[str] | None, line: str) -> None:
    if problems is not None and line not in problems:
        problems.append(line)
