"""What ``python -m dpcore stragglers PATH [--csv]`` prints: per job and rank, how often the
rank arrived last at the collectives and how long it waited for the others, with one verdict
sentence per job and ``note:`` lines for what limits the comparison (a partial rank set,
point-to-point events left out, waits capped at the comm time).

The numbers are :mod:`dpcore.read.analysis.stragglers`' (the dashboard's Stragglers view's);
this module loads PATH (a run's collectives.csv, or a folder of traces), words the verdict and
lays the rows out.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpcore.contract.options import StragglersOptions
from dpcore.read.analysis.gpu_time import GPU_TABLE
from dpcore.read.analysis.stragglers import (
    KEY,
    arrival_notes_from_rows,
    collective_waits,
    partial_rank_note,
    rank_host_idle_pct,
    straggler_summary,
    straggler_verdict,
    stragglers_from_rows,
    wait_notes,
)
from dpcore.read.analysis.summary import gpu_job_ids
from dpcore.read.analysis.trace_arrivals import COMM_TABLE
from dpcore.read.ranks import Scale
from dpcore.read.report.resolve import PathKind, resolve, scale_of
from dpcore.read.report.table_text import csv_table, text_table
from dpcore.read.rundir.load import RunLoadError, load_run
from dpcore.read.tables import folder_tables, run_gpu
from dpcore.read.traces.reader import TraceFormatError


def _load(p: Path, kind: PathKind, scale: Scale | None = None) -> tuple[
        pd.DataFrame, dict[str, int], dict[str, int | None], dict[str, list[str]], pd.DataFrame]:
    """(waits, collectives dropped as unmatched per job, world size per job where known, notes per
    job, the GPU ledger of the jobs' traces with a job_id column, empty where none) of a run
    directory or a traces folder."""
    if kind == "run":
        try:
            run = load_run(p)
        except RunLoadError as exc:
            raise ValueError(str(exc)) from None
        coll = run.collectives
        if coll.empty:
            raise ValueError(f"run {p} has no collectives (collectives.csv is empty): nothing to match "
                             "across ranks")
        waits = collective_waits(coll)
        if waits.empty:
            raise ValueError(f"run {p} has no collective seen on 2 or more ranks of a job: nothing to match")
        seen = coll.drop_duplicates(KEY).groupby("job_id").size()
        matched = waits.drop_duplicates(KEY).groupby("job_id").size()
        jobs = run.jobs.drop_duplicates("job_id") if "job_id" in run.jobs else run.jobs
        sizes = pd.to_numeric(jobs.set_index("job_id")["world_size"], errors="coerce") \
            if {"job_id", "world_size"} <= set(jobs.columns) else pd.Series(dtype=float)
        world = {str(j): (int(sizes[j]) if j in sizes.index and pd.notna(sizes[j]) else None) for j in matched.index}
        notes = {}
        for j in matched.index:
            w = waits[waits["job_id"] == j]
            partial = partial_rank_note(int(w["rank"].nunique()), world[str(j)])
            notes[str(j)] = ([partial] if partial else []) + wait_notes(w)
        ledger = run_gpu(run, scale)[0] if set(gpu_job_ids(run)) & {str(j) for j in matched.index} \
            else pd.DataFrame(columns=["job_id", "rank", "window", "span_ms", "idle_host_ms"])
        return waits, {str(j): int(seen[j] - matched.get(j, 0)) for j in matched.index}, world, notes, ledger
    try:
        tables = folder_tables(p, scale, need=(COMM_TABLE, GPU_TABLE))  # a hit reads only these rows
    except TraceFormatError as exc:
        raise ValueError(f"expected a run directory (run.json) or a folder of torch.profiler traces: {exc}") from None
    ranks = sorted({t.rank for t in tables if t.events})
    sizes = [t.world_size for t in tables if t.world_size is not None]
    world_size = max(sizes) if sizes else None
    if len(ranks) < 2:
        raise ValueError(f"traces of one rank only in {p}: stragglers need the traces of 2 or more ranks")
    job = p.resolve().name
    rows = pd.concat([t[COMM_TABLE] for t in tables], ignore_index=True).assign(job_id=job)
    if rows.empty:
        raise ValueError(f"no comm events (NCCL kernels, gloo:* spans on a gloo thread) in the traces of {p}")
    found = arrival_notes_from_rows(rows, ranks, world_size)
    waits = stragglers_from_rows(rows, ranks)
    if waits.empty:
        why = "; ".join(found) or ("needs traces of 2 or more ranks with the same number of collectives per "
                                  "ProfilerStep")
        raise ValueError(f"no comm event of the traces in {p} could be matched across ranks: {why}")
    ledger = pd.concat([t[GPU_TABLE] for t in tables], ignore_index=True).assign(job_id=job)
    return waits, {}, {job: world_size}, {job: found + wait_notes(waits)}, ledger


def stragglers_text(path: str, csv: bool = False, scale: Scale | None = None) -> str:
    """What ``python -m dpcore stragglers PATH [--csv]`` prints: one row per (job, rank).

    PATH is a run directory (its collectives.csv, shared clock), a folder of per-rank
    torch.profiler traces searched recursively (its folder name is the job id) or one trace file
    (which holds one rank: an error that says so). The verdict may name a set of ranks
    (:func:`~dpcore.read.analysis.stragglers.straggler_set`) and weighs each named rank's GPU host
    idle where the traces are GPU traces. CSV columns: SUMMARY_COLUMNS, starting
    ``job_id, rank, collectives, last_arrival_pct, mean_wait_ms``. Text: per job a header, its
    warnings (``note:`` lines: a partial rank set, events not matched, capped waits), the table
    and :func:`straggler_verdict`. Raises ValueError with one line naming the path.
    """
    p, kind = resolve(path)
    waits, dropped, world, notes, ledger = _load(p, kind, scale)
    summary = straggler_summary(waits)
    if csv:
        return csv_table(summary)
    parts = []
    for job, rows in summary.groupby("job_id", sort=False):
        n = int(rows["collectives"].max())
        ops = ",".join(sorted({str(o) for o in waits.loc[waits["job_id"] == job, "op"].dropna()}))
        head = f"{job}: {n} collectives matched on {len(rows)} ranks" + (f" ({ops})" if len(ops) < 80 else "")
        if dropped.get(str(job)):
            head += f"; {dropped[str(job)]} seen on fewer ranks left out"
        head += "".join(f"\n  note: {note}" for note in notes.get(str(job), []))
        idle = rank_host_idle_pct(ledger[ledger["job_id"] == job]) if len(ledger) else None
        verdict = straggler_verdict(rows, world.get(str(job)), waits[waits["job_id"] == job], idle)
        shown = rows.drop(columns="job_id").assign(wait_fraction=100 * rows["wait_fraction"])  # percent, as the view
        parts.append(f"{head}\n{text_table(shown.rename(columns={'wait_fraction': 'wait_%'}))}\n  {verdict}")
    return "\n\n".join(parts) + "\n"


def stragglers_command(options: StragglersOptions) -> str:
    """The ``stragglers`` command: exactly what it prints (the text ends in one newline; a CSV
    without its last one, as it always printed)."""
    out = stragglers_text(options.path, csv=options.csv, scale=scale_of(options)).rstrip("\n")
    return out if options.csv else out + "\n"
