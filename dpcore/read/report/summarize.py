"""What ``python -m dpcore summarize RUN [--csv]`` prints (the per-job table of a run), and the
table ``profile`` prints when its run ends.

The numbers are :func:`dpcore.read.analysis.summary.job_summary`'s, the dashboard's; this
module loads the run and its traces, picks docs/DESIGN.md's columns and lays them out.
"""
from __future__ import annotations

import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pandas as pd

from dpcore.contract.options import SummarizeOptions
from dpcore.contract.runformat import is_stale
from dpcore.contract.units import EMPTY, number, percent, percent_number
from dpcore.read.analysis.comm_hooks import compression
from dpcore.read.analysis.gpu_flops import run_tf32
from dpcore.read.analysis.gpu_time import job_gpu
from dpcore.read.analysis.memory import summary_memory_columns, summary_volume_columns
from dpcore.read.analysis.metrics import INFLATION_LIMIT, NOISY_SPREAD, SOURCE_GAP_POINTS
from dpcore.read.analysis.summary import gpu_job_ids, job_summary, shared_gpu_line
from dpcore.read.ranks import Scale
from dpcore.read.report.allreduce import allreduce_text
from dpcore.read.report.analyze import COMPUTE_NOTE
from dpcore.read.report.resolve import load_run_reporting, refuse_empty, scale_of, trace_steps_reporting, warn
from dpcore.read.report.table_text import csv_table, text_table
from dpcore.read.rundir.load import Run
from dpcore.read.tables import run_steps_gpu

#: docs/DESIGN.md's columns of `summarize --csv` first, then the spread, the sources and their gap.
SUMMARIZE_COLUMNS = ["job_id", "variant", "world_size", "bucket_mb", "step_ms", "step_ms_p10", "step_ms_p90",
                     "comm_ms", "exposed_comm_ms", "overlap_pct", "noisy", "status", "step_ms_p50",
                     "comm_source", "comm_steps", "overlap_pct_trace", "overlap_pct_intervals", "overlap_gap",
                     "sources_disagree", "compute_ms", "comm_fraction", "throughput", "oversubscribed"]
_SUMMARY_VIEW = ["job_id", "status", "step_ms", "step_ms_p10", "step_ms_p90", "noisy", "compute_ms", "comm_ms",
                 "exposed_comm_ms", "overlap_pct", "comm_source", "overlap_gap", "comm_fraction", "throughput"]


def run_job_summary(run: Run, scale: Scale | None = None) -> pd.DataFrame:
    """:func:`job_summary` of a loaded run, its traces' per-rank tables read here (from the cache
    beside the run, :mod:`dpcore.read.ranks`; jobs whose traces are missing or damaged named on
    stderr): the rows `summarize`, profile's end-of-run table and `whatif`'s measured cells show."""
    return job_summary(run, trace_steps_reporting(run, scale))


#: `summarize`'s columns after SUMMARIZE_COLUMNS: memory per rank, bus volume per step, the GPU
#: ledger's idle % and host-bound flag (docs/DESIGN.md "GPU time") and the profiler's inflation of
#: the traced steps, and whether the job's ranks shared GPUs (run.json's ``gpus_shared``: such a job
#: is no scaling point). Every run has all of them (empty where unknown), so the CSVs of several runs stack.
SUMMARIZE_EXTRA = ["param_mib", "grad_mib", "optim_mib", "peak_mib", "bus_mib_per_step",
                   "expected_bus_mib_per_step", "gpu_idle_pct", "host_bound", "trace_inflation", "gpus_shared",
                   "gpu_step_mfu_pct", "gemm_eff_pct", "flops_coverage_pct"]


def summary_table(run: Run, scale: Scale | None = None) -> pd.DataFrame:
    """`summarize`'s rows: job_summary with docs/DESIGN.md's column names, in SUMMARIZE_COLUMNS order,
    then MiB per rank (mean over ranks) of parameters, gradients, optimizer state and the peak
    (:func:`summary_memory_columns`; empty without memory.csv rows) and the bus MiB per rank per
    step measured and expected (:func:`summary_volume_columns`; empty without collectives):
    the same columns for every run; then the GPU ledger's idle % and host-bound flag per job
    (:func:`job_gpu`, empty for CPU jobs) and the trace inflation (:func:`job_metrics`)."""
    problems: list[str] = []
    steps, ledger = run_steps_gpu(run, scale, problems)  # one read of the traces for both
    warn(problems)
    gpu = job_gpu(ledger, run_tf32(run.meta))  # with step MFU, GEMM efficiency and FLOPs coverage
    full = job_summary(run, steps)
    s = full.rename(columns={"exposed_ms": "exposed_comm_ms"})[SUMMARIZE_COLUMNS]
    for extra in (summary_memory_columns(run.memory),
                  summary_volume_columns(run.collectives, run.jobs, run.memory, run.grads),
                  gpu, full[["job_id", "trace_inflation", "gpus_shared"]]):
        s = s.merge(extra, on="job_id", how="left")
    for c in SUMMARIZE_EXTRA:
        if c not in s:
            s[c] = float("nan")
    return s[SUMMARIZE_COLUMNS + SUMMARIZE_EXTRA]


def summarize(path: str, csv: bool = False, scale: Scale | None = None) -> str:
    """The per-job table of a run: T over the timed steps (median, p10, p90, noisy), C/E/overlap
    over the traced steps with their source and the gap between the two methods. A run with
    all-reduce benchmark jobs and no training job prints its bandwidth table instead."""
    refuse_empty(path, "a run directory")
    p = Path(path)
    run = load_run_reporting(p)
    s = summary_table(run, scale)
    notes = [f"note: {j.get('id')}: {n}" for j in run.meta.get("jobs", []) if isinstance(j, dict)
             for n in (j.get("notes") or [])]  # what an import's traces needed (no steps, no rank, ...)
    if csv:  # the notes go to stderr: stdout stays one CSV table
        for n in notes:
            print(n, file=sys.stderr)
        return csv_table(s)
    if s.empty and run.allreduce is not None and not run.allreduce.empty:
        return allreduce_text(path)
    if s.empty:
        return f"{run.meta.get('run_id', p.name)}: no train jobs\n"
    extra = [c for c in ("peak_mib", "bus_mib_per_step", "expected_bus_mib_per_step", "gpu_idle_pct", "host_bound",
                         "trace_inflation", "gpu_step_mfu_pct", "flops_coverage_pct") if s[c].notna().any()]
    view = s[_SUMMARY_VIEW + extra].assign(comm_fraction=100 * s["comm_fraction"])
    view = view.rename(columns={"overlap_pct": "overlap_%", "throughput": "samples/s", "comm_fraction": "comm_%",
                                                    "exposed_comm_ms": "exposed_ms", "comm_source": "source",
                                                    "overlap_gap": "gap_pts", "bus_mib_per_step": "bus_MiB",
                                                    "expected_bus_mib_per_step": "expected_MiB",
                                                    "gpu_idle_pct": "gpu_idle_%", "trace_inflation": "inflation",
                                                    "gpu_step_mfu_pct": "step_mfu_%",
                                                    "flops_coverage_pct": "flops_cov_%"})
    status = "stale" if is_stale(run.meta) else run.meta.get("status", "?")  # the dashboard's word
    # one decimal, as the dashboard; samples/s whole, as the Overview and profile's end table
    pct = {c: percent_number for c in ("overlap_%", "comm_%", "gpu_idle_%", "step_mfu_%", "flops_cov_%")} | \
        {"samples/s": samples_text}
    lines = [f"{run.meta.get('run_id', p.name)} ({status})", text_table(view, formatters=pct), "",
             "step_ms: median (p10, p90) over the timed steps and ranks; noisy: p90/p10 > "
             f"{NOISY_SPREAD:g}. compute/comm/exposed: ms of that T, split by each part's share of the "
             "traced steps (Σ part / Σ step time, mean over ranks), so compute + exposed <= T; "
             "comm_% = exposed / T in percent. Measured from the trace (source=trace) or the recorded "
             "collectives and communication calls (source=intervals); gap_pts = trace - intervals "
             f"overlap on the same steps (|gap| > {SOURCE_GAP_POINTS:g} points: the two methods disagree). "
             + COMPUTE_NOTE
             + (" peak_mib: peak memory per rank (MiB, mean over ranks; memory.csv)." if "peak_mib" in s else "")
             + (" bus_MiB: Σ bytes · bus factor of the collectives per rank per step; expected_MiB: what the "
                "variant's algorithm should move (docs/metrics.md, 'Memory and communication volume')."
                if "bus_mib_per_step" in s else "")
             + (" gpu_idle_%: the GPU's idle share over its traces (mean over ranks; `gpu` has the ledger); "
                "host_bound: the GPU waited for the CPU over half of it." if "gpu_idle_%" in view else "")
             + (" step_mfu_%: model FLOPs / (traced step time × the GPU's dense peak), the job's ranks and steps "
                "pooled; flops_cov_%: the share of compute-kernel time whose FLOPs are known (`gpu` has GEMM "
                "efficiency and the per-window numbers)." if "step_mfu_%" in view else "")
             + (f" inflation: median traced step / median timed step (> {INFLATION_LIMIT:g}: flagged)."
                if "inflation" in view else "")] \
        + inflation_lines(s, gpu_job_ids(run)) + shared_lines(s) + compression_lines(run, s) + notes
    return "\n".join(lines) + "\n"


def inflation_lines(summary: pd.DataFrame, gpu_jobs: Collection[str]) -> list[str]:
    """One line per job the profiler inflated (trace_inflation > INFLATION_LIMIT) that ran on a GPU
    (``gpu_jobs``, :func:`gpu_job_ids`): its traced steps' shares do not describe its timed steps, so
    its T is split by the timed phases; one line for all such CPU jobs (they keep the traced shares)."""
    bad = summary[summary["trace_inflation"] > INFLATION_LIMIT]
    gpu = bad[bad["job_id"].isin(list(gpu_jobs))]
    out = [f"note: {r.job_id}: its traced steps take {r.trace_inflation * r.step_ms:.1f} ms (median) against "
           f"{r.step_ms:.1f} ms timed (inflation {r.trace_inflation:.2f} > {INFLATION_LIMIT:g}): the profiler made "
           "the step host-bound on the GPU, so its traced shares do not describe the timed steps; compute/comm/"
           "exposed are split by the timed steps' recorded phases and calls. Trust the timed step time."
           for r in gpu.itertuples()]
    if len(bad) > len(gpu):
        out.append(f"note: {len(bad) - len(gpu)} CPU job(s) traced over {INFLATION_LIMIT:g}x their timed steps "
                   "(inflation column): on CPU the profiler slows the operators it measures, so their "
                   "compute/comm/exposed keep the traced shares.")
    return out


def shared_lines(summary: pd.DataFrame) -> list[str]:
    """The ``note:`` line on jobs whose ranks shared GPUs (:func:`shared_gpu_line`), or none."""
    line = shared_gpu_line(summary)
    return [f"note: {line}."] if line else []


def samples_text(v: Any) -> str:
    """Throughput in whole samples/s with thousands separators ("104,148"), "—" when unknown."""
    return EMPTY if pd.isna(v) else f"{float(v):,.0f}"


def compression_lines(run: Run, summary: pd.DataFrame) -> list[str]:
    """One line per comm-hook job (``profile --comm-hook``), the Buckets page's Compression
    numbers: wire saved, step time added and the hook's own compute in it, the loss difference
    from the plain job. Empty for a run without hook jobs."""
    df = compression(run.jobs, summary, run.collectives)
    if df.empty:
        return []
    out = ["", "compression (DDP comm hooks vs the plain job; hook compute = compress + decompress ms per "
               "step, median over ranks and timed steps, without its collectives):"]
    for _, r in df.iterrows():
        if r["status"] != "complete":
            out.append(f"  {r['hook']:>8} {r['job_id']}: {r['status']}" + (f" - {r['reason']}" if r["reason"] else ""))
            continue
        out.append(f"  {r['hook']:>8} {r['job_id']}: wire {number(r['bytes_wire'] / 2**20, '.3f')} of "
                   f"{number(r['bytes_in'] / 2**20, '.3f')} MiB/step ({percent(r['saved_pct'])} saved), "
                   f"{number(r['collectives'], '.0f')} collectives/step, step {number(r['added_ms'], '+.2f')} ms, "
                   f"hook compute {number(r['compress_ms'], '.3f')} + {number(r['decompress_ms'], '.3f')} ms, "
                   f"loss after {number(r['loss_after_steps'], '.0f')} steps {number(r['loss'], '.7g')} "
                   f"(diff {number(r['loss_diff'], '+.3g')})")
    return out


def run_end_table(path: str) -> tuple[str, int]:
    """What ``profile`` prints when its run ends: the completed jobs' summary (median step time,
    comm fraction, overlap, throughput), then one line per failed, skipped or interrupted job
    and one per job note (what the job did not do that its options asked for).
    Returns the text and the number of failed jobs."""
    run = load_run_reporting(path)
    summary = run_job_summary(run)
    summary = summary[summary["status"] == "complete"]
    lines = []
    if summary.empty:
        lines.append("(no completed training jobs)")
    else:
        cols = {"job_id": "job", "step_ms": "step ms p50", "step_ms_p10": "p10", "step_ms_p90": "p90",
                "noisy": "noisy", "comm_fraction": "comm %", "overlap_pct": "overlap %",
                "throughput": "samples/s"}
        # percentages in percent, one decimal; samples/s whole (as on the dashboard's Overview)
        table = summary[list(cols)].assign(comm_fraction=100 * summary["comm_fraction"]).rename(columns=cols)
        lines.append(text_table(table, formatters={
            "comm %": percent, "overlap %": percent,
            "samples/s": samples_text}))
    failed = 0
    for job in run.meta.get("jobs", []):
        if job.get("status") in ("failed", "skipped", "interrupted"):
            failed += job.get("status") == "failed"
            why = (job.get("error") or job.get("skip_reason") or "").strip().splitlines()
            lines.append(f"{job['id']}: {job['status']}" + (f" - {why[0]}" if why else ""))
        if isinstance(job, dict) and isinstance(job.get("notes"), list):
            lines += [f"{job.get('id')}: note - {n}" for n in job["notes"] if isinstance(n, str)]
    return "\n".join(lines), failed


def summarize_command(options: SummarizeOptions) -> str:
    """The ``summarize`` command: exactly what it prints (the text with a blank line after it; a CSV as is)."""
    out = summarize(options.run, csv=options.csv, scale=scale_of(options))
    return out if options.csv else out + "\n"
