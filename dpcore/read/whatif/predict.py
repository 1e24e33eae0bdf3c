"""What if: the step time of a measured bucketed/torch_ddp job at other buckets, ranks, networks.

DataFrames in, DataFrames out: :func:`build_model` measures the source job (timelines, compute
dilation kappa, alpha and B: :mod:`dpcore.read.whatif.fit`, from the job's in-job calibration
in run.json first, each value only inside its plausible range; without in-training alpha and B,
the in-training comm slowdown kappa_comm, calibrated so that the replay of the source's own
buckets reproduces its measured last all-reduce end: :func:`calibrate_comm`), :func:`predict` replays it for each cell
(:func:`dpcore.read.whatif.model.replay`, whose module docstring lists the model's assumptions),
and :func:`whatif_table` adds the measured step time where the run has the same cell. The
measured numbers are the caller's ``job_summary`` rows (the ones ``summarize`` prints), never
recomputed here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from dpcore.contract.buckets import pack_reverse, rule_for
from dpcore.contract.errors import UsageError, choices_error
from dpcore.read.rundir.load import Run
from dpcore.read.whatif.advice import add_bands, recommend, recommend_variant, source_spread, zero1_rivals
from dpcore.read.whatif.fit import (
    JOB_FIT,
    Source,
    calibration_of,
    fit_kappa,
    fit_network,
    job_timelines,
    kappa_from_calibration,
    network_from_calibration,
)
from dpcore.read.whatif.model import ALGOS, RankStep, Replay, allreduce_parts, replay, undilate

#: docs/DESIGN.md's `whatif --csv` columns first, then the breakdown, the measurement and the model.
#: ``step_ms_lo``/``step_ms_hi``: the band (:mod:`dpcore.read.whatif.advice`); ``in_band``: the
#: measured cell inside it; ``recommended``: the cell the recommendation line names.
WHATIF_COLUMNS = ["world_size", "bucket_mb", "bandwidth_gbps", "latency_us", "step_ms", "comm_ms",
                  "exposed_comm_ms", "step_ms_lo", "step_ms_hi", "hidden_comm_ms", "compute_ms", "other_ms",
                  "buckets", "measured_step_ms", "error_pct", "in_band", "measured_job", "recommended", "kappa",
                  "algo"]
_MEASURED_COLUMNS = [c for c in WHATIF_COLUMNS if c not in ("step_ms_lo", "step_ms_hi", "in_band", "recommended")]

#: Collectives a backend runs at once per process group: gloo's ProcessGroupGloo has 2 worker
#: threads (``Options::threads{2}`` in ProcessGroupGloo.hpp), NCCL one stream per group.
STREAMS = {"gloo": 2, "nccl": 1}
#: Upper bound of the fitted comm slowdown while backward runs (comm never stops entirely).
KAPPA_COMM_MAX = 0.95


@dataclass
class Model:
    """A fitted what-if model of one source job (see the module docstring)."""

    src: Source
    kappa: float
    kappa_source: str
    tail_ms: float
    algo: str
    alpha_us: float
    bandwidth_gbps: float
    alpha_source: str
    bandwidth_source: str
    strong: bool
    streams: int
    kappa_comm: float = 0.0
    comm_scale: float = 1.0
    calibration_source: str = "none"


#: Variants whose step the model describes: gradient buckets all-reduced during backward, then a
#: local optimizer. zero1/torch_zero1 bucket too, but their optimizer step also communicates
#: (parameters come back), which the replay does not model.
WHATIF_VARIANTS = ("bucketed", "torch_ddp")


def whatif_jobs(run: Run) -> list[str]:
    """The run's jobs the model can start from: completed bucketed/torch_ddp train jobs."""
    j = run.jobs
    ok = j[j["variant"].isin(WHATIF_VARIANTS) & (j["status"].fillna("complete") == "complete")]
    return [str(x) for x in ok["job_id"]]


def _baseline_bwd(run: Run, variant: str) -> float:
    """Median backward of the variant at world size 1 (no comm in flight), NaN if none."""
    st = run.steps
    base = st[(st["variant"] == variant) & (st["world_size"] == 1) & ~st["profiled"].astype(bool)]
    return float(base["bwd_ms"].median()) if not base.empty else float("nan")


def build_model(run: Run, job_id: str, algo: str | None = None, latency_us: float | None = None,
                bandwidth_gbps: float | None = None, allreduce: pd.DataFrame | None = None) -> Model:
    """Measure the source job. ``allreduce``: allreduce.csv rows to fit α and B from (default:
    the run's own). UsageError naming the valid choices for an unusable job or algorithm."""
    valid = whatif_jobs(run)
    if job_id not in valid and job_id in set(run.jobs["job_id"].astype(str)):
        row = run.jobs[run.jobs["job_id"].astype(str) == job_id].iloc[0]
        article = "an" if str(row["variant"])[:1].lower() in "aeiou" else "a"
        why = (f"is {article} {row['variant']} job" if row["variant"] not in WHATIF_VARIANTS
               else f"did not complete ({row['status']})")
        raise UsageError(f"job {job_id!r} {why}; whatif replays completed "
                         f"{' or '.join(WHATIF_VARIANTS)} jobs: {', '.join(valid) or 'none in this run'}")
    if job_id not in valid:
        raise choices_error("job", job_id, valid or ["(no completed bucketed or torch_ddp job in this run)"])
    algo = "ring" if algo is None else algo  # "" is a typo to refuse, not the default
    if algo not in ALGOS:
        raise choices_error("algorithm", algo, ALGOS)
    for name, v in (("--latency-us", latency_us), ("--bandwidth-gbps", bandwidth_gbps)):
        if v is not None and not (math.isfinite(v) and (v > 0 if name == "--bandwidth-gbps" else v >= 0)):
            raise UsageError(f"{name} must be a finite number {'> 0' if 'band' in name else '>= 0'}, got {v:g}")
    cal = calibration_of(run.meta, job_id)
    try:
        src = job_timelines(run.steps, run.collectives, run.grads, job_id)
        kappa, ksrc = kappa_from_calibration(cal)
        if not np.isfinite(kappa):
            kappa, ksrc2 = fit_kappa(src, _baseline_bwd(run, src.variant))
            ksrc = f"{ksrc2} ({ksrc})" if ksrc else ksrc2
        net, why = network_from_calibration(cal, algo, src.world_size)
        if net is None or latency_us is not None or bandwidth_gbps is not None or allreduce is not None:
            # the user's values, or an allreduce run named for this call, come first
            net = fit_network(src, algo, run.allreduce if allreduce is None else allreduce, latency_us,
                              bandwidth_gbps)
            if why:
                net["alpha_source"] += f" ({why})"
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    tails = [tl.sync_end_ms - max(tl.fwd_ms + tl.bwd_ms, float(np.max(tl.comm_end, initial=0.0)))
             for tl in src.timelines]
    strong = (run.meta.get("config") or {}).get("scaling") == "strong"
    # alpha and B of one collective alone (allreduce rows, the user) replay with the backend's
    # concurrency; a fit to the job's serial-equivalent service times already contains it
    backend = str((run.meta.get("environment") or {}).get("backend") or "gloo")
    # (the in-job calibration's line is fitted to serial-equivalent service times too)
    streams = 1 if net["bandwidth_source"].startswith((JOB_FIT, "in-job")) else STREAMS.get(backend, 1)
    model = Model(src, kappa, ksrc, max(float(np.median(tails)), 0.0), algo, float(net["alpha_us"]),
                  float(net["bandwidth_gbps"]), net["alpha_source"], net["bandwidth_source"], strong, streams)
    if latency_us is not None and bandwidth_gbps is not None:
        model.calibration_source = "none (alpha and B given: used as they are)"
        return model
    if net["bandwidth_source"].startswith("in-job"):
        # measured during backward, with many small and a few large buckets: compute's slowdown
        # of comm is in them already, and one source job's comm end (a disturbed step or two
        # decide it on a shared box) must not rescale what two plans measured
        model.calibration_source = "none (alpha and B measured during training by the in-job calibration)"
        return model
    return calibrate_comm(model)


def _self_comm_end(model: Model) -> float:
    return replay_cell(model, model.src.world_size, model.src.bucket_mb)[0]["comm_end_ms"]


def _bisect(f, lo: float, hi: float, target: float, iters: int = 30) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (the nearer end when out of range)."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def calibrate_comm(model: Model) -> Model:
    """Fit the in-training comm rate to the source job (``whatif.model`` assumption 3b): the
    ``kappa_comm`` with which the replay of the source's own buckets ends its last all-reduce
    when collectives.csv says it did (median over the timed rank-steps). Monotone, so bisection.
    When even ``kappa_comm = 0`` ends too late, the network measurement was slower than the job's
    comm (a disturbed ``allreduce`` run): every all-reduce is scaled by ``comm_scale < 1``
    instead; when even ``KAPPA_COMM_MAX`` ends too early, by ``comm_scale > 1`` on top."""
    # in the replay's clock (the step's earliest rank), where the replay's comm_end_ms is
    ends = [tl.start_ms + float(np.max(tl.comm_end)) for tl in model.src.timelines
            if tl.comm_end.size and np.isfinite(tl.comm_end).all()]
    if not ends or model.src.world_size < 2:
        model.calibration_source = "none (no timed all-reduce in the source job)"
        return model
    target = float(np.median(ends))
    at = lambda **kw: _self_comm_end(replace(model, **kw))  # noqa: E731
    if at(kappa_comm=0.0) >= target:
        model.comm_scale = _bisect(lambda s: at(comm_scale=s), 0.02, 1.0, target)
        how = (f"kappa_comm 0, all-reduces x {model.comm_scale:.2f}: the network fit is slower than the job's "
               "own all-reduces")
    elif at(kappa_comm=KAPPA_COMM_MAX) >= target:
        model.kappa_comm = _bisect(lambda k: at(kappa_comm=k), 0.0, KAPPA_COMM_MAX, target)
        how = f"kappa_comm {model.kappa_comm:.2f}"
    else:
        model.kappa_comm = KAPPA_COMM_MAX
        model.comm_scale = _bisect(lambda s: at(kappa_comm=KAPPA_COMM_MAX, comm_scale=s), 1.0, 50.0, target)
        how = f"kappa_comm {KAPPA_COMM_MAX:g} (bound), all-reduces x {model.comm_scale:.2f}"
    model.calibration_source = (f"{how}: replaying the source's own buckets ends the last all-reduce at "
                                f"{target:.1f} ms from the step's start, as measured (median of {len(ends)})")
    return model


def _rank_steps(model: Model, n: int) -> dict[int, list[RankStep]]:
    """Per source step: ``n`` ranks in model units (source ranks reused cyclically)."""
    scale = model.src.world_size / n if model.strong else 1.0
    by_step: dict[int, list] = {}
    for tl in model.src.timelines:
        work = undilate(np.r_[tl.ready_ms, tl.fwd_ms + tl.bwd_ms], tl.comm_start, tl.comm_end,
                        model.kappa) - tl.fwd_ms
        by_step.setdefault(tl.step, []).append(
            RankStep(tl.fwd_ms * scale, np.maximum(work[:-1], 0) * scale, max(work[-1], 0) * scale, tl.opt_ms,
                     tl.start_ms))
    return {s: [rs[i % len(rs)] for i in range(n)] for s, rs in by_step.items()}


def replay_cell(model: Model, world_size: int, bucket_mb: float, bandwidth_gbps: float | None = None,
                latency_us: float | None = None) -> tuple[dict, Replay, list[list[int]]]:
    """Replay every source step in one cell: the cell's medians over (rank, step), the replay of
    the step closest to the median, and the buckets (registration indices, launch order)."""
    bw = model.bandwidth_gbps if bandwidth_gbps is None else bandwidth_gbps
    lat = model.alpha_us if latency_us is None else latency_us
    buckets = pack_reverse(model.src.sizes.tolist(), bucket_mb, rule_for(model.src.variant))
    parts = np.array([allreduce_parts(model.algo, world_size, model.src.sizes[b].sum(), lat, bw)
                      for b in buckets]).reshape(-1, 2) * model.comm_scale
    reps = {s: replay(r, buckets, parts[:, 0], parts[:, 1], model.kappa, model.streams, model.tail_ms,
                      model.kappa_comm)
            for s, r in _rank_steps(model, world_size).items()}
    cols = {"step_ms": [], "comm_ms": [], "exposed_comm_ms": [], "compute_ms": [], "comm_end_ms": []}
    for rp in reps.values():
        last = float(np.nanmax(rp.bucket_end)) if np.isfinite(rp.bucket_end).any() else 0.0
        cols["comm_end_ms"] += [last] * len(rp.step_ms)
        opt = rp.step_ms - np.maximum(rp.bwd_end, last) - model.tail_ms
        cols["step_ms"] += list(rp.step_ms)
        cols["comm_ms"] += list(rp.comm_ms)
        cols["exposed_comm_ms"] += list(rp.exposed_ms)
        cols["compute_ms"] += list(rp.bwd_end + opt)
    med = {k: float(np.median(v)) for k, v in cols.items()}
    med["hidden_comm_ms"] = med["comm_ms"] - med["exposed_comm_ms"]
    med["other_ms"] = max(med["step_ms"] - med["compute_ms"] - med["exposed_comm_ms"], 0.0)
    rep = min(reps.values(), key=lambda rp: abs(float(np.median(rp.step_ms)) - med["step_ms"]))
    row = {"world_size": int(world_size), "bucket_mb": float(bucket_mb), "bandwidth_gbps": bw,
           "latency_us": lat, **med, "buckets": len(buckets), "kappa": model.kappa, "algo": model.algo}
    return row, rep, buckets


def measured_cells(summary: pd.DataFrame, variant: str) -> pd.DataFrame:
    """The run's completed jobs of ``variant``: job_id, world_size, bucket_mb, step_ms (summarize's).
    ``summary``: the run's :func:`dpcore.read.analysis.summary.job_summary` rows."""
    s = summary[(summary["variant"] == variant) & (summary["status"] == "complete")]
    return s[["job_id", "world_size", "bucket_mb", "step_ms"]].reset_index(drop=True)


def predict(model: Model, bucket_mbs: list[float], world_sizes: list[int],
            bandwidth_gbps: float | None = None, latency_us: float | None = None) -> pd.DataFrame:
    """One row per (world size, bucket size) cell, WHATIF_COLUMNS without the measurement."""
    rows = [replay_cell(model, n, b, bandwidth_gbps, latency_us)[0] for n in world_sizes for b in bucket_mbs]
    return pd.DataFrame(rows)


def with_measured(pred: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """Add measured_step_ms, measured_job and error_pct ((pred − meas) / meas) where the run has
    the same (world size, bucket size) cell."""
    m = measured.rename(columns={"step_ms": "measured_step_ms", "job_id": "measured_job"})
    out = pred.merge(m, on=["world_size", "bucket_mb"], how="left")
    out["error_pct"] = 100.0 * (out["step_ms"] - out["measured_step_ms"]) / out["measured_step_ms"]
    return out[_MEASURED_COLUMNS]


def default_cells(run: Run, src: Source) -> tuple[list[float], list[int]]:
    """Bucket sizes and world sizes the run measured for the source's variant (plus the source's)."""
    j = run.jobs[run.jobs["variant"] == src.variant]
    buckets = sorted({float(b) for b in j["bucket_mb"].dropna()} | {src.bucket_mb})
    sizes = sorted({int(n) for n in j["world_size"].dropna()} | {src.world_size})
    return buckets, sizes


def banded(model: Model, cells: pd.DataFrame, summary: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """``cells`` (:func:`with_measured` rows) with their bands and ``recommended`` column
    (WHATIF_COLUMNS), and the recommendation line: :mod:`dpcore.read.whatif.advice`, from the
    source job's spread in ``summary`` (the run's ``job_summary`` rows), at
    :func:`target_world_size`: the fastest bucket size, weighed against the run's measured
    ZeRO-1 jobs at that world size (measured against predicted: the replay cannot model them)."""
    src = model.src
    table = add_bands(cells, source_spread(summary, src.job_id))
    ws = target_world_size(table, src.world_size)
    own = summary.loc[summary["job_id"] == src.job_id, "step_ms"]
    # the job's measured step stands in for its own cell only at the job's own world size
    own_ms = float(own.iloc[0]) if not own.empty and ws == src.world_size else None
    table, line = recommend(table, ws, src.bucket_mb, own_ms)
    table, line = recommend_variant(table, line, zero1_rivals(summary, ws), ws, src.variant, src.bucket_mb,
                                    own_ms)
    return table[WHATIF_COLUMNS], line


def target_world_size(table: pd.DataFrame, own: int) -> int:
    """The world size the recommendation is for: the source job's when the table predicts it,
    else the largest one asked for (``whatif --world-sizes 8`` asks about 8 ranks)."""
    sizes = set(table["world_size"].astype(int))
    return own if own in sizes or not sizes else max(sizes)


def whatif_report(model: Model, run: Run, summary: pd.DataFrame, bucket_mbs: list[float] | None = None,
                  world_sizes: list[int] | None = None) -> tuple[pd.DataFrame, str]:
    """The `whatif` command's rows (WHATIF_COLUMNS) of a fitted model (:func:`build_model`) and
    its recommendation line: predictions at the given cells (default: the run's cells of the
    source's variant), the measured step time where the run has the same cell (``summary``: the
    run's ``job_summary`` rows), each cell's band."""
    b_def, n_def = default_cells(run, model.src)
    pred = predict(model, bucket_mbs or b_def, world_sizes or n_def)
    return banded(model, with_measured(pred, measured_cells(summary, model.src.variant)), summary)


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
