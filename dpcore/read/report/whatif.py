"""Text/CSV of ``python -m dpcore whatif`` (the CLI only parses and prints; this validates too).

Every problem with the input is a UsageError naming it and the valid choices (exit 2).
"""
from __future__ import annotations

from pathlib import Path

from dpcore.contract.errors import UsageError
from dpcore.contract.options import WhatifOptions
from dpcore.contract.units import mib_size, ranks_text
from dpcore.read.report.resolve import load_run_reporting
from dpcore.read.report.summarize import run_job_summary
from dpcore.read.report.table_text import csv_table, text_table
from dpcore.read.rundir.load import load_run
from dpcore.read.whatif.fabrics import fabrics_text, parse_fabric
from dpcore.read.whatif.predict import (
    WHATIF_COLUMNS,
    Model,
    build_model,
    error_text,
    scale_factors,
    whatif_jobs,
    whatif_report,
)


def _header(model: Model) -> list[str]:
    src = model.src
    lines = [f"what-if from {src.job_id} ({src.variant}, {ranks_text(src.world_size)}, "
             f"{mib_size(src.bucket_mb)} buckets, {len(src.timelines)} timed rank-steps; "
             f"gradients from {src.grads_source})",
             f"  algorithm {model.algo}, {model.streams} collective(s) at once; every factor the model applies "
             "[what it rests on]:"]
    lines += [f"  {name} = {value} [{kind}]: {why}" for name, value, kind, why in scale_factors(model)]
    return lines


def whatif_text(options: WhatifOptions) -> str:
    """The `whatif` command's output: CSV rows (WHATIF_COLUMNS, docs/DESIGN.md's columns first) or a table
    with the fitted model's parameters and where each came from; ``--fabric list``: the presets. The
    bucket and world sizes come parsed and checked (:class:`~dpcore.contract.options.WhatifOptions`)."""
    path, job, fabric, algo, allreduce_run = (options.run, options.job, options.fabric, options.algo,
                                              options.allreduce_run)
    latency_us, bandwidth_gbps, csv = options.latency_us, options.bandwidth_gbps, options.csv
    if fabric is not None and fabric.strip() == "list":
        return fabrics_text()
    if not path:
        raise UsageError("whatif needs a run directory, e.g. python -m dpcore whatif profiles/<run> --job <job>")
    buckets = list(options.bucket_mb) if options.bucket_mb is not None else None
    sizes = list(options.world_sizes) if options.world_sizes is not None else None
    net = parse_fabric(fabric) if fabric is not None else None
    if net is not None and (allreduce_run or (algo not in (None, "ring"))):
        raise UsageError("--fabric sets the messages (NCCL's ring with the preset's alpha and busbw): "
                         "drop --allreduce-run and --algo, or drop --fabric")
    run = load_run_reporting(path)
    if not job:  # after the run is read: the error can then name the jobs to choose from
        raise UsageError("whatif needs --job, a completed bucketed or torch_ddp job of the run; valid choices: "
                         f"{', '.join(whatif_jobs(run)) or '(none in this run)'}")
    ar = load_run(Path(allreduce_run)).allreduce if allreduce_run else None
    if ar is not None and ar.empty:
        raise UsageError(f"--allreduce-run {allreduce_run}: no allreduce.csv rows; run "
                         "`python -m dpcore allreduce` first")
    summary = run_job_summary(run)
    model = build_model(run, job, algo, latency_us, bandwidth_gbps, ar, net, summary)  # validates the job
    table, advice = whatif_report(model, run, summary, buckets, sizes)
    if csv:
        return csv_table(table[WHATIF_COLUMNS])
    view = table.drop(columns=["kappa", "algo", "recommended", "band_from"])
    # the band's model error below/above the prediction, one figure when both sides agree
    view.insert(list(view.columns).index("model_error_pct"), "band_err_%",
                [error_text(lo, hi).removesuffix(" %") for lo, hi in
                 zip(view.pop("model_error_lo_pct"), view.pop("model_error_hi_pct"))])
    view = view.drop(columns=["model_error_pct"])
    view = view.rename(columns={
        "bandwidth_gbps": "B_gbps", "latency_us": "alpha_us", "exposed_comm_ms": "exposed_ms",
        "hidden_comm_ms": "hidden_ms", "measured_step_ms": "measured_ms", "error_pct": "error_%",
        "step_ms_lo": "band_lo", "step_ms_hi": "band_hi"})
    view["bucket_mb"] = view["bucket_mb"].map(lambda b: f"{b:g}")  # MiB, as everywhere in dpcore
    view = view.rename(columns={"bucket_mb": "bucket_MiB"})
    cores = (run.meta.get("environment") or {}).get("cpu_cores")
    notes = ["", "step = forward + max(backward end, last all-reduce end) + bookkeeping + optimizer; "
             "measured_ms: summarize's median step of the same cell (error_% = predicted vs measured).",
             "band_lo-band_hi: the model's held-out error below/above the prediction (band_err_%: its family's, "
             "dpcore/read/whatif/bands.csv) and the doubt of the source job's median step (its p10-p90 over the root "
             "of its steps), in quadrature on each side; in_band: the measured cell inside it."]
    notes += [f"band_err_% {error_text(lo, hi).removesuffix(' %')}: {w}" for lo, hi, w in
              table[["model_error_lo_pct", "model_error_hi_pct", "band_from"]].drop_duplicates()
              .itertuples(index=False)]
    if cores and int(table["world_size"].max()) > int(cores) and \
            (run.meta.get("environment") or {}).get("device", "cpu") == "cpu":
        notes.append(f"caveat: this run's machine has {cores} cores; more ranks than that share cores "
                     "(oversubscribed): the model slows their compute evenly (the factor above), but not "
                     "how much slower gloo's all-reduces get in training there.")
    return "\n".join(_header(model) + ["", text_table(view)] + notes + ["", advice]) + "\n"


def whatif_command(options: WhatifOptions) -> str:
    """The ``whatif`` command: exactly what it prints (the text ends in one newline; a CSV as is)."""
    out = whatif_text(options)
    return out if options.csv else out.rstrip("\n") + "\n"
