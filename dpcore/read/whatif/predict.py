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
from dpcore.read.whatif.fabrics import Network, ring_parts
from dpcore.read.whatif.fit import (
    BANDWIDTH_RANGE_GBPS,
    JOB_FIT,
    PER_MESSAGE_RANGE_MS,
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
    #: messages from a fabric preset (``whatif --fabric``) instead of alpha-beta at alpha_us, B
    fabric: Network | None = None
    #: (lo, hi) of an assumed kappa: each predicted step's band spans the steps at both ends
    kappa_band: tuple[float, float] | None = None
    #: the user's (latency_us, bandwidth_gbps) over a fabric's, None where not given
    network_given: tuple[float | None, float | None] = (None, None)


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


#: The network values whatif accepts: beyond them a prediction is a number without meaning
#: (1e-30 GB/s gave a 28-digit step). 1 MB/s is a slow Ethernet link; 10 TB/s is ten times
#: NVLink 4's 900 GB/s; 100 ms per message is a congested WAN hop.
BANDWIDTH_GBPS_RANGE = BANDWIDTH_RANGE_GBPS
LATENCY_US_RANGE = (0.0, PER_MESSAGE_RANGE_MS[1] * 1e3)


def check_network(latency_us: float | None, bandwidth_gbps: float | None) -> None:
    """UsageError naming the valid range for a latency or bandwidth outside it (None: not given)."""
    for name, v, (lo, hi), unit in (("--latency-us", latency_us, LATENCY_US_RANGE, "µs"),
                                    ("--bandwidth-gbps", bandwidth_gbps, BANDWIDTH_GBPS_RANGE, "GB/s")):
        if v is not None and not (math.isfinite(v) and lo <= v <= hi and (v > 0 or name == "--latency-us")):
            raise UsageError(f"{name} {v:g} is outside what whatif models: give {lo:g} to {hi:g} {unit}")


def _check_job(run: Run, job_id: str, algo: str | None) -> str:
    """The algorithm to use; UsageError naming the valid choices for an unusable job or algorithm."""
    valid = whatif_jobs(run)
    if job_id not in valid and job_id in set(run.jobs["job_id"].astype(str)):
        row = run.jobs[run.jobs["job_id"].astype(str) == job_id].iloc[0]
        why = (f"is a {row['variant']} job" if row["variant"] not in WHATIF_VARIANTS
               else f"did not complete ({row['status']})")
        raise UsageError(f"job {job_id!r} {why}; whatif replays completed "
                         f"{' or '.join(WHATIF_VARIANTS)} jobs: {', '.join(valid) or 'none in this run'}")
    if job_id not in valid:
        raise choices_error("job", job_id, valid or ["(no completed bucketed or torch_ddp job in this run)"])
    algo = "ring" if algo is None else algo  # "" is a typo to refuse, not the default
    if algo not in ALGOS:
        raise choices_error("algorithm", algo, ALGOS)
    return algo


def _kappa(run: Run, src: Source, cal: dict | None) -> tuple[float, str]:
    """kappa and its source: the in-job calibration, else the fits of :func:`fit_kappa`."""
    kappa, ksrc = kappa_from_calibration(cal)
    if not np.isfinite(kappa):
        kappa, ksrc2 = fit_kappa(src, _baseline_bwd(run, src.variant))
        ksrc = f"{ksrc2} ({ksrc})" if ksrc else ksrc2
    return kappa, ksrc


def _tail(src: Source) -> float:
    """Median bookkeeping after the last bucket (ms) over the source's timed rank-steps."""
    tails = [tl.sync_end_ms - max(tl.fwd_ms + tl.bwd_ms, float(np.max(tl.comm_end, initial=0.0)))
             for tl in src.timelines]
    return max(float(np.median(tails)), 0.0)


#: kappa for a source without comm (world size 1) projected onto a fabric: nothing measures it, so
#: it is an assumption with a band, and the band of every predicted step spans both ends. On GPU
#: an NCCL all-reduce in flight takes a few of the SMs and some memory bandwidth from backward;
#: 0.1 is the middle, 0 (comm free) and 0.3 the ends.
ASSUMED_KAPPA, ASSUMED_KAPPA_BAND = 0.1, (0.0, 0.3)


def _fabric_model(run: Run, job_id: str, net: Network, latency_us: float | None,
                  bandwidth_gbps: float | None) -> Model:
    """A model whose messages come from a fabric preset (:mod:`dpcore.read.whatif.fabrics`);
    from a world-size-1 source, kappa is :data:`ASSUMED_KAPPA` and its band."""
    try:
        src = job_timelines(run.steps, run.collectives, run.grads, job_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if src.world_size >= 2:
        kappa, ksrc = _kappa(run, src, calibration_of(run.meta, job_id))
        band = None
    else:
        kappa, band = ASSUMED_KAPPA, ASSUMED_KAPPA_BAND
        ksrc = (f"assumed {ASSUMED_KAPPA:g}, band {band[0]:g}-{band[1]:g} (a world-size-1 job has no comm to "
                "measure it from; an all-reduce in flight takes some SMs and memory bandwidth from backward)")
    strong = (run.meta.get("config") or {}).get("scaling") == "strong"
    given = "given (overrides the fabric)"
    model = Model(src, kappa, ksrc, _tail(src), "ring",
                  net.intra.alpha_us if latency_us is None else latency_us,
                  net.intra.busbw_gbps if bandwidth_gbps is None else bandwidth_gbps,
                  f"fabric {net.label}: {net.intra.source}" if latency_us is None else given,
                  f"fabric {net.label}: {net.intra.source}" if bandwidth_gbps is None else given,
                  strong, 1, fabric=net, kappa_band=band, network_given=(latency_us, bandwidth_gbps))
    model.calibration_source = ("none (messages from a fabric preset, one NCCL stream; the source job's comm "
                                "does not describe that fabric)")
    return model


def build_model(run: Run, job_id: str, algo: str | None = None, latency_us: float | None = None,
                bandwidth_gbps: float | None = None, allreduce: pd.DataFrame | None = None,
                fabric: Network | None = None) -> Model:
    """Measure the source job. ``allreduce``: allreduce.csv rows to fit α and B from (default:
    the run's own); ``fabric``: take the messages from a fabric preset instead (then
    ``latency_us`` / ``bandwidth_gbps`` override the preset's). UsageError naming the valid
    choices for an unusable job or algorithm."""
    algo = _check_job(run, job_id, algo)
    check_network(latency_us, bandwidth_gbps)
    if fabric is not None:
        return _fabric_model(run, job_id, fabric, latency_us, bandwidth_gbps)
    cal = calibration_of(run.meta, job_id)
    try:
        src = job_timelines(run.steps, run.collectives, run.grads, job_id)
        kappa, ksrc = _kappa(run, src, cal)
        net, why = network_from_calibration(cal, algo, src.world_size)
        if net is None or latency_us is not None or bandwidth_gbps is not None or allreduce is not None:
            # the user's values, or an allreduce run named for this call, come first
            net = fit_network(src, algo, run.allreduce if allreduce is None else allreduce, latency_us,
                              bandwidth_gbps)
            if why:
                net["alpha_source"] += f" ({why})"
    except ValueError as exc:
        msg = str(exc)
        if "no timed all-reduces" in msg:
            msg += " or --fabric NAME (--fabric list)"
        raise UsageError(msg) from None
    strong = (run.meta.get("config") or {}).get("scaling") == "strong"
    # alpha and B of one collective alone (allreduce rows, the user) replay with the backend's
    # concurrency; a fit to the job's serial-equivalent service times already contains it
    backend = str((run.meta.get("environment") or {}).get("backend") or "gloo")
    # (the in-job calibration's line is fitted to serial-equivalent service times too)
    streams = 1 if net["bandwidth_source"].startswith((JOB_FIT, "in-job")) else STREAMS.get(backend, 1)
    model = Model(src, kappa, ksrc, _tail(src), algo, float(net["alpha_us"]),
                  float(net["bandwidth_gbps"]), net["alpha_source"], net["bandwidth_source"], strong, streams)
    if latency_us is not None and bandwidth_gbps is not None:
        model.calibration_source = "none (alpha and B given: used as they are)"
        return model
    if latency_us is not None or bandwidth_gbps is not None:
        # a network the user names is a different network: the source job's comm says nothing
        # about how far off it is, and a factor fitted to the measured one (x50 at the bound)
        # applied to a faster one made more bandwidth predict a slower step
        model.calibration_source = ("none (network given: --bandwidth-gbps or --latency-us used as given, "
                                    "the other value as stated above; no factor from the source job's comm)")
        return model
    if net["bandwidth_source"].startswith("in-job"):
        # measured during backward, with many small and a few large buckets: compute's slowdown
        # of comm is in them already, and one source job's comm end (a disturbed step or two
        # decide it on a shared box) must not rescale what two plans measured
        model.calibration_source = "none (alpha and B measured during training by the in-job calibration)"
        return model
    return calibrate_comm(model)


#: What a factor's value rests on, as ``scale_factors`` names it.
KINDS = ("measured", "fitted", "calibration", "given", "fabric", "assumed", "none")


def _kind(source: str) -> str:
    """The kind (:data:`KINDS`) of a value from the sentence saying where it came from."""
    s = source.lower()
    if s.startswith(("unknown", "assumed", "unmeasured", "not fitted")) or "default" in s.split(":")[0]:
        return "assumed"
    if s.startswith("given"):
        return "given"
    if s.startswith("fabric"):
        return "fabric"
    if s.startswith("in-job"):
        return "measured"
    return "fitted"


def scale_factors(model: Model) -> list[tuple[str, str, str, str]]:
    """Every factor the replay applies: (name, value, kind from :data:`KINDS`, where it came
    from). The CLI prints them and the page lists them, so no factor acts unseen."""
    rows = [("kappa (compute slowed by comm in flight)", f"{model.kappa:.2f}", _kind(model.kappa_source),
             model.kappa_source),
            ("alpha", f"{model.alpha_us:.1f} µs", _kind(model.alpha_source),
             model.alpha_source),
            ("B", f"{model.bandwidth_gbps:.3f} GB/s", _kind(model.bandwidth_source),
             model.bandwidth_source)]
    if model.fabric is not None and model.network_given[0] is None:
        inter = model.fabric.inter
        rows.append((f"alpha between nodes ({inter.name})", f"{inter.alpha_us:g} µs",
                     "assumed" if model.fabric.inter_assumed else "fabric", inter.source))
        rows.append((f"B between nodes ({inter.name}; the ring takes the slower link)", f"{inter.busbw_gbps:g} GB/s",
                     "assumed" if model.fabric.inter_assumed else "fabric", inter.source))
    rows.append(("gradient ready times", f"{len(model.src.sizes)} gradients", "measured",
                 f"the source job's own backward ({model.src.grads_source})"))
    cal = model.calibration_source
    kind = "calibration" if cal.startswith("kappa_comm") else "none" if cal.startswith("none") else "assumed"
    rows.append(("kappa_comm (comm slowed by backward)", f"{model.kappa_comm:.2f}", kind, cal))
    rows.append(("all-reduce transfer time x", f"{model.comm_scale:.2f}", kind, cal))
    if model.strong:
        rows.append(("forward/backward x N_source/N", f"{model.src.world_size}/N", "assumed",
                     "strong scaling (fixed global batch): per-rank compute divides by the ranks"))
    rows.append(("bookkeeping after the last bucket", f"{model.tail_ms:.2f} ms", "measured",
                 "median over the source job's timed rank-steps"))
    return rows


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
        how = (f"kappa_comm 0, all-reduces' transfer time x {model.comm_scale:.2f}: the network fit is slower "
               "than the job's own all-reduces")
    elif at(kappa_comm=KAPPA_COMM_MAX) >= target:
        model.kappa_comm = _bisect(lambda k: at(kappa_comm=k), 0.0, KAPPA_COMM_MAX, target)
        how = f"kappa_comm {model.kappa_comm:.2f}"
    else:
        model.kappa_comm = KAPPA_COMM_MAX
        model.comm_scale = _bisect(lambda s: at(kappa_comm=KAPPA_COMM_MAX, comm_scale=s), 1.0, 50.0, target)
        how = f"kappa_comm {KAPPA_COMM_MAX:g} (bound), all-reduces' transfer time x {model.comm_scale:.2f}"
    model.calibration_source = (f"{how}: replaying the source's own buckets ends the last all-reduce at "
                                f"{target:.1f} ms from the step's start, as measured (median of {len(ends)})")
    return model


def _rank_steps(model: Model, n: int) -> dict[int, list[RankStep]]:
    """Per source step: up to ``n`` ranks in model units (source ranks reused cyclically)."""
    scale = model.src.world_size / n if model.strong else 1.0
    by_step: dict[int, list[RankStep]] = {}
    for tl in model.src.timelines:
        work = undilate(np.r_[tl.ready_ms, tl.fwd_ms + tl.bwd_ms], tl.comm_start, tl.comm_end,
                        model.kappa) - tl.fwd_ms
        by_step.setdefault(tl.step, []).append(
            RankStep(tl.fwd_ms * scale, np.maximum(work[:-1], 0) * scale, max(work[-1], 0) * scale, tl.opt_ms,
                     tl.start_ms))
    # ranks beyond the source's world size are copies of its ranks: the replay takes the max over
    # ranks of when each bucket is ready, which copies do not change, so at most the source's
    # ranks are replayed (1,024 ranks cost what the source's do; 65,536 took > 300 s)
    m = max(min(n, model.src.world_size), 1)
    return {s: [rs[i % len(rs)] for i in range(m)] for s, rs in by_step.items()}


def replay_cell(model: Model, world_size: int, bucket_mb: float, bandwidth_gbps: float | None = None,
                latency_us: float | None = None,
                bucket_ms: np.ndarray | None = None) -> tuple[dict, Replay, list[list[int]]]:
    """Replay every source step in one cell: the cell's medians over (rank, step), the replay of
    the step closest to the median, and the buckets (registration indices, launch order).
    ``bucket_ms``: each bucket's all-reduce time given outright (a measured job's own, for the
    benchmark's ablation) instead of the network model's."""
    bw = model.bandwidth_gbps if bandwidth_gbps is None else bandwidth_gbps
    lat = model.alpha_us if latency_us is None else latency_us
    buckets = pack_reverse(model.src.sizes.tolist(), bucket_mb, rule_for(model.src.variant))
    if model.fabric is not None:
        lat_o = latency_us if latency_us is not None else model.network_given[0]
        bw_o = bandwidth_gbps if bandwidth_gbps is not None else model.network_given[1]
        rings = [ring_parts(model.fabric, world_size, model.src.sizes[b].sum(), lat_o, bw_o) for b in buckets]
        parts = np.array([r[:2] for r in rings], float).reshape(-1, 2)
        # the row reports the bottleneck B and the mean alpha per ring step this world size gets
        bw = rings[0][2] if rings else bw
        lat = rings[0][3] if rings and world_size > 1 else lat
    else:
        parts = np.array([allreduce_parts(model.algo, world_size, model.src.sizes[b].sum(), lat, bw)
                          for b in buckets]).reshape(-1, 2)
    parts[:, 1] *= model.comm_scale  # the calibrated factor scales bytes' time, never the per-message α
    if bucket_ms is not None:
        if len(bucket_ms) != len(buckets):
            raise ValueError(f"{len(bucket_ms)} bucket times for {len(buckets)} buckets")
        parts = np.c_[np.zeros(len(buckets)), np.asarray(bucket_ms, float)]
    reps = {s: replay(r, buckets, parts[:, 0], parts[:, 1], model.kappa, model.streams, model.tail_ms,
                      model.kappa_comm)
            for s, r in _rank_steps(model, world_size).items()}
    cols: dict[str, list[float]] = {"step_ms": [], "comm_ms": [], "exposed_comm_ms": [], "compute_ms": [],
                                    "comm_end_ms": []}
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


#: The bucket sizes (MiB) swept by default when the run itself has only one: PyTorch DDP's
#: 25 MiB default, and a decade around it each way.
DEFAULT_SWEEP_MB = (1.0, 4.0, 25.0, 100.0)


def default_cells(run: Run, src: Source) -> tuple[list[float], list[int]]:
    """Bucket sizes: every size the run used (any variant, and the config's sweep), or
    :data:`DEFAULT_SWEEP_MB` with the source's when that is one size only; world sizes: those
    the run measured for the source's variant (plus the source's)."""
    cfg = (run.meta.get("config") or {}).get("bucket_sweep") or []
    sizes_mb = {float(b) for b in pd.to_numeric(run.jobs["bucket_mb"], errors="coerce").dropna()}
    buckets = {b for b in sizes_mb | {float(b) for b in cfg if isinstance(b, (int, float))} if b > 0} | {src.bucket_mb}
    if len(buckets) < 2:
        buckets |= set(DEFAULT_SWEEP_MB)
    j = run.jobs[run.jobs["variant"] == src.variant]
    sizes = sorted({int(n) for n in j["world_size"].dropna()} | {src.world_size})
    return sorted(buckets), sizes


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
    at = table[table["world_size"] == ws]
    if _kind(model.alpha_source) == "assumed" and at["buckets"].nunique() > 1:
        # bucket sizes differ by how many messages they send: with α assumed, which one is
        # faster is the assumption's answer, not the run's (the sample's 0.25 MiB job spends
        # ~1.8 ms per message in training where the default says 0.1 ms)
        table = table.assign(recommended=False)
        line = (f"recommendation: none: the per-message latency alpha is assumed ({model.alpha_us:g} µs, no "
                "measurement in this job), and bucket sizes differ in how many messages they send; give "
                "--latency-us, --fabric or --allreduce-run, or profile two bucket sizes, to decide")
    table, line = recommend_variant(table, line, zero1_rivals(summary, ws), ws, src.variant, src.bucket_mb,
                                    own_ms)
    return table[WHATIF_COLUMNS], line


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
    table, line = banded(model, with_measured(pred, measured_cells(summary, model.src.variant)), summary)
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
