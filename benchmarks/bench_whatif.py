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
above 2 ranks on a 2-core machine the ranks share cores (oversubscribed: the model slows their
compute evenly, not their all-reduces in training); and the 1-rank jobs are also the comm-free
baseline kappa is measured against, so their rows are not independent of the measurement.
Measurements on a shared machine are noisy: every number is a median over ``--steps`` timed
steps of every rank and over the rounds, and the table shows each measured cell's spread over
rounds; run it on a quiet machine for the README.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.read.analysis.summary import job_summary
from dpcore.read.rundir.load import load_run
from dpcore.read.tables import run_trace_steps
from dpcore.read.whatif.advice import add_bands
from dpcore.read.whatif.fit import Source, service_times
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
    summary = job_summary(run, run_trace_steps(run))
    meas = measured_cells(summary, variant)
    rows = []
    for src in meas[meas["world_size"] == 2].itertuples():
        model = build_model(run, src.job_id, allreduce=ar, summary=summary)
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
                "cores, oversubscribed: the model slows their compute evenly, not their all-reduces in training)",
                "", *table(ws), "",
                f"MAE over world sizes: {ws['error_pct'].abs().mean():.1f} % ({len(ws)} predictions).", ""]
    return "\n".join(out)


#: The held-out sweep (issue 20): two mlp widths and the transformer, both bucketing variants.
MODELS = (("mlp-256", ["--model", "mlp", "--width", "256"]), ("mlp-1024", ["--model", "mlp", "--width", "1024"]),
          ("transformer-tiny", ["--model", "transformer", "--size", "tiny"]))
HELD_OUT_BUCKETS = (0.25, 1.0, 4.0, 16.0, 64.0)


def measure_held_out(out: Path, steps: int, models: list[str], rounds: int = 1) -> list[dict[str, Path]]:
    """One run per model and round: bucketed and torch_ddp at every bucket size of the sweep at 2
    ranks, each job with its in-job calibration (profile's default), and at 1 rank, where
    backward's per-bucket cost is measured without comm (``whatif.fit.fit_bucket_overhead``) and
    from where the 2-rank cells are predicted too, with alpha and B of the ``allreduce`` run
    measured first (``out/allreduce``). One round is ``out/<model>``; several are
    ``out/round<k>/<model>``, profiled round after round (every model in round 1, then in round
    2, ...) so a slow spell of the machine lands on one round of every model, not on every round
    of one model. Returns the rounds' {model: run directory}."""
    _dpcore("allreduce", "--algos", "native", "--world-sizes", "2", "--sizes", "4KB,64KB,1MB,4MB,16MB,64MB",
            "--out", str(out), "--run-id", "allreduce")
    got: list[dict[str, Path]] = []
    for k in range(1, rounds + 1):
        where = out if rounds == 1 else out / f"round{k}"
        runs = {}
        for name, args in MODELS:
            if name not in models:
                continue
            _dpcore("profile", *args, "--variants", "bucketed,torch_ddp", "--world-sizes", "1,2", "--bucket-sweep",
                    ",".join(f"{b:g}" for b in HELD_OUT_BUCKETS), "--bucket-mb", "4", "--steps", str(steps),
                    "--warmup", "3", "--no-trace", "--out", str(where), "--run-id", name)
            runs[name] = where / name
        got.append(runs)
    return got


def held_out_rounds(spec: str, models: list[str]) -> list[tuple[dict[str, Path], Path | None]]:
    """The rounds of existing held-out runs: ``spec`` is one folder (holding ``<model>/`` runs, or
    ``round<k>/<model>/`` as :func:`measure_held_out` writes several rounds) or several folders
    separated by commas, each one round. Each round comes with its ``allreduce`` run: its own
    folder's, else the one beside the rounds, else None."""
    folders = [Path(p) for p in spec.split(",") if p]
    if len(folders) == 1 and sorted(folders[0].glob("round*/")):
        top = folders[0]
        folders = sorted((d for d in top.glob("round*/") if d.name[5:].isdigit()), key=lambda d: int(d.name[5:]))
    else:
        top = folders[0]
    out = []
    for f in folders:
        runs = {n: f / n for n in models if (f / n / "run.json").is_file()}
        ar = next((d for d in (f / "allreduce", f.parent / "allreduce", top / "allreduce")
                   if (d / "run.json").is_file()), None)
        if runs:
            out.append((runs, ar))
    return out


#: What identifies one held-out prediction across rounds.
CELL_KEY = ["model", "variant", "source", "source_bucket_mb", "source_world_size", "bucket_mb", "world_size"]


def median_over_rounds(df: pd.DataFrame) -> pd.DataFrame:
    """One row per held-out prediction (:data:`CELL_KEY`) from the rounds' rows (``round``):
    the median over rounds of the prediction, the ablation's steps and the measured step;
    ``u_dn_pct``/``u_up_pct``, the median over rounds of the source median's doubt the band added
    (:func:`source_doubt`); the band drawn from those (``step_ms_lo``/``step_ms_hi``: the median
    prediction x (1 -/+ sqrt(e² + u²)), as whatif draws it, rather than the medians of each round's
    band ends, which can hold a cell the calibration, :func:`needed_error` of the same medians, says
    is outside, or the reverse); the error and ``in_band`` of those medians; ``spread_pct``, the measured
    cell's (max - min) / median over rounds; ``rounds``, how many rounds had the cell.

    Why medians: on a shared machine the same cell measured in two quiet runs differs by ~16 %
    on average (the three held-out sets of 2026-11-26/27), more than the model's own error; a
    median over rounds is the step a user would see again, which is what the model predicts."""
    if "model_error_lo_pct" not in df:          # rounds evaluated before bands had two sides
        df = df.assign(model_error_lo_pct=df["model_error_pct"], model_error_hi_pct=df["model_error_pct"])
    num = ["step_ms", "step_ms_lo", "step_ms_hi", "measured_step_ms", "model_error_lo_pct", "model_error_hi_pct",
           *[c for c in df.columns if c.startswith("step_") and c not in ("step_ms", "step_ms_lo", "step_ms_hi")]]
    g = df.groupby(CELL_KEY, sort=False)
    med = g[num].median().reset_index()
    extra = g.agg(cal_saw=("cal_saw", "any"), kappa_src=("kappa_src", "first"), rounds=("round", "nunique"),
                  meas_max=("measured_step_ms", "max"), meas_min=("measured_step_ms", "min")).reset_index()
    med = med.merge(extra, on=CELL_KEY)
    doubt = df.assign(**source_doubt(df)).groupby(CELL_KEY, sort=False)[["u_dn_pct", "u_up_pct"]].median()
    med = med.drop(columns=[c for c in ("u_dn_pct", "u_up_pct") if c in med])
    med = med.merge(doubt.reset_index(), on=CELL_KEY)
    med["spread_pct"] = 100 * (med.pop("meas_max") - med.pop("meas_min")) / med["measured_step_ms"]
    med["error_pct"] = 100 * (med["step_ms"] - med["measured_step_ms"]) / med["measured_step_ms"]
    # the band drawn around the median prediction by whatif's own add_bands, from the family error and
    # the median doubt: the one needed_error calibrates, so in_band and the calibration agree cell by cell
    return add_bands(med, (med["u_dn_pct"] / 100.0, med["u_up_pct"] / 100.0), med["model_error_lo_pct"].to_numpy(),
                     med["model_error_hi_pct"].to_numpy())


def evaluate_rounds(rounds: list[tuple[dict[str, Path], Path | None]], ablation: bool = True) -> pd.DataFrame:
    """:func:`evaluate_held_out` of every round, its rows marked ``round`` (1, 2, ...)."""
    return pd.concat([evaluate_held_out(runs, ar, ablation).assign(round=k) for k, (runs, ar) in enumerate(rounds, 1)],
                     ignore_index=True)


def round_lines(per_round: pd.DataFrame) -> str:
    """Each round on its own (no medians): MAE and the share inside the committed bands, 2 from 2."""
    same = per_round[per_round["world_size"] == per_round["source_world_size"]]
    parts = [f"round {k}: MAE {g['error_pct'].abs().mean():.1f} %, {100 * g['in_band'].astype(bool).mean():.0f} % "
             f"inside ({len(g)})" for k, g in same.groupby("round")]
    return "Each round alone (one measurement per cell, as a single run gives it), 2 from 2: " + "; ".join(parts) + "."


#: The modelled terms the ablation replaces by the predicted job's measured value, one at a time.
TERMS = ("ready", "messages", "kappa")
#: Terms the ablation turns off, one at a time, to show what each adds: ``bucket_cost``, backward's
#: per-bucket cost moved from the source's buckets to the cell's (``whatif.model.rebucket_work``).
OFF = ("bucket_cost", "message_cost", "anchor")
_LABEL = {"bucket_cost": "model without the per-bucket backward cost",
          "message_cost": "model without the per-message cost (the anchor taken again without it)",
          "anchor": "model without the anchor (the replay alone)"}


def measured_bucket_ms(src: Source) -> np.ndarray:
    """Per bucket (launch order) of a measured job: the median over its timed rank-steps of the
    serial-equivalent service time, the quantity alpha and B are fitted to."""
    return service_times(src).groupby("k")["ms"].median().to_numpy(float)


def ablate(run, model, target: str, bucket_mb: float, summary: pd.DataFrame | None = None) -> dict[str, float]:
    """The predicted step of one held-out cell with one modelled term at a time replaced by the
    target job's measured value: ``ready`` (its own backward: gradient ready times from grads.csv,
    forward and optimizer), ``messages`` (its own all-reduce times per bucket, from
    collectives.csv), ``kappa`` (compute slowed by comm, fitted on its own phases); and with one
    term of :data:`OFF` turned off (``bucket_cost``; ``message_cost``, with the source's anchor
    taken again without it, NaN without ``summary``). NaN where the target lacks what the term needs."""
    from dpcore.read.whatif.build import anchor
    from dpcore.read.whatif.fit import fit_kappa, job_timelines
    from dpcore.read.whatif.predict import replay_cell

    tgt = job_timelines(run.steps, run.collectives, run.grads, target)
    out = {}
    # its own plan too: the per-bucket cost in its timeline is its own buckets', moved nowhere
    own = replace(model, src=replace(model.src, timelines=tgt.timelines, bucket_mb=tgt.bucket_mb))
    out["ready"] = replay_cell(own, 2, bucket_mb)[0]["step_ms"]
    try:
        out["messages"] = replay_cell(model, 2, bucket_mb, bucket_ms=measured_bucket_ms(tgt))[0]["step_ms"]
    except ValueError:
        out["messages"] = float("nan")
    base = run.steps[(run.steps["variant"] == tgt.variant) & (run.steps["world_size"] == 1)]["bwd_ms"].median()
    k, _ = fit_kappa(tgt, float(base) if np.isfinite(base) else float("nan"))
    out["kappa"] = replay_cell(replace(model, kappa=k), 2, bucket_mb)[0]["step_ms"]
    out["bucket_cost"] = replay_cell(replace(model, bucket_overhead_ms=0.0), 2, bucket_mb)[0]["step_ms"]
    out["message_cost"] = (replay_cell(anchor(replace(model, message_ms=0.0), summary), 2, bucket_mb)[0]["step_ms"]
                           if summary is not None else float("nan"))
    out["anchor"] = replay_cell(replace(model, anchor_ratio=1.0), 2, bucket_mb)[0]["step_ms"]
    return out


def ablation_table(df: pd.DataFrame) -> str:
    """Per term: mean |error| with that term measured, and how much of the model's error it carries
    (mean |error| of the model minus that); then per term of :data:`OFF` present in ``df``: mean
    |error| with it turned off, and what it removes (that minus the model's)."""
    base = df["error_pct"].abs().mean()
    lines = ["| term replaced by the measured value | cells | MAE with it measured | error it carries |",
             "|---|---:|---:|---:|", f"| none (the model) | {len(df)} | {base:.1f} % | — |"]

    def mae(col: str) -> tuple[pd.DataFrame, float]:
        ok = df[np.isfinite(df[col])]
        return ok, float((100 * (ok[col] - ok["measured_step_ms"]) / ok["measured_step_ms"]).abs().mean())

    for t in TERMS:
        ok, err = mae(f"step_{t}")
        lines.append(f"| {t} | {len(ok)} | {err:.1f} % | {ok['error_pct'].abs().mean() - err:+.1f} points |")
    for t in OFF:
        if f"step_{t}" in df:
            ok, err = mae(f"step_{t}")
            lines.append(f"| ({_LABEL[t]}) | {len(ok)} | {err:.1f} % | "
                         f"{err - ok['error_pct'].abs().mean():+.1f} points removed by it |")
    return "\n".join(lines)


def direction(src_mb: float, mb: float) -> str:
    """Which way a cell extrapolates in bucket size from its source."""
    return "to larger buckets" if mb > src_mb else "to smaller buckets"


def source_doubt(df: pd.DataFrame) -> dict[str, pd.Series]:
    """``u_dn_pct``/``u_up_pct``: the source median's doubt (%, down and up) the band of each row
    added to its family error (``whatif.advice.add_bands``: half-width sqrt(e² + u²)), taken back
    out of the row's band (``step_ms_lo``/``step_ms_hi``) and family errors (``model_error_lo_pct``/
    ``model_error_hi_pct``, else ``model_error_pct`` both ways); as they are where ``df`` has them."""
    if {"u_dn_pct", "u_up_pct"} <= set(df.columns):
        return {"u_dn_pct": df["u_dn_pct"], "u_up_pct": df["u_up_pct"]}
    e_lo = df.get("model_error_lo_pct", df["model_error_pct"]) / 100.0
    e_hi = df.get("model_error_hi_pct", df["model_error_pct"]) / 100.0
    return {"u_dn_pct": 100.0 * np.sqrt(np.maximum((1.0 - df["step_ms_lo"] / df["step_ms"]) ** 2 - e_lo ** 2, 0.0)),
            "u_up_pct": 100.0 * np.sqrt(np.maximum((df["step_ms_hi"] / df["step_ms"] - 1.0) ** 2 - e_hi ** 2, 0.0))}


def needed_error(df: pd.DataFrame) -> pd.Series:
    """Per held-out cell, the family error (%) its band needs to hold the measured step, the band
    drawn as ``whatif`` draws it: the prediction x (1 ± sqrt(e² + u²)), u the source median's
    doubt on that side (``u_dn_pct``/``u_up_pct``; 0 where ``df`` lacks them, e.g. cells taken
    from an older printed table). With u = 0 it is |measured / predicted - 1|: a band is drawn
    around the prediction, so a cell predicted 30 % low (measured 1.43 x the prediction) needs a
    band reaching 43 % above it, not 30 %.

    Why not that alone: the band adds the source's doubt to the family error; a family error that
    alone holds 90 % of the cells gives a band, once the doubt is added, that holds more than the
    90 % it claims (91-93 % on the held-out runs): wider than the errors need."""
    ratio = 1.0 / (1.0 + df["error_pct"] / 100.0) - 1.0           # measured / predicted - 1
    zero = pd.Series(0.0, index=df.index)
    u = np.where(ratio >= 0, df.get("u_up_pct", zero), df.get("u_dn_pct", zero)) / 100.0
    return pd.Series(100.0 * np.sqrt(np.maximum(ratio.to_numpy() ** 2 - u ** 2, 0.0)), index=df.index)


def _loso_half(df: pd.DataFrame, key: str, q: float) -> pd.DataFrame:
    """``df`` with ``band_err`` (:func:`needed_error`), ``half_pct`` (the ``q`` quantile of it
    over the cells of its ``key`` group predicted from OTHER sources: leave one source out, so no
    cell sets its own band) and ``inside`` (its own within that; NaN where fewer than two other
    cells)."""
    df = df.assign(band_err=needed_error(df))
    half = []
    for r in df.itertuples():
        others = df[(df[key] == getattr(r, key)) & (df["source"] != r.source)]["band_err"]
        half.append(float(np.quantile(others, q)) if len(others) >= 2 else float("nan"))
    df = df.assign(half_pct=half)
    return df.assign(inside=(df["band_err"] <= df["half_pct"]).where(np.isfinite(df["half_pct"])))


def family_bands(df: pd.DataFrame, q: float = 0.9) -> pd.DataFrame:
    """Bands per family (model, variant, direction of extrapolation): a cell's family error is the
    ``q`` quantile of :func:`needed_error` of its family's cells predicted from OTHER sources (leave one
    source out, so no cell sets its own band); the table: per family, cells, mean family error
    (% of the prediction) and the share of measured cells inside the band it draws."""
    df = df.assign(family=[f"{m}, {v}, {direction(s, b)}" for m, v, s, b in
                           zip(df["model"], df["variant"], df["source_bucket_mb"], df["bucket_mb"])])
    df = _loso_half(df, "family", q)
    return df.groupby("family").agg(cells=("half_pct", "size"), half_width_pct=("half_pct", "mean"),
                                    inside_pct=("inside", lambda x: 100 * x.dropna().astype(float).mean())
                                    ).reset_index()


def _families(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``buckets``/``ranks``: each cell's family (``whatif.advice.family_of``)."""
    from dpcore.read.whatif.advice import family_of

    fam = [family_of(s, n0, b, n) for s, n0, b, n in
           zip(df["source_bucket_mb"], df["source_world_size"], df["bucket_mb"], df["world_size"])]
    return df.assign(buckets=[f[0] for f in fam], ranks=[f[1] for f in fam])


def _needs(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(down, up) in %: what each cell's band needs below and above its prediction with its
    source's doubt on that side (``whatif.bandfit.side_needs``; u 0 where ``df`` lacks it)."""
    from dpcore.read.whatif.bandfit import side_needs

    ratio = 1.0 / (1.0 + df["error_pct"].to_numpy(float) / 100.0) - 1.0      # measured / predicted - 1
    zero = pd.Series(0.0, index=df.index)
    down, up = side_needs(ratio, df.get("u_dn_pct", zero).to_numpy(float) / 100.0,
                          df.get("u_up_pct", zero).to_numpy(float) / 100.0)
    return 100.0 * down, 100.0 * up


def bands_table(df: pd.DataFrame, where: str, q: float = 0.9) -> pd.DataFrame:
    """The table ``advice.py`` reads (dpcore/read/whatif/bands.csv, :data:`BAND_COLUMNS`): per
    family (variant x direction of extrapolation in bucket size and in world size, the families
    :func:`dpcore.read.whatif.advice.family_of` gives a predicted cell, a 1-rank source's cells
    at more ranks apart), the cells, their mean |error|, the model errors the band takes below and
    above the prediction (``lower_pct``/``upper_pct``: ``whatif.bandfit.fit_family`` of what each
    cell needs with its own source's doubt, :func:`_needs`: the narrowest pair at the lowest level
    at which, each source's cells left out of the fit in turn, the band holds ``q`` of them), their
    mean (``half_width_pct``), that held-out share (``inside_held_out_pct``) and ``where``.

    ``df``: held-out cells, one row per prediction; rows of several rounds (single runs, each
    with its own source's doubt) are each a cell, so the band is one for a single run, as a user
    runs it. A source is its model and job: its cells of every round are left out together."""
    from dpcore.read.whatif.bandfit import fit_family

    # the errors as the per-cell table prints them, so a table taken again from the printed cells
    # (--cells-from) is this one
    df = df.assign(**{c: df[c].round(1) for c in ("error_pct", "u_dn_pct", "u_up_pct") if c in df})
    df = _families(df)
    rows = []
    for (v, b, n), g in df.groupby(["variant", "buckets", "ranks"], sort=True):
        down, up = _needs(g)
        groups = (g["model"].astype(str) + "|" if "model" in g else "") + g["source"].astype(str)
        fit = fit_family(down, up, groups.to_numpy(), q)
        lo, hi = round(fit.lower, 1), round(fit.upper, 1)
        rows.append({"variant": v, "buckets": b, "ranks": n, "cells": len(g),
                     "mae_pct": round(g["error_pct"].abs().mean(), 1), "lower_pct": lo, "upper_pct": hi,
                     "half_width_pct": round((lo + hi) / 2, 2),
                     "inside_held_out_pct": round(100 * fit.held_out, 0) if np.isfinite(fit.held_out) else np.nan,
                     "where": where})
    return pd.DataFrame(rows, columns=BAND_COLUMNS)


def apply_bands(df: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """``df`` (held-out cells with ``u_dn_pct``/``u_up_pct``) with the band the family table
    ``table`` (:func:`bands_table`) draws, as ``whatif`` draws it
    (``whatif.advice.add_family_bands``: a family without a row takes its stand-in's, else the
    global error): ``step_ms_lo``/``step_ms_hi``, the errors and ``in_band``."""
    from dpcore.read.whatif.advice import add_family_bands

    errors = table.set_index(["variant", "buckets", "ranks"])
    parts = []
    for (v, smb, sws), g in df.groupby(["variant", "source_bucket_mb", "source_world_size"], sort=False):
        parts.append(add_family_bands(g, (g["u_dn_pct"] / 100.0, g["u_up_pct"] / 100.0), str(v), float(smb),
                                      int(sws), errors))
    return pd.concat(parts).loc[df.index]


def out_of_sample(per_round: pd.DataFrame, q: float = 0.9) -> pd.DataFrame:
    """Each round's single-run cells inside bands fitted (:func:`bands_table`) on the OTHER rounds'
    single-run cells: the band as applied to a user's single run, checked on runs it never saw.
    Rows of ``per_round`` with ``in_band`` and the band of that rotation (``fit_rounds`` says which)."""
    parts = []
    for k, g in per_round.groupby("round"):
        rest = per_round[per_round["round"] != k]
        table = bands_table(rest, "rotation", q)
        parts.append(apply_bands(g, table).assign(fit_rounds=",".join(str(r) for r in sorted(set(rest["round"])))))
    return pd.concat(parts)


def _share(g: pd.DataFrame) -> str:
    return (f"MAE {g['error_pct'].abs().mean():.1f} %, {100 * g['in_band'].astype(bool).mean():.0f} % inside "
            f"({int(g['in_band'].astype(bool).sum())} of {len(g)}), {half_width_pct(g):.1f} % wide")


def out_of_sample_lines(oos: pd.DataFrame) -> str:
    """Per held-out round and over them: 2 from 2 and 2 from 1, single runs in bands fitted on
    the other rounds (:func:`out_of_sample`)."""
    lines = ["| held-out round | fitted on rounds | ranks | cells | MAE | inside band | half-width |",
             "|---|---|---|---:|---:|---:|---:|"]
    for (k, same), g in oos.assign(same=oos["world_size"] == oos["source_world_size"]).groupby(["round", "same"]):
        lines.append(f"| {k} | {g['fit_rounds'].iloc[0]} | {'2 from 2' if same else '2 from 1'} | {len(g)} | "
                     f"{g['error_pct'].abs().mean():.1f} % | {100 * g['in_band'].astype(bool).mean():.0f} % | "
                     f"{half_width_pct(g):.1f} % |")
    same = oos["world_size"] == oos["source_world_size"]
    lines += ["", f"Out of sample, single runs, 2 from 2: {_share(oos[same])}; 2 from 1: {_share(oos[~same])}."]
    return "\n".join(lines)


#: bands.csv's columns (docs/DESIGN.md): ``lower_pct``/``upper_pct`` the model errors below and
#: above the prediction, ``half_width_pct`` their mean (a table with it alone is read symmetric).
BAND_COLUMNS = ["variant", "buckets", "ranks", "cells", "mae_pct", "lower_pct", "upper_pct", "half_width_pct",
                "inside_held_out_pct", "where"]
#: The held-out cells the committed bands are fitted on (``--cells-out``), one row per single run's cell.
CELL_COLUMNS = ["round", "model", "variant", "source", "source_bucket_mb", "source_world_size", "bucket_mb",
                "world_size", "step_ms", "measured_step_ms", "error_pct", "u_dn_pct", "u_up_pct"]
_JOB = re.compile(r"-ws(\d+)-b([0-9.]+)$")
_AT = re.compile(r" at (\d+) ranks")


def cells_from_markdown(text: str) -> pd.DataFrame:
    """The per-cell rows of a held-out table this benchmark printed (:func:`markdown_held_out`,
    e.g. the README's): model, variant, source, source_bucket_mb, source_world_size, bucket_mb,
    world_size (the source's, or the N of "at N ranks" in the cell), error_pct, and u_dn_pct /
    u_up_pct (the source doubt column; 0 in a table printed without it). Lets the bands be taken
    again from a printed run without profiling it again."""
    rows = []
    for line in text.splitlines():
        f = [c.strip() for c in line.strip().strip("|").split("|")]
        m = _JOB.search(f[2]) if len(f) in (8, 9) else None
        if m is None:
            continue
        at = _AT.search(f[3])
        dn, up = (float(x) for x in f[8].split()[0].split("/")) if len(f) == 9 else (0.0, 0.0)
        rows.append({"model": f[0], "variant": f[1], "source": f[2], "source_world_size": int(m.group(1)),
                     "source_bucket_mb": float(m.group(2)), "world_size": int(at.group(1) if at else m.group(1)),
                     "bucket_mb": float(f[3].split()[0]), "error_pct": float(f[6].split()[0]),
                     "u_dn_pct": dn, "u_up_pct": up})
    return pd.DataFrame(rows)


def read_cells(path: str) -> pd.DataFrame:
    """Held-out cells to take the bands again from: a CSV of :data:`CELL_COLUMNS` (``--cells-out``),
    else a per-cell table this benchmark printed (:func:`cells_from_markdown`)."""
    if path.endswith(".csv"):
        return pd.read_csv(path)
    return cells_from_markdown(Path(path).read_text())


def evaluate_held_out(runs: dict[str, Path], allreduce: Path | None = None, ablation: bool = True) -> pd.DataFrame:
    """Every measured 2-rank cell predicted from every OTHER 2-rank job of the same model and
    variant (the source's in-job calibration never ran the predicted cell's plan, except where
    its second plan happens to be that bucket size: ``cal_saw`` says so), with its band; and,
    given an ``allreduce`` run, from every 1-rank job of the same model and variant (one rank to
    two: alpha and B from that run; no ablation, its ``step_*`` columns are NaN)."""
    from dpcore.contract.calibration import second_plan_mb
    from dpcore.read.whatif.predict import banded

    rows = []
    for name, path in runs.items():
        run = load_run(path)
        summary = job_summary(run, run_trace_steps(run))
        for variant in ("bucketed", "torch_ddp"):
            every = measured_cells(summary, variant)
            meas = every[every["world_size"] == 2]
            if meas.empty:      # no completed 2-rank job of this variant (a run cut short): nothing to predict
                continue
            if allreduce is not None:
                rows += [_one_to_two(run, summary, name, variant, src, meas, load_run(allreduce).allreduce)
                         for src in every[every["world_size"] == 1].itertuples()]
            for src in meas.itertuples():
                model = build_model(run, src.job_id, summary=summary)
                cells = meas[meas["job_id"] != src.job_id]
                pred = predict(model, sorted(set(cells["bucket_mb"])), [2])
                table, _ = banded(model, with_measured(pred, cells), summary)
                table = table.dropna(subset=["measured_step_ms"]).assign(**_doubt(summary, src.job_id))
                nan = dict.fromkeys(TERMS + OFF, np.nan)
                abl = [ablate(run, model, str(j), float(b), summary) if ablation else nan
                       for j, b in zip(table["measured_job"], table["bucket_mb"])]
                for t in TERMS + OFF:
                    table[f"step_{t}"] = [a[t] for a in abl]
                rows.append(table.assign(model=name, variant=variant, source=src.job_id,
                                         source_bucket_mb=src.bucket_mb, source_world_size=src.world_size,
                                         kappa_src=model.kappa_source[:40],
                                         cal_saw=np.isclose(table["bucket_mb"], second_plan_mb(src.bucket_mb))))
    return pd.concat(rows, ignore_index=True)


def _one_to_two(run, summary: pd.DataFrame, name: str, variant: str, src, cells: pd.DataFrame,
                ar: pd.DataFrame) -> pd.DataFrame:
    """The 2-rank ``cells`` predicted from the 1-rank job ``src`` with the allreduce rows ``ar``."""
    from dpcore.read.whatif.predict import banded

    model = build_model(run, src.job_id, allreduce=ar, summary=summary)
    pred = predict(model, sorted(set(cells["bucket_mb"])), [2])
    table, _ = banded(model, with_measured(pred, cells), summary)
    table = table.dropna(subset=["measured_step_ms"]).assign(**_doubt(summary, src.job_id))
    for t in TERMS + OFF:
        table[f"step_{t}"] = np.nan
    return table.assign(model=name, variant=variant, source=src.job_id, source_bucket_mb=src.bucket_mb,
                        source_world_size=1, kappa_src=model.kappa_source[:40], cal_saw=False)


def _doubt(summary: pd.DataFrame, job_id: str) -> dict[str, float]:
    """``u_dn_pct``/``u_up_pct``: the doubt (%) of the source job's median step, down and up, as the
    band of its cells adds it (``whatif.advice.source_spread``): one run's, as a user's run has."""
    from dpcore.read.whatif.advice import source_spread

    dn, up = source_spread(summary, job_id)
    return {"u_dn_pct": 100.0 * dn, "u_up_pct": 100.0 * up}


def _cell(r) -> str:
    at = f" at {r.world_size} ranks" if r.world_size != r.source_world_size else ""
    return f"{r.bucket_mb:g} MiB{at}{' (cal)' if r.cal_saw else ''}"


def half_width_pct(df: pd.DataFrame) -> float:
    """How wide the bands of ``df``'s cells are on average: the mean over cells of the band's
    half-width, (hi - lo) / 2, in % of the prediction (both sides: u differs down and up)."""
    return float((100 * (df["step_ms_hi"] - df["step_ms_lo"]) / 2 / df["step_ms"]).mean())


def markdown_held_out(df: pd.DataFrame) -> str:
    """Every cell, then MAE and band coverage per model/variant and overall."""
    lines = ["| model | variant | source job | predicted cell | predicted ms (band) | measured ms | error | in band "
             "| source doubt -/+ |", "|---|---|---|---|---:|---:|---:|:---:|---:|"]
    for r in df.sort_values(["model", "variant", "source_bucket_mb", "bucket_mb"]).itertuples():
        lines.append(f"| {r.model} | {r.variant} | {r.source} | {_cell(r)} | "
                     f"{r.step_ms:.1f} ({r.step_ms_lo:.1f}-{r.step_ms_hi:.1f}) | {r.measured_step_ms:.1f} | "
                     f"{r.error_pct:+.1f} % | {'yes' if r.in_band else 'no'} | {r.u_dn_pct:.1f}/{r.u_up_pct:.1f} % |")
    lines += ["", "| model | variant | ranks | predictions | MAE | inside band |", "|---|---|---|---:|---:|---:|"]
    for (m, v, n0), g in df.groupby(["model", "variant", "source_world_size"]):
        lines.append(f"| {m} | {v} | {'2 from 2' if n0 == 2 else f'2 from {n0}'} | {len(g)} | "
                     f"{g['error_pct'].abs().mean():.1f} % | {100 * g['in_band'].astype(bool).mean():.0f} % |")
    up = df[df["source_world_size"] != df["world_size"]]
    df = df[df["source_world_size"] == df["world_size"]]
    held = df[~df["cal_saw"]]
    lines += ["", f"All: MAE **{df['error_pct'].abs().mean():.1f} %** over {len(df)} predictions, "
              f"{100 * df['in_band'].astype(bool).mean():.0f} % of measured cells inside their band "
              f"({half_width_pct(df):.1f} % wide on average); "
              f"cells the source's calibration never ran: MAE {held['error_pct'].abs().mean():.1f} % "
              f"({len(held)}), {100 * held['in_band'].astype(bool).mean():.0f} % inside."]
    if not up.empty:
        lines.append(f"One rank to two (alpha and B from the `allreduce` run): MAE "
                     f"{up['error_pct'].abs().mean():.1f} % over {len(up)} predictions, "
                     f"{100 * up['in_band'].astype(bool).mean():.0f} % inside ({half_width_pct(up):.1f} % wide).")
    return "\n".join(lines)


def committed_coverage(df: pd.DataFrame) -> str:
    """The share of held-out cells inside the bands that were in force when ``df`` was evaluated
    (``in_band``: :func:`evaluate_held_out` reads the committed ``bands.csv`` before this run
    writes any): out of sample when the runs are new, the check that the committed bands hold."""
    from dpcore.read.whatif.advice import BANDS_CSV, family_errors

    errors = family_errors()
    where = "; ".join(sorted(set(errors["where"].astype(str)))) if "where" in errors else ""
    parts = []
    for name, g in (("2 from 2", df[df["source_world_size"] == df["world_size"]]),
                    ("2 from 1", df[df["source_world_size"] != df["world_size"]])):
        if not g.empty:
            parts.append(f"{name}: {100 * g['in_band'].astype(bool).mean():.0f} % of {len(g)} cells")
    return (f"**Inside the committed bands** ({BANDS_CSV.name} as it was before this run: {where or 'none'}): "
            + ", ".join(parts) + ".")


def write_bands(df: pd.DataFrame, out: str | None, where: str) -> None:
    """Print the per-family band table (:func:`bands_table`) and write it as CSV to ``out``."""
    table = bands_table(df, where)
    print("\n**Bands per family** (variant x direction in bucket size and world size; below/above: the model "
          "errors e the band takes each side of the prediction, fitted on single held-out runs with each "
          "source's doubt in the band; inside: leave one source out):\n")
    print("| variant | buckets | ranks | cells | MAE | below | above | inside |\n"
          "|---|---|---|---:|---:|---:|---:|---:|")
    for r in table.itertuples():
        print(f"| {r.variant} | {r.buckets} | {r.ranks} | {r.cells} | {r.mae_pct:.1f} % | {r.lower_pct:.1f} % | "
              f"{r.upper_pct:.1f} % | {r.inside_held_out_pct:.0f} % |")
    if out:
        table.to_csv(out, index=False)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per job")
    ap.add_argument("--rounds", type=int, default=3, help="times the whole sweep is profiled (medians over them); "
                    "with --held-out too")
    ap.add_argument("--world-sizes", default="1,2,3")
    ap.add_argument("--variant", default="bucketed", choices=("bucketed", "torch_ddp"))
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--keep", default=None, help="folder to keep the runs in (default: a temp dir)")
    ap.add_argument("--runs", default=None, help="evaluate existing runs: ALLREDUCE_DIR,SWEEP_DIR[,SWEEP_DIR...]; "
                    "with --held-out: the held-out runs' folder, or several folders (one round each)")
    ap.add_argument("--held-out", action="store_true",
                    help="the held-out sweep (issue 20): mlp 256 and 1024, transformer tiny; bucketed and torch_ddp; "
                    "0.25-64 MiB at 2 ranks; every cell predicted from every other job of its model and variant")
    ap.add_argument("--models", default=",".join(n for n, _ in MODELS), help="with --held-out: which models")
    ap.add_argument("--bands-out", default=None, help="with --held-out: write the per-family band table here "
                    "(dpcore/read/whatif/bands.csv is the one whatif reads)")
    ap.add_argument("--cells-from", default=None, help="with --held-out: take the cells from the CSV --cells-out "
                    "wrote (dpcore/read/whatif/bands_cells.csv), or a per-cell Markdown table this benchmark printed, "
                    "instead of profiling")
    ap.add_argument("--cells-out", default=None, help="with --held-out: write every single run's held-out cell "
                    "here as CSV (the cells --bands-out fits on; --cells-from takes them again)")
    ap.add_argument("--skip-ablation", action="store_true", help="with --held-out: leave out the term-by-term "
                    "ablation (the slowest part of the evaluation); the bands do not use it")
    ap.add_argument("--where", default="", help="with --bands-out: the run the bands come from (machine, date)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    if a.held_out and a.cells_from:
        if not Path(a.cells_from).is_file():
            ap.error(f"--cells-from {a.cells_from}: no such file (a CSV --cells-out wrote, or a Markdown table)")
        df = read_cells(a.cells_from)
        if df.empty:
            ap.error(f"--cells-from {a.cells_from}: no held-out cell rows (a CSV of {', '.join(CELL_COLUMNS)}, "
                     "or a Markdown table | model | variant | source job | ... |)")
        write_bands(df, a.bands_out, a.where or f"cells of {a.cells_from}")
        if "round" in df and df["round"].nunique() > 1:  # a refit is checked as a measured one is
            print("\n**Out of sample, single runs** (the cells of each round inside the bands fitted on the "
                  "other rounds' cells):\n")
            print(out_of_sample_lines(out_of_sample(df)))
        return
    if a.held_out:
        models = [m for m in a.models.split(",") if m]
        if a.runs:
            held = held_out_rounds(a.runs, models)
            if not held:
                ap.error(f"--runs {a.runs}: no held-out runs of {', '.join(models)} (FOLDER/<model>/run.json, "
                         "FOLDER/round<k>/<model>/run.json, or several folders separated by commas)")
        else:
            root = Path(a.keep or tempfile.mkdtemp())
            ar = root / "allreduce"
            held = [(r, ar) for r in measure_held_out(root, a.steps, models, a.rounds)]
        per_round = evaluate_rounds(held, not a.skip_ablation)
        df = median_over_rounds(per_round)
        print(markdown_held_out(df))
        print("\n" + committed_coverage(df))
        same = df[df["world_size"] == df["source_world_size"]]
        print("\n**Find the term**: each held-out cell predicted again with one modelled term replaced by the "
              "predicted job's measured value.\n")
        print(ablation_table(same) if not a.skip_ablation else "(skipped: --skip-ablation)")
        fam = family_bands(same)
        print("\n**Bands per family** (model, variant, direction of extrapolation; the family error: 90th "
              "percentile of needed_error of the family's cells from other sources):\n")
        print("| family | cells | mean half-width | inside |\n|---|---:|---:|---:|")
        for r in fam.itertuples():
            print(f"| {r.family} | {r.cells} | {r.half_width_pct:.1f} % | {r.inside_pct:.0f} % |")
        if len(held) > 1:
            print("\n**Out of sample, single runs**: each round's cells, as one run gives them (its own source's "
                  "doubt), inside the bands fitted on the other rounds' single-run cells:\n")
            print(out_of_sample_lines(out_of_sample(per_round)))
        cells = per_round.assign(**source_doubt(per_round))[CELL_COLUMNS]
        if a.cells_out:
            cells.round(2).to_csv(a.cells_out, index=False)
        if a.bands_out:
            write_bands(cells.round(2), a.bands_out, a.where or f"bench_whatif --held-out, single runs of "
                        f"{len(held)} round(s), load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, "
                        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print(f"\n_load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores_")
        if len(held) > 1:
            print("\n" + round_lines(per_round))
        made = f"the runs in {a.runs} (not profiled again)" if a.runs else f"{a.steps} timed steps per job"
        print(f"\n_{made}, {len(held)} round(s) (one run per model each; every number above is the median "
              f"over rounds of the prediction and of the measured step), alpha/B from each source job's "
              f"in-job calibration where it has one, kappa as whatif takes it; {time.perf_counter() - t0:.0f} s. "
              "Reproduce: "
              "`python -m benchmarks.bench_whatif --held-out`._")
        return
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
