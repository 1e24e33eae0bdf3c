"""How well does `whatif` predict? Profile a bucket sweep, predict each job from ANOTHER job.

    python -m benchmarks.bench_whatif [--steps 40] [--world-sizes 1,2,3] [--variant bucketed]

One command, three steps, a Markdown table on stdout ready for the README:

1. ``python -m dpcore allreduce --algos native --world-sizes 2`` (nccl-tests style): the alpha
   and B the model uses, measured on this machine now;
2. ``python -m dpcore profile --model mlp --width 1024 --bucket-sweep 1,4,32`` at the given world
   sizes (every job of one run shares the threads per rank), ``--rounds`` times (separate runs);
3. in every round, each 2-rank job in turn is the source and ``whatif`` predicts every other
   measured cell of that round; the table compares the median over rounds of the prediction
   with the median over rounds of the measured step time (``summarize``'s number).

The headline is the mean absolute error (MAE) over the bucket-sweep pairs at 2 ranks (1 MB and
4 MB predicted from 32 MB, and 32 MB from each of them). World-size rows are reported apart:
above 2 ranks on a 2-core machine the ranks share cores (oversubscribed), which the model does
not know; and the 1-rank jobs are also the comm-free baseline kappa is measured against, so
their rows are not independent of the measurement. Measurements on a shared machine are noisy:
every number is a median over ``--steps`` timed steps of every rank and over the rounds, and
the table shows each measured cell's spread over rounds; run it on a quiet machine for the README.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from dpcore.read.analysis.summary import job_summary
from dpcore.read.analysis.timeline import trace_step_metrics
from dpcore.read.rundir.job_traces import traced_job_events
from dpcore.read.rundir.load import load_run
from dpcore.read.whatif.predict import build_model, measured_cells, predict, with_measured

SWEEP = (1.0, 4.0, 32.0)
HEADLINE = {(32.0, 1.0), (32.0, 4.0), (1.0, 32.0), (4.0, 32.0)}


def _dpcore(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "dpcore", *args, "--progress", "none"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def measure(out: Path, steps: int, world_sizes: str, variant: str, width: int, rounds: int) -> tuple[list[Path], Path]:
    """Run the allreduce once and the profile sweep ``rounds`` times; return the run directories.

    Why rounds: on a shared machine a burst of someone else's work lands on whichever job runs
    at that moment; repeating the whole sweep and taking medians over rounds spreads it out."""
    _dpcore("allreduce", "--algos", "native", "--world-sizes", "2", "--sizes",
            "4KB,64KB,1MB,4MB,16MB,32MB", "--out", str(out), "--run-id", "allreduce")
    sweeps = []
    for r in range(rounds):
        _dpcore("profile", "--model", "mlp", "--width", str(width), "--variants", variant,
                "--world-sizes", world_sizes, "--bucket-sweep", ",".join(f"{b:g}" for b in SWEEP),
                "--bucket-mb", f"{SWEEP[-1]:g}", "--steps", str(steps), "--warmup", "5", "--no-trace",
                "--out", str(out), "--run-id", f"sweep{r}")
        sweeps.append(out / f"sweep{r}")
    return sweeps, out / "allreduce"


def evaluate_one(sweep: Path, allreduce: Path | None, variant: str) -> pd.DataFrame:
    """Every (2-rank source job, other measured cell) pair of one run: predicted, measured.
    ``allreduce`` None: alpha and B fitted from each source job's own collectives."""
    run = load_run(sweep)
    ar = load_run(allreduce).allreduce if allreduce is not None else pd.DataFrame()
    meas = measured_cells(job_summary(run, trace_step_metrics(traced_job_events(run))), variant)
    rows = []
    for src in meas[meas["world_size"] == 2].itertuples():
        model = build_model(run, src.job_id, allreduce=ar)
        cells = meas[meas["job_id"] != src.job_id]
        pred = predict(model, sorted(set(cells["bucket_mb"])), sorted(set(cells["world_size"])))
        got = with_measured(pred, cells).dropna(subset=["measured_step_ms"])
        rows.append(got.assign(source=src.job_id, source_bucket_mb=src.bucket_mb, kappa=model.kappa))
    return pd.concat(rows, ignore_index=True)


def evaluate(sweeps: list[Path], allreduce: Path | None, variant: str) -> pd.DataFrame:
    """Per (source, cell): medians over rounds of the prediction and of the measurement, the
    error of those medians, and the measured cell's spread over rounds ((max − min) / median)."""
    df = pd.concat([evaluate_one(s, allreduce, variant).assign(round=i) for i, s in enumerate(sweeps)],
                   ignore_index=True)
    g = df.groupby(["source", "source_bucket_mb", "world_size", "bucket_mb"], sort=True)
    out = g.agg(step_ms=("step_ms", "median"), measured_step_ms=("measured_step_ms", "median"),
                kappa=("kappa", "median"), lo=("measured_step_ms", "min"), hi=("measured_step_ms", "max"),
                rounds=("round", "nunique")).reset_index()
    out["error_pct"] = 100.0 * (out["step_ms"] - out["measured_step_ms"]) / out["measured_step_ms"]
    out["spread_pct"] = 100.0 * (out["hi"] - out["lo"]) / out["measured_step_ms"]
    return out


def headline(df: pd.DataFrame) -> tuple[float, float, int, int]:
    """(MAE of the headline pairs, MAE of all bucket pairs at 2 ranks, and their counts)."""
    sweep = df[df["world_size"] == 2]
    head = sweep[[(s, b) in HEADLINE for s, b in zip(sweep["source_bucket_mb"], sweep["bucket_mb"])]]
    return head["error_pct"].abs().mean(), sweep["error_pct"].abs().mean(), len(head), len(sweep)


def markdown(df: pd.DataFrame, cores: int, job_fit: pd.DataFrame | None = None) -> str:
    """The README table: bucket sweep at 2 ranks (headline MAE), then the world-size rows."""
    def table(part: pd.DataFrame) -> list[str]:
        lines = ["| source job | predicted cell | kappa | predicted ms | measured ms | error | measured spread |",
                 "|---|---|---:|---:|---:|---:|---:|"]
        for r in part.itertuples():
            lines.append(f"| {r.source} | {r.world_size} ranks, {r.bucket_mb:g} MB | {r.kappa:.2f} | "
                         f"{r.step_ms:.1f} | {r.measured_step_ms:.1f} | {r.error_pct:+.1f} % | {r.spread_pct:.0f} % |")
        return lines

    sweep = df[(df["world_size"] == 2)]
    ws = df[df["world_size"] != 2]
    h, a, nh, na = headline(df)
    out = ["**Bucket sweep, 2 ranks** (mlp width 1024; alpha and B from the `allreduce` run)", "",
           *table(sweep), "", f"MAE, 1 and 4 MB from 32 MB and back: **{h:.1f} %** ({nh} predictions); "
           f"all pairs: {a:.1f} % ({na}).", ""]
    if job_fit is not None and not job_fit.empty:
        h, a, nh, na = headline(job_fit)
        out += [f"Same runs, alpha and B fitted from each source job's own collectives instead: MAE {h:.1f} % "
                f"({nh}), all pairs {a:.1f} % ({na}).", ""]
    if not ws.empty:
        out += [f"**Other world sizes** (this machine has {cores} cores: above {cores} ranks they share "
                "cores, oversubscribed, which the model does not know)", "", *table(ws), "",
                f"MAE over world sizes: {ws['error_pct'].abs().mean():.1f} % ({len(ws)} predictions).", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per job")
    ap.add_argument("--rounds", type=int, default=3, help="times the whole sweep is profiled (medians over them)")
    ap.add_argument("--world-sizes", default="1,2,3")
    ap.add_argument("--variant", default="bucketed", choices=("bucketed", "torch_ddp"))
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--keep", default=None, help="folder to keep the two runs in (default: a temp dir)")
    ap.add_argument("--runs", default=None, help="evaluate existing runs: ALLREDUCE_DIR,SWEEP_DIR[,SWEEP_DIR...]")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    if a.runs:
        allreduce, *sweeps = (Path(p) for p in a.runs.split(","))
        df, job_fit = evaluate(sweeps, allreduce, a.variant), evaluate(sweeps, None, a.variant)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(a.keep) if a.keep else Path(tmp)
            sweeps, allreduce = measure(out, a.steps, a.world_sizes, a.variant, a.width, a.rounds)
            df, job_fit = evaluate(sweeps, allreduce, a.variant), evaluate(sweeps, None, a.variant)
    print(markdown(df, os.cpu_count() or 0, job_fit))
    rounds = int(df["rounds"].max())
    print(f"_{a.variant}, {rounds} round(s) x {a.steps} timed steps per job (medians over rounds; measured "
          "spread = (max - min) / median of the cell over rounds), alpha/B from `allreduce` on this machine; "
          f"{time.perf_counter() - t0:.0f} s. Reproduce: `python -m benchmarks.bench_whatif`._")


if __name__ == "__main__":
    main()
