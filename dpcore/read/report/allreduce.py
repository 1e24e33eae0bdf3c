"""The all-reduce table: what ``python -m dpcore allreduce`` prints at the end of its run, and
what ``summarize`` prints for a run of all-reduce jobs (nccl-tests' columns).

The numbers are :func:`dpcore.read.analysis.comm.allreduce_bandwidth`'s, the dashboard's
Bandwidth view's; this module adds the repeats and #wrong and lays them out.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpcore.contract.units import EMPTY, binary_size
from dpcore.read.analysis.comm import allreduce_bandwidth
from dpcore.read.report.resolve import load_run_reporting
from dpcore.read.report.table_text import text_table
from dpcore.read.rundir.load import Run

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


def allreduce_table(run: Run) -> pd.DataFrame:
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


def allreduce_text(path: str | Path) -> str:
    """The all-reduce table of a run as text (what `allreduce` prints at the end, and `summarize`
    on an all-reduce run), with a line per job whose results were wrong."""
    run = load_run_reporting(path)
    t = allreduce_table(run)
    if t.empty:
        return f"{run.meta.get('run_id', Path(path).name)}: no all-reduce results\n"
    shown = t.assign(**{"#wrong": [EMPTY if w is None or w != w else str(int(w)) for w in t["#wrong"]]})
    text = text_table(shown, float_format=None, na_rep=EMPTY,
                      formatters={"time_us": "{:.1f}".format, "algbw_GB/s": "{:.3f}".format,
                                  "busbw_GB/s": "{:.3f}".format})
    lines = [f"{run.meta.get('run_id', Path(path).name)} ({run.meta.get('status', '?')}): all-reduce, float32, "
             "sum; busbw = algbw * 2(N-1)/N (nccl-tests)", text, "",
             "time_us: median over the repeats of the slowest rank; #wrong: elements that differ from the exact "
             f"sum in one checked call, summed over ranks ({EMPTY}: not checked by this run)."]
    bad = t[pd.to_numeric(t["#wrong"], errors="coerce").fillna(0) > 0]
    for _, r in bad.iterrows():
        lines.append(f"WRONG RESULTS: {r['algo']} at {r['ranks']} ranks, {r['size']}: {int(r['#wrong'])} element(s)")
    return "\n".join(lines) + "\n"
