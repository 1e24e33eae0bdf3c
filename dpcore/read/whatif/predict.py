"""What if: the step time of a measured bucketed/torch_ddp job at other buckets, ranks, networks.

DataFrames in, DataFrames out, in steps that each have their module:
:func:`~dpcore.read.whatif.build.build_model` measures the source job (timelines, compute
dilation kappa, alpha and B: :mod:`dpcore.read.whatif.fit`, from the job's in-job calibration in
run.json first, each value only inside its plausible range; without in-training alpha and B, the
in-training comm slowdown kappa_comm: :mod:`dpcore.read.whatif.calibrate`);
:func:`~dpcore.read.whatif.cells.predict` replays it for each cell (:mod:`dpcore.read.whatif.cells`,
over :func:`dpcore.read.whatif.model.replay`, whose module docstring lists the model's
assumptions); :mod:`dpcore.read.whatif.factors` names every factor applied. This module puts them
together: :func:`whatif_report` adds the measured step time where the run has the same cell, each
cell's band and the recommendation (:mod:`dpcore.read.whatif.advice`). The measured numbers are
the caller's ``job_summary`` rows (the ones ``summarize`` prints), never recomputed here. Callers
import the whole what-if API from here (``__all__``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from dpcore.contract.units import mib_size, ranks_text
from dpcore.read.rundir.load import Run
from dpcore.read.whatif.advice import (
    add_family_bands,
    error_text,
    recommend,
    recommend_variant,
    source_spread,
    zero1_rivals,
)
from dpcore.read.whatif.build import (
    ASSUMED_KAPPA,
    ASSUMED_KAPPA_BAND,
    BANDWIDTH_GBPS_RANGE,
    LATENCY_US_RANGE,
    STREAMS,
    WHATIF_VARIANTS,
    build_model,
    check_network,
    whatif_jobs,
)
from dpcore.read.whatif.calibrate import KAPPA_COMM_MAX, calibrate_comm
from dpcore.read.whatif.cells import (
    DEFAULT_SWEEP_MB,
    WHATIF_COLUMNS,
    Model,
    default_cells,
    measured_cells,
    predict,
    replay_cell,
    with_measured,
)
from dpcore.read.whatif.factors import KINDS, kind_of, scale_factors
from dpcore.read.whatif.model import Replay

#: The what-if API in one place (callers import from here; the modules above hold the code).
__all__ = ["ASSUMED_KAPPA", "ASSUMED_KAPPA_BAND", "BANDWIDTH_GBPS_RANGE", "DEFAULT_SWEEP_MB", "KAPPA_COMM_MAX",
           "KINDS", "LANE_COLUMNS", "LATENCY_US_RANGE", "STREAMS", "WHATIF_COLUMNS", "WHATIF_VARIANTS", "Model",
           "banded", "build_model", "calibrate_comm", "check_network", "default_cells", "error_text", "kind_of",
           "measured_cells",
           "predict", "replay_cell", "replay_lanes", "scale_factors", "target_world_size", "whatif_jobs",
           "whatif_report", "whatif_table", "widen_by_kappa", "with_measured", "MISS_FACTOR", "measured_misses"]


def banded(model: Model, cells: pd.DataFrame, summary: pd.DataFrame,
           errors: pd.DataFrame | None = None) -> tuple[pd.DataFrame, str]:
    """``cells`` (:func:`with_measured` rows) with their bands and ``recommended`` column
    (WHATIF_COLUMNS), and the recommendation line: :mod:`dpcore.read.whatif.advice`, from the
    source job's spread in ``summary`` (the run's ``job_summary`` rows), at
    :func:`target_world_size`: the fastest bucket size, weighed against the run's measured
    ZeRO-1 jobs at that world size (measured against predicted: the replay cannot model them).
    ``errors``: the per-family model errors (default: ``bands.csv``, :func:`advice.family_errors`)."""
    src = model.src
    table = add_family_bands(cells, source_spread(summary, src.job_id), src.variant, src.bucket_mb, src.world_size,
                             errors)
    ws = target_world_size(table, src.world_size)
    own = summary.loc[summary["job_id"] == src.job_id, "step_ms"]
    # the job's measured step stands in for its own cell only at the job's own world size
    own_ms = float(own.iloc[0]) if not own.empty and ws == src.world_size else None
    table, line = recommend(table, ws, src.bucket_mb, own_ms)
    at = table[table["world_size"] == ws]
    if kind_of(model.alpha_source) == "assumed" and at["buckets"].nunique() > 1:
        # bucket sizes differ by how many messages they send: with α assumed, which one is
        # faster is the assumption's answer, not the run's (the sample's 0.25 MiB job spends
        # ~1.8 ms per message in training where the default says 0.1 ms)
        table = table.assign(recommended=False)
        line = (f"recommendation: none: the per-message latency alpha is assumed ({model.alpha_us:g} µs, no "
                "measurement in this job), and bucket sizes differ in how many messages they send; give "
                "--latency-us, --fabric or --allreduce-run, or profile two bucket sizes, to decide")
    # only a prediction for the run's own network can be held against what the run measured
    bw, alpha = getattr(model, "bandwidth_gbps", None), getattr(model, "alpha_us", None)
    own_net = (pd.Series(True, index=table.index) if bw is None or alpha is None or "bandwidth_gbps" not in table
               else np.isclose(table["bandwidth_gbps"].astype(float), bw)
               & np.isclose(table["latency_us"].astype(float), alpha)) & (getattr(model, "fabric", None) is None)
    misses = measured_misses(table[own_net], ws)
    if len(misses) and not line.startswith("recommendation: none"):  # a reason given already stays
        # a model that misses the run's own jobs by that much cannot say that bucket size does not
        # matter (nor which one is fastest): the measured points disagree with it
        table = table.assign(recommended=False)
        worst = misses.iloc[0]
        line = (f"recommendation: none: the model misses {len(misses)} of this run's own measured cells at "
                f"{ranks_text(ws)} by more than {MISS_FACTOR:g}x (worst: {mib_size(float(worst['bucket_mb']))} "
                f"buckets, predicted {worst['step_ms']:.1f} ms, measured {worst['measured_step_ms']:.1f} ms, job "
                f"{worst['measured_job']}); trust the measured jobs, or profile again on a quiet machine (summarize's "
                "noisy flag says whose steps spread)")
    table, line = recommend_variant(table, line, zero1_rivals(summary, ws), ws, src.variant, src.bucket_mb,
                                    own_ms)
    return table[WHATIF_COLUMNS], line


#: A measured cell this many times above or below its prediction: the model does not describe the run.
MISS_FACTOR = 2.0


def measured_misses(table: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """The cells at ``world_size`` whose measured step is over :data:`MISS_FACTOR` times its
    predicted step or under 1/MISS_FACTOR of it, the farthest first (empty without measurements)."""
    if "measured_step_ms" not in table:
        return table.iloc[:0]
    keep = ((table["world_size"] == world_size) & table["measured_step_ms"].notna() & (table["step_ms"] > 0)).to_numpy()
    at = table[keep].reset_index(drop=True)
    ratio = (at["measured_step_ms"] / at["step_ms"]).to_numpy(dtype=float)
    off = np.maximum(ratio, 1.0 / ratio)
    order = np.argsort(-off, kind="stable")
    return at.iloc[[i for i in order if off[i] > MISS_FACTOR]].reset_index(drop=True)


def target_world_size(table: pd.DataFrame, own: int) -> int:
    """The world size the recommendation is for: the source job's when the table predicts it
    (unless that is 1 rank), else the largest one asked for (``--world-sizes 8`` asks about 8)."""
    sizes = set(table["world_size"].astype(int))
    if own == 1 and sizes - {1}:  # one GPU projected to many: the question is the many
        return max(sizes)
    return own if own in sizes or not sizes else max(sizes)


def whatif_report(model: Model, run: Run, summary: pd.DataFrame, bucket_mbs: list[float] | None = None,
                  world_sizes: list[int] | None = None) -> tuple[pd.DataFrame, str]:
    """The `whatif` command's rows (WHATIF_COLUMNS) of a fitted model (:func:`build_model`) and
    its recommendation line: predictions at the given cells (default: the run's cells of the
    source's variant), the measured step time where the run has the same cell (``summary``: the
    run's ``job_summary`` rows), each cell's band."""
    b_def, n_def = default_cells(run, model.src)
    if model.fabric is not None:  # a fabric is asked about for its own node at least
        n_def = sorted(set(n_def) | {model.fabric.intra.devices})
    pred = predict(model, bucket_mbs or b_def, world_sizes or n_def)
    measured = measured_cells(summary, model.src.variant, run.jobs, model.src.job_id)
    table, line = banded(model, with_measured(pred, measured), summary)
    return widen_by_kappa(model, table, bucket_mbs or b_def, world_sizes or n_def), line


def widen_by_kappa(model: Model, table: pd.DataFrame, bucket_mbs: list[float], world_sizes: list[int]) -> pd.DataFrame:
    """``table`` with each band spanning the steps predicted at both ends of an assumed kappa's
    band (:data:`ASSUMED_KAPPA_BAND`); unchanged where kappa was measured."""
    if model.kappa_band is None:
        return table
    ends = [predict(replace(model, kappa=k), bucket_mbs, world_sizes)[["world_size", "bucket_mb", "step_ms"]]
            .rename(columns={"step_ms": f"k{i}"}) for i, k in enumerate(model.kappa_band)]
    t = table.merge(ends[0], on=["world_size", "bucket_mb"], how="left").merge(ends[1], on=["world_size", "bucket_mb"],
                                                                                how="left")
    t["step_ms_lo"] = np.fmin(t["step_ms_lo"], t["k0"])
    t["step_ms_hi"] = np.fmax(t["step_ms_hi"], t["k1"])
    return t.drop(columns=["k0", "k1"])[table.columns]


def whatif_table(model: Model, run: Run, summary: pd.DataFrame, bucket_mbs: list[float] | None = None,
                 world_sizes: list[int] | None = None) -> pd.DataFrame:
    """:func:`whatif_report`'s table alone."""
    return whatif_report(model, run, summary, bucket_mbs, world_sizes)[0]


LANE_COLUMNS = ["lane", "kind", "start_ms", "end_ms", "label"]


def replay_lanes(rep: Replay, buckets: list[list[int]], sizes: np.ndarray, tail_ms: float) -> pd.DataFrame:
    """One replayed step as drawable rows (LANE_COLUMNS): per rank forward, backward (dilated
    where comm is in flight), bookkeeping and optimizer; a ``comm`` lane with one bar per
    bucket and a ``ready`` row when it was ready on every rank."""
    rows = []
    last = float(np.nanmax(rep.bucket_end)) if np.isfinite(rep.bucket_end).any() else 0.0
    starts = rep.start_ms if rep.start_ms is not None else np.zeros(len(rep.step_ms))
    for r, (f, b, s, t0) in enumerate(zip(rep.fwd_ms, rep.bwd_end, rep.step_ms, starts)):
        lane = f"rank {r}"
        sync_end = max(b, last) + tail_ms
        s = s + t0  # the rank's step ends at its start plus its step time, in the common clock
        rows += [(lane, "forward", t0, f, "forward"), (lane, "backward", f, b, "backward"),
                 (lane, "bookkeeping", max(b, last), sync_end, "bookkeeping after the last bucket"),
                 (lane, "optimizer", sync_end, s, "optimizer")]
    for k, idx in enumerate(buckets):
        mb = float(sizes[idx].sum()) / 2**20
        label = f"bucket {k}: {mb:.2f} MiB, {len(idx)} gradient(s)"
        rows += [("comm", "bucket", rep.bucket_start[k], rep.bucket_end[k], label),
                 ("comm", "ready", rep.bucket_ready[k], rep.bucket_ready[k], f"bucket {k}")]
    return pd.DataFrame(rows, columns=LANE_COLUMNS)
