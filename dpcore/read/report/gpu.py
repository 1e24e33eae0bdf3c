"""What ``python -m dpcore gpu PATH [--csv] [--per-step] [--kernels]`` prints: the GPU time ledger
per rank with its step MFU, GEMM efficiency and FLOPs coverage, or (``--kernels``) its GPU time by
kernel class with each math class's TFLOP/s and efficiency.

The numbers are :func:`dpcore.read.analysis.gpu_time.gpu_ledger`'s, read through the rank cache
(the lazy ``gpu`` tables), rated by :mod:`dpcore.read.analysis.gpu_flops` (TF32 where the run's
run.json records it), and :func:`dpcore.read.analysis.gpu_kernels.kernel_rows`'; this module only
loads PATH and lays the rows out.
"""
from __future__ import annotations

import sys

import pandas as pd

from dpcore.contract.options import GpuOptions
from dpcore.contract.units import percent_number
from dpcore.read.analysis.advice import advice
from dpcore.read.analysis.comm import CALL_COLUMNS, call_bandwidth
from dpcore.read.analysis.gpu_flops import (
    EFFICIENCY_COLUMNS,
    efficiency_text,
    rank_efficiency,
    run_tf32,
    with_efficiency,
)
from dpcore.read.analysis.gpu_kernels import KERNEL_CSV_COLUMNS, fp32_matmul_note, kernel_rows
from dpcore.read.analysis.gpu_time import LEDGER_COLUMNS, TRACE_STEP
from dpcore.read.analysis.stragglers import call_transfer_wait
from dpcore.read.importer.rows import IMPORT_COMM
from dpcore.read.ranks import Scale
from dpcore.read.report.resolve import load_run_reporting, resolve, scale_of, warn
from dpcore.read.report.table_text import csv_table, text_table
from dpcore.read.tables import folder_gpu, folder_tables, job_rank_tables, run_gpu
from dpcore.read.traces.reader import TraceFormatError

#: docs/DESIGN.md's columns of `gpu --csv`: the ledger with its FLOPs, then step MFU, GEMM efficiency and
#: FLOPs coverage of each window.
GPU_COLUMNS = ["job_id", *LEDGER_COLUMNS, *EFFICIENCY_COLUMNS]
#: docs/DESIGN.md's columns of `gpu --kernels --csv` (tflops and eff_pct empty where FLOPs are unknown).
KERNEL_COLUMNS = ["job_id", *KERNEL_CSV_COLUMNS]
#: `gpu --collectives --csv`'s columns: one row per collective call.
COLLECTIVE_COLUMNS = ["job_id", *CALL_COLUMNS, "transfer_ms", "wait_ms"]
#: How many host causes the text lists per rank.
TOP_CAUSES = 5
_TEXT_COLUMNS = {"step": "step", "span_ms": "span_ms", "compute_ms": "compute", "non_compute_ms": "non_compute",
                 "comm_ms": "comm", "exposed_comm_ms": "exposed_comm", "memory_ms": "memory", "idle_ms": "idle",
                 "idle_host_ms": "idle_host", "idle_device_ms": "idle_device", "idle_pct": "idle_%",
                 "compute_pct": "compute_%", "non_compute_pct": "non_compute_%", "host_bound": "host_bound",
                 "step_mfu_pct": "mfu_%", "flops_coverage_pct": "flops_cov_%"}
_NOTE = ("ms of the window; span = compute + non_compute + idle. compute = time any compute kernel runs; "
         "non_compute = the rest of the busy time (communication, memory copies and sets not under compute); "
         "exposed_comm = communication not under compute. idle = no GPU event on any stream: host = the next "
         "event was launched after the gap began (the CPU was late), device = it was queued in time. "
         "host_bound: host idle over half the span. Window `trace`: first GPU event start to last end; "
         "a step (--per-step): the GPU events launched inside ProfilerStep#k. mfu_% (step MFU) = the window's "
         "model FLOPs (matrix products, attention, convolutions from the recorded shapes) / (its span × the "
         "GPU's dense peak for each dtype, peaks.csv); flops_cov_% = the share of compute-kernel time whose "
         "FLOPs are known: MFU counts only that part. GEMM efficiency = the GEMM kernels' FLOPs / their own "
         "time × peak: how well the matrix kernels ran, not how busy the GPU was. Attention counts half where "
         "the trace records the call's is_causal (Concrete Inputs), else unmasked: for a causal model without "
         "them its FLOPs and the MFU are an upper bound (at most 2x). GPU events with a negative duration and "
         "calls whose FLOPs would exceed the peak are set aside and counted.")


def load_gpu(path: str, scale: Scale | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, bool]:
    """(ledger, causes, kernel counts, tf32) with job_id of PATH: a run directory (every traced job), a job's
    traces folder, any folder of traces or one trace; tf32: the run records TF32 allowed (traces alone: no).
    Reader notes and run problems go to stderr. ValueError (one line) where PATH holds no GPU events."""
    p, kind = resolve(path)
    tf32 = False
    if kind == "run":
        problems: list[str] = []
        run = load_run_reporting(p)
        tf32 = run_tf32(run.meta)
        ledger, causes, kernels = run_gpu(run, scale, problems)
        warn(problems)
    else:
        try:
            ledger, causes, kernels, notes = folder_gpu(p, scale)
        except TraceFormatError as exc:
            raise ValueError(str(exc)) from None
        for n in notes:
            print(f"note: {n}", file=sys.stderr)
    if ledger.empty:
        raise ValueError(f"no GPU events (kernels, memory copies or sets) in the traces at {p}: the gpu command "
                         "reads traces recorded on a GPU; for a CPU run use analyze or summarize")
    return ledger, causes, kernels, tf32


def gpu_text(path: str, csv: bool = False, per_step: bool = False, scale: Scale | None = None,
             kernels: bool = False) -> str:
    """The GPU time ledger of every rank at PATH: the ``trace`` window, and each traced step with
    ``per_step``; CSV rows are GPU_COLUMNS (one per job, rank and window). ``kernels``: the GPU
    time by kernel class instead (KERNEL_COLUMNS). Raises ValueError (RunLoadError for a broken
    run) with a one-line message."""
    loaded = load_gpu(path, scale)
    return _kernels_text(loaded, csv) if kernels else _ledger_text(loaded, csv, per_step)


def _ledger_text(loaded: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, bool], csv: bool, per_step: bool) -> str:
    """The ledger of :func:`load_gpu`'s tables (see :func:`gpu_text`)."""
    ledger, causes, _, tf32 = loaded
    headline = rank_efficiency(ledger, tf32)
    ledger = with_efficiency(ledger, tf32)
    if not per_step:
        ledger = ledger[ledger["step"] == TRACE_STEP]
    if csv:
        return csv_table(ledger[GPU_COLUMNS])
    parts = []
    for (job_id, rank), df in ledger.groupby(["job_id", "rank"], sort=False):
        view = df[list(_TEXT_COLUMNS)].rename(columns=_TEXT_COLUMNS)
        view["step"] = ["trace" if s == TRACE_STEP else str(s) for s in df["step"]]
        pct = {c: percent_number for c in ("idle_%", "compute_%", "non_compute_%", "mfu_%", "flops_cov_%")}
        lines = [f"{job_id} rank {rank}  (ms)", text_table(view, formatters=pct)]
        mine = causes[(causes["job_id"] == job_id) & (causes["rank"] == rank) & (causes["step"] == TRACE_STEP)]
        if len(mine):
            top = ", ".join(f"{c} {ms:.2f} ms" for c, ms in zip(mine["cause"].head(TOP_CAUSES),
                                                               mine["idle_ms"].head(TOP_CAUSES)))
            lines.append(f"host idle by cause (what the CPU was in while the GPU waited): {top}")
        eff = headline[(headline["job_id"] == job_id) & (headline["rank"] == rank)]
        if len(eff):
            lines.append(f"efficiency: {efficiency_text(eff.iloc[0], tf32)}")
        tip = advice(df[df["step"] == TRACE_STEP].iloc[0])
        if tip:
            lines.append(f"recommendation: {tip}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + f"\n\n{_NOTE}\n"


def _kernels_text(loaded: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, bool], csv: bool) -> str:
    """`gpu --kernels` of :func:`load_gpu`'s tables: per rank the GPU time by kernel class
    (:func:`kernel_rows`' rows) with the math classes' achieved TFLOP/s and efficiency over the
    calls whose FLOPs are known (flops_calls of calls), and the fp32-GEMM line where it applies."""
    classes = kernel_rows(loaded[2], loaded[3])
    if csv:
        return csv_table(classes[KERNEL_COLUMNS])
    parts = []
    for (job_id, rank), df in classes.groupby(["job_id", "rank"], sort=False):
        device = str(df["device"].iloc[0]) or "device not named in the trace"
        cols = ["kernel_class", "dtype", "calls", "flops_calls", "total_ms", "share_pct", "tflops", "eff_pct"]
        lines = [f"{job_id} rank {rank}  ({device})",
                 text_table(df[cols].rename(columns={"share_pct": "share_%", "eff_pct": "eff_%",
                                                      "flops_calls": "calls_w_flops"}),
                            formatters={"share_%": percent_number, "eff_%": percent_number})]
        note = fp32_matmul_note(df)
        if note:
            lines.append(f"note: {note}")
        aside = int(df["set_aside"].sum())
        if aside:
            lines.append(f"note: {aside} calls set aside: their FLOPs would exceed the GPU's peak (the shapes "
                         "cannot be the work done); they count in time, not in FLOPs")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + ("\n\ntotal_ms: sum of the kernels' durations (streams overlap, so it can exceed "
                                  "the span); share_%: of all GPU event time of the rank; dtype: as the kernel's name "
                                  "states it, else its op's inputs'. tflops = the FLOPs of the row's calls_w_flops "
                                  "calls (of its calls: those launched under a matrix product, attention or "
                                  "convolution with recorded shapes) / their kernel time; eff_% = tflops / the GPU's "
                                  "dense peak for the dtype (peaks.csv, datasheet per row; fp32 GEMMs whose kernel "
                                  "names no dtype rated as TF32 where the run records tf32): the kernels' efficiency, "
                                  "not MFU (see `gpu` without --kernels); empty for other classes, where the trace "
                                  "has no shapes (record_shapes) or the GPU is not in the table.\n")


def collectives_text(path: str, csv: bool = False, scale: Scale | None = None) -> str:
    """`gpu --collectives`: every collective call of every rank at PATH (a run, or one job's
    traces folder or trace) with its bytes, time, algbw and busbw (COLLECTIVE_COLUMNS); the text
    sums them per (job, rank, op). ValueError (one line) where PATH holds no collective call."""
    p, kind = resolve(path)
    if kind == "run":
        problems: list[str] = []
        pairs = list(job_rank_tables(load_run_reporting(p), scale, (IMPORT_COMM,), problems))
        warn(problems)
    else:
        try:
            pairs = [(p.name, folder_tables(p, scale, need=(IMPORT_COMM,)))]
        except TraceFormatError as exc:
            raise ValueError(str(exc)) from None
    frames = [call_bandwidth(t[IMPORT_COMM], t.world_size).assign(job_id=job) for job, tables in pairs for t in tables
              if len(t[IMPORT_COMM])]
    if not frames:
        raise ValueError(f"no collective calls in the traces at {p}")
    calls = call_transfer_wait(pd.concat(frames, ignore_index=True))[COLLECTIVE_COLUMNS]
    if csv:
        return csv_table(calls)
    g = calls.groupby(["job_id", "rank", "op"], sort=False)
    per = g.agg(calls=("seq", "size"), bytes=("bytes", lambda b: b.sum(min_count=1)), time_ms=("time_ms", "sum"),
                algbw_gbps=("algbw_gbps", "median"), busbw_gbps=("busbw_gbps", "median"),
                transfer_ms=("transfer_ms", lambda t: t.sum(min_count=1)),
                wait_ms=("wait_ms", lambda w: w.sum(min_count=1))).reset_index()
    return (text_table(per) + "\n\nper (job, rank, collective): calls, Σ bytes (where the trace's collective "
            "metadata gives them), Σ kernel time, median algbw = bytes / time and busbw = algbw x nccl-tests' "
            "factor (all-reduce 2(N-1)/N, all-gather and reduce-scatter (N-1)/N, broadcast 1) per call, GB/s. "
            "transfer / wait: each call matched across the job's ranks (the n-th of a step), transfer = its "
            "shortest time over the ranks, wait = the rest (time spent waiting for a late peer); Σ over the "
            "matched calls, empty for a job of one rank. --csv: one row per call.\n")


def gpu_tables(path: str, csv: bool = False, per_step: bool = False, kernels: bool = False,
               collectives: bool = False, scale: Scale | None = None) -> str:
    """`gpu`'s output for its switches together: the ledger (per step with ``per_step``), the
    kernel classes and the collectives, each that was asked for, in that order; a path without
    collective calls gives one line for that table, not an error instead of the others. One
    table alone, or ``csv``, is :func:`gpu_text` or :func:`collectives_text` as before."""
    alone = not collectives and not (per_step and kernels)
    if csv or alone:
        return (collectives_text(path, csv=csv, scale=scale) if collectives
                else gpu_text(path, csv=csv, per_step=per_step, scale=scale, kernels=kernels))
    if not (per_step or kernels):
        return collectives_text(path, scale=scale)
    loaded = load_gpu(path, scale)  # one read serves the ledger and the kernel classes
    parts = ([_ledger_text(loaded, csv=False, per_step=True)] if per_step else []) + (
        [_kernels_text(loaded, csv=False)] if kernels else [])
    if collectives:
        try:
            parts.append(collectives_text(path, scale=scale))
        except ValueError as exc:
            parts.append(f"collectives: {exc}")
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def gpu_command(options: GpuOptions) -> str:
    """The ``gpu`` command: exactly what it prints (the text ends in one newline; a CSV as is)."""
    out = gpu_tables(options.path, csv=options.csv, per_step=options.per_step, kernels=options.kernels,
                     collectives=options.collectives, scale=scale_of(options))
    return out if options.csv else out.rstrip("\n") + "\n"
