"""Text/CSV renderings behind `dpcore analyze` and `dpcore summarize` (the CLI only prints them).

The CLI and the dashboard show the same numbers because both call the same analysis functions.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from dpcore.contract.intervals import has_peers
from dpcore.contract.runformat import RUN_JSON
from dpcore.contract.units import EMPTY, binary_size
from dpcore.read.analysis.comm import allreduce_bandwidth
from dpcore.read.rundir.load import Run, RunLoadError, load_run
from dpcore.read.analysis.memory import summary_memory_columns, summary_volume_columns
from dpcore.read.analysis.metrics import (NOISY_SPREAD, SOURCE_GAP_POINTS, rank_metrics, step_metrics,
                                          trace_rows)
from dpcore.read.analysis.comm_overlap import overlap_from_trace
from dpcore.read.analysis.summary import job_summary
from dpcore.read.analysis.timeline import trace_step_metrics
from dpcore.read.traces.reader import TraceFormatError, read_trace_dir

#: DESIGN.md's columns of `analyze --csv` (ms per traced step), then how many steps they cover,
#: the mean step window they were measured in, and comm fraction = Σ exposed / Σ step_ms.
ANALYZE_COLUMNS = ["rank", "overlap_pct", "comm_ms", "exposed_comm_ms", "compute_ms", "steps", "step_ms",
                   "comm_fraction"]
#: What analyze's and summarize's numbers are, in one place (both print it; DESIGN.md's definitions).
COMPUTE_NOTE = ("compute = forward, backward and optimizer work of the rank's main thread (CPU: the time in "
                "dpcore's phases minus the time inside communication calls -- launching, a blocking "
                "collective, waiting; a foreign CPU trace: its main-thread operators; GPU: compute kernels). "
                "comm = union of the rank's collective intervals (none at world size 1: no peer). "
                "exposed = comm not under compute; overlap = overlapped / comm (HTA).")
#: DESIGN.md's columns of `summarize --csv` first, then the spread, the sources and their gap.
SUMMARIZE_COLUMNS = ["job_id", "variant", "world_size", "bucket_mb", "step_ms", "step_ms_p10", "step_ms_p90",
                     "comm_ms", "exposed_comm_ms", "overlap_pct", "noisy", "status", "step_ms_p50",
                     "comm_source", "comm_steps", "overlap_pct_trace", "overlap_pct_intervals", "overlap_gap",
                     "sources_disagree", "compute_ms", "comm_fraction", "throughput", "oversubscribed"]
_SUMMARY_VIEW = ["job_id", "status", "step_ms", "step_ms_p10", "step_ms_p90", "noisy", "compute_ms", "comm_ms",
                 "exposed_comm_ms", "overlap_pct", "comm_source", "overlap_gap", "comm_fraction", "throughput"]


def load_run_reporting(path: str | Path) -> Run:
    """:func:`load_run` for the CLI: what the loader worked around (rows with unreadable numbers
    it skipped) goes to stderr, one line each, so ``--csv`` output on stdout stays clean."""
    run = load_run(Path(path))
    for w in run.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return run


def _fmt(df: pd.DataFrame) -> str:
    return df.to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="-")


def _trace_folder_ranks(trace_dir: Path) -> pd.DataFrame:
    """Per rank over the ProfilerSteps of a folder of traces (the whole trace when it has none)."""
    try:
        rows = trace_rows(overlap_from_trace(read_trace_dir(trace_dir)))
    except TraceFormatError as exc:
        raise ValueError(str(exc)) from None
    return rank_metrics(rows, "trace")


_ANALYZE_NOTE = ("ms columns: means per traced step; step_ms: the step's window they were measured in (from "
                 "forward to the end of optimizer, the ProfilerStep of a foreign CPU trace, a GPU step's "
                 "kernels); comm_fraction = exposed / step_ms over those steps. " + COMPUTE_NOTE)


def analyze(path: str, csv: bool = False) -> str:
    """Per-rank overlap % (HTA definition), comm, exposed comm and compute, per traced step.

    PATH is a folder of per-rank torch.profiler traces (ours or foreign; searched recursively,
    see :func:`dpcore.read.traces.reader.trace_files`), one trace file, or a run directory; for
    a run directory every job with traces is analysed (on the steps steps.csv marks profiled:
    the rows `summarize` uses, so its overlap of a job is the mean over ranks of these) and CSV
    rows gain a leading job_id column. ms columns are means per step; ``steps`` says how many.
    Raises ValueError (RunLoadError for broken runs) with a one-line message.
    """
    p = Path(path)
    if not p.exists():
        raise ValueError(f"no such file or directory: {p}")
    if p.is_file() or not (p / RUN_JSON).exists():  # one trace file, or a folder of them (recursive)
        df = _trace_folder_ranks(p)
        if csv:
            return df.to_csv(index=False, columns=ANALYZE_COLUMNS, float_format="%.4f")
        return f"{p}  (ms per step)\n{_fmt(df[ANALYZE_COLUMNS])}\n\n{_ANALYZE_NOTE}\n"
    run = load_run_reporting(p)
    per = rank_metrics(step_metrics(run.steps, run.collectives, trace_step_metrics(run), run.comm_calls), "trace")
    if per.empty:
        raise RunLoadError(f"no rank traces in run {p} (traces/<job_id>/rank<r>.json.gz)")
    if csv:
        return per[["job_id"] + ANALYZE_COLUMNS].to_csv(index=False, float_format="%.4f")
    parts = []
    sizes = dict(zip(run.jobs["job_id"], run.jobs["world_size"]))
    for job_id, df in per.groupby("job_id", sort=False):
        note = ""
        if not has_peers(sizes.get(job_id)) and (run.collectives["job_id"] == job_id).any():
            note = "\n  (world size 1: no peer, so its collectives move nothing and are no communication)"
        elif (df["comm_ms"] <= 0).all() and (run.collectives["job_id"] == job_id).any():
            note = ("\n  (no comm in the trace: gloo runs the point-to-point transfers of the "
                    "from-scratch algorithms off the traced threads; `summarize` has this job's "
                    "comm from collectives.csv)")
        parts.append(f"{job_id}  (ms per traced step)\n{_fmt(df[ANALYZE_COLUMNS])}{note}")
    return "\n\n".join(parts) + f"\n\n{_ANALYZE_NOTE}\n"


#: `summarize`'s columns after SUMMARIZE_COLUMNS: memory per rank and bus volume per step. Every
#: run has all of them (empty where unknown), so the CSVs of several runs stack.
SUMMARIZE_EXTRA = ["param_mib", "grad_mib", "optim_mib", "peak_mib", "bus_mib_per_step",
                   "expected_bus_mib_per_step"]


def summary_table(run: "Run") -> pd.DataFrame:
    """`summarize`'s rows: job_summary with DESIGN's column names, in SUMMARIZE_COLUMNS order,
    then MiB per rank (mean over ranks) of parameters, gradients, optimizer state and the peak
    (:func:`summary_memory_columns`; empty without memory.csv rows) and the bus MiB per rank per
    step measured and expected (:func:`summary_volume_columns`; empty without collectives):
    the same columns for every run."""
    s = job_summary(run).rename(columns={"exposed_ms": "exposed_comm_ms"})[SUMMARIZE_COLUMNS]
    for extra in (summary_memory_columns(run.memory),
                  summary_volume_columns(run.collectives, run.jobs, run.memory, run.grads)):
        s = s.merge(extra, on="job_id", how="left")
    for c in SUMMARIZE_EXTRA:
        if c not in s:
            s[c] = float("nan")
    return s[SUMMARIZE_COLUMNS + SUMMARIZE_EXTRA]


#: The all-reduce table (`allreduce`, and `summarize` on an all-reduce run), nccl-tests' columns:
#: size, count (float32 elements), repeats, median time, algbw, busbw and #wrong.
ALLREDUCE_TABLE = ["algo", "ranks", "size", "bytes", "count", "repeats", "time_us", "algbw_GB/s", "busbw_GB/s",
                   "#wrong"]


def _wrong(jobs: pd.DataFrame) -> dict[tuple[str, int], object]:
    """{(job_id, bytes): wrong elements} from run.json's `wrong_elements` (absent: not checked)."""
    out: dict[tuple[str, int], object] = {}
    if "wrong_elements" not in jobs:
        return out
    for job, counts in zip(jobs["job_id"], jobs["wrong_elements"]):
        if isinstance(counts, dict):
            for nbytes, n in counts.items():
                try:
                    out[(str(job), int(nbytes))] = int(n)
                except (TypeError, ValueError):
                    continue
    return out


def allreduce_table(run: "Run") -> pd.DataFrame:
    """One row per (all-reduce job, size): the numbers of `allreduce_bandwidth` (the dashboard's)
    with the repeats and nccl-tests' #wrong (elements that differed from the exact sum in the
    checked call; None where the run did not check)."""
    ar = run.allreduce
    if ar is None or ar.empty:
        return pd.DataFrame(columns=ALLREDUCE_TABLE)
    order = {j: i for i, j in enumerate(dict.fromkeys(ar["job_id"]))}  # the run's order: as measured
    bw = allreduce_bandwidth(ar)
    bw = bw.assign(_o=bw["job_id"].map(order)).sort_values(["_o", "bytes"], kind="stable").reset_index(drop=True)
    reps = ar.drop_duplicates(["job_id", "bytes"]).set_index(["job_id", "bytes"])["repeats"]
    wrong = _wrong(run.jobs)
    keys = list(zip(bw["job_id"], bw["bytes"].astype(int)))
    return pd.DataFrame({
        "algo": bw["algo"], "ranks": bw["world_size"].astype(int), "size": [binary_size(b) for b in bw["bytes"]],
        "bytes": bw["bytes"].astype(int), "count": (bw["bytes"] // 4).astype(int),
        "repeats": [reps.get(k) for k in keys], "time_us": bw["time_ms"] * 1e3,
        "algbw_GB/s": bw["algbw_gbps"], "busbw_GB/s": bw["busbw_gbps"],
        "#wrong": [wrong.get((str(j), b)) for j, b in keys]})


def allreduce_text(path: str) -> str:
    """The all-reduce table of a run as text (what `allreduce` prints at the end, and `summarize`
    on an all-reduce run), with a line per job whose results were wrong."""
    run = load_run_reporting(path)
    t = allreduce_table(run)
    if t.empty:
        return f"{run.meta.get('run_id', Path(path).name)}: no all-reduce results\n"
    shown = t.assign(**{"#wrong": [EMPTY if w is None or w != w else str(int(w)) for w in t["#wrong"]]})
    text = shown.to_string(index=False, formatters={"time_us": "{:.1f}".format, "algbw_GB/s": "{:.3f}".format,
                                                    "busbw_GB/s": "{:.3f}".format}, na_rep=EMPTY)
    lines = [f"{run.meta.get('run_id', Path(path).name)} ({run.meta.get('status', '?')}): all-reduce, float32, "
             "sum; busbw = algbw * 2(N-1)/N (nccl-tests)", text, "",
             "time_us: median over the repeats of the slowest rank; #wrong: elements that differ from the exact "
             f"sum in one checked call, summed over ranks ({EMPTY}: not checked by this run)."]
    bad = t[pd.to_numeric(t["#wrong"], errors="coerce").fillna(0) > 0]
    for _, r in bad.iterrows():
        lines.append(f"WRONG RESULTS: {r['algo']} at {r['ranks']} ranks, {r['size']}: {int(r['#wrong'])} element(s)")
    return "\n".join(lines) + "\n"


def summarize(path: str, csv: bool = False) -> str:
    """The per-job table of a run: T over the timed steps (median, p10, p90, noisy), C/E/overlap
    over the traced steps with their source and the gap between the two methods. A run with
    all-reduce benchmark jobs and no training job prints its bandwidth table instead."""
    p = Path(path)
    run = load_run_reporting(p)
    s = summary_table(run)
    if csv:
        return s.to_csv(index=False, float_format="%.4f")
    if s.empty and run.allreduce is not None and not run.allreduce.empty:
        return allreduce_text(path)
    if s.empty:
        return f"{run.meta.get('run_id', p.name)}: no train jobs\n"
    extra = [c for c in ("peak_mib", "bus_mib_per_step", "expected_bus_mib_per_step") if s[c].notna().any()]
    view = s[_SUMMARY_VIEW + extra].rename(columns={"overlap_pct": "overlap_%", "throughput": "samples/s",
                                                    "exposed_comm_ms": "exposed_ms", "comm_source": "source",
                                                    "overlap_gap": "gap_pts", "bus_mib_per_step": "bus_MiB",
                                                    "expected_bus_mib_per_step": "expected_MiB"})
    lines = [f"{run.meta.get('run_id', p.name)} ({run.meta.get('status', '?')})", _fmt(view), "",
             "step_ms: median (p10, p90) over the timed steps and ranks; noisy: p90/p10 > "
             f"{NOISY_SPREAD:g}. compute/comm/exposed: ms of that T, split by each part's share of the "
             "traced steps (Σ part / Σ step time, mean over ranks), so compute + exposed <= T; "
             "comm_fraction = exposed / T. Measured from the trace (source=trace) or the recorded "
             "collectives and communication calls (source=intervals); gap_pts = trace - intervals "
             f"overlap on the same steps (|gap| > {SOURCE_GAP_POINTS:g} points: the two methods disagree). "
             + COMPUTE_NOTE
             + (" peak_mib: peak memory per rank (MiB, mean over ranks; memory.csv)." if "peak_mib" in s else "")
             + (" bus_MiB: Σ bytes · bus factor of the collectives per rank per step; expected_MiB: what the "
                "variant's algorithm should move (README 'Memory and communication volume')."
                if "bus_mib_per_step" in s else "")]
    return "\n".join(lines) + "\n"


def run_end_table(path: str) -> tuple[str, int]:
    """What ``profile`` prints when its run ends: the completed jobs' summary (median step time,
    comm fraction, overlap, throughput), then one line per failed, skipped or interrupted job.
    Returns the text and the number of failed jobs."""
    run = load_run_reporting(path)
    summary = job_summary(run)
    summary = summary[summary["status"] == "complete"]
    lines = []
    if summary.empty:
        lines.append("(no completed training jobs)")
    else:
        cols = {"job_id": "job", "step_ms": "step ms p50", "step_ms_p10": "p10", "step_ms_p90": "p90",
                "noisy": "noisy", "comm_fraction": "comm fraction", "overlap_pct": "overlap %",
                "throughput": "samples/s"}
        table = summary[list(cols)].rename(columns=cols)
        lines.append(table.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
    failed = 0
    for job in run.meta.get("jobs", []):
        if job.get("status") in ("failed", "skipped", "interrupted"):
            failed += job.get("status") == "failed"
            why = (job.get("error") or job.get("skip_reason") or "").strip().splitlines()
            lines.append(f"{job['id']}: {job['status']}" + (f" - {why[0]}" if why else ""))
    return "\n".join(lines), failed
