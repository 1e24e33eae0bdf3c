"""A fitted what-if model (:class:`Model`) and its replay, one (world size, bucket size) cell at a time.

:func:`replay_cell` re-packs the source job's gradients into the cell's buckets, prices each
bucket's all-reduce (the network model or a fabric preset) and replays every source step
(:func:`dpcore.read.whatif.model.replay`); :func:`predict` gives one row per cell and
:func:`with_measured` adds the run's measured step where it has the same cell. Building the model
is :mod:`dpcore.read.whatif.build`'s; the bands and the recommendation are
:mod:`dpcore.read.whatif.predict`'s.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpcore.contract.buckets import pack_reverse, rule_for
from dpcore.read.rundir.load import Run
from dpcore.read.whatif.fabrics import Network, ring_parts
from dpcore.read.whatif.fit import Source
from dpcore.read.whatif.model import RankStep, Replay, allreduce_parts, rebucket_work, replay, undilate

#: docs/DESIGN.md's `whatif --csv` columns first, then the breakdown, the measurement and the model.
#: ``step_ms_lo``/``step_ms_hi``: the band (:mod:`dpcore.read.whatif.advice`); ``in_band``: the
#: measured cell inside it; ``recommended``: the cell the recommendation line names;
#: ``model_error_pct``/``band_from``: the model error in the band (the larger of its two sides,
#: ``model_error_lo_pct`` below the prediction and ``model_error_hi_pct`` above) and where it comes from;
#: ``unexplained_ms``: what the anchor adds to the cell's replayed step (the replay times
#: :attr:`Model.anchor_ratio` minus the replay: the share of the source's measured step that the
#: replay of its own plan does not account for, at this cell's size).
WHATIF_COLUMNS = ["world_size", "bucket_mb", "bandwidth_gbps", "latency_us", "step_ms", "comm_ms",
                  "exposed_comm_ms", "step_ms_lo", "step_ms_hi", "hidden_comm_ms", "compute_ms", "other_ms",
                  "buckets", "measured_step_ms", "error_pct", "in_band", "measured_job", "recommended", "kappa",
                  "algo", "model_error_pct", "band_from", "unexplained_ms", "model_error_lo_pct",
                  "model_error_hi_pct"]


_MEASURED_COLUMNS = [c for c in WHATIF_COLUMNS if c not in ("step_ms_lo", "step_ms_hi", "in_band", "recommended",
                                                            "model_error_pct", "band_from",
                                                            "model_error_lo_pct", "model_error_hi_pct")]


@dataclass
class Model:
    """A fitted what-if model of one source job (:func:`dpcore.read.whatif.build.build_model` fits it)."""

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
    #: compute the closing of one bucket costs backward (ms, :func:`dpcore.read.whatif.model.rebucket_work`)
    bucket_overhead_ms: float = 0.0
    bucket_overhead_source: str = "unmeasured: assumed 0"
    #: ranks whose compute threads the CPU's cores hold at once (cores / threads per rank; 0: not
    #: a CPU run, or unknown): see :func:`core_share`
    ranks_that_fit: float = 0.0
    #: (alpha_us, bandwidth_gbps) per world size an allreduce run measured: a cell at one of them
    #: takes that line (:func:`dpcore.read.whatif.fit.allreduce_lines`); empty otherwise
    network_by_ws: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: the source's measured median step over the replay of its own plan: every cell's replayed
    #: step is multiplied by it (``whatif.model`` item 8; :func:`dpcore.read.whatif.build.anchor`)
    anchor_ratio: float = 1.0
    anchor_source: str = "none (not anchored to a measured step)"
    #: in-training cost of one all-reduce that the alpha-beta replay misses (ms per bucket, exposed:
    #: added to the step before the anchor; ``whatif.model`` item 9,
    #: :func:`dpcore.read.whatif.calibrate.message_cost`)
    message_ms: float = 0.0
    message_source: str = "none (no in-job calibration with two plans to measure it from)"


def core_share(model: Model, n: int) -> float:
    """How much slower each rank computes at ``n`` ranks than at the source's, from sharing the
    machine's cores: ``max(1, n x threads per rank / cores)`` over the same at the source's world
    size. An assumption of the model (compute divides the cores evenly; gloo's own threads are
    left out): 1 where the ranks fit the cores, on GPU runs, and where the cores are unknown."""
    fit = model.ranks_that_fit
    if fit <= 0:
        return 1.0
    return max(1.0, n / fit) / max(1.0, model.src.world_size / fit)


def _rank_steps(model: Model, n: int, buckets: list[list[int]]) -> dict[int, list[RankStep]]:
    """Per source step: up to ``n`` ranks in model units (source ranks reused cyclically), the
    per-bucket cost of backward moved from the source's buckets to ``buckets``."""
    scale = model.src.world_size / n if model.strong else 1.0
    share = core_share(model, n)
    src_plan = pack_reverse(model.src.sizes.tolist(), model.src.bucket_mb, rule_for(model.src.variant))
    by_step: dict[int, list[RankStep]] = {}
    for tl in model.src.timelines:
        work = undilate(np.r_[tl.ready_ms, tl.fwd_ms + tl.bwd_ms], tl.comm_start, tl.comm_end,
                        model.kappa) - tl.fwd_ms
        ready, total = rebucket_work(np.maximum(work[:-1], 0), max(work[-1], 0), src_plan, buckets,
                                     model.bucket_overhead_ms)
        by_step.setdefault(tl.step, []).append(
            RankStep(tl.fwd_ms * scale * share, ready * scale * share, total * scale * share,
                     tl.opt_ms * share, tl.start_ms))
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
    if bandwidth_gbps is None and latency_us is None and world_size in model.network_by_ws:
        lat, bw = model.network_by_ws[world_size]
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
            for s, r in _rank_steps(model, world_size, buckets).items()}
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
    if bucket_ms is None and world_size > 1:
        # the per-message cost the replay misses is exposed comm: every bucket pays it on the step
        extra = model.message_ms * len(buckets)
        for k in ("step_ms", "comm_ms", "exposed_comm_ms", "comm_end_ms"):
            med[k] += extra
    med["hidden_comm_ms"] = med["comm_ms"] - med["exposed_comm_ms"]
    med["other_ms"] = max(med["step_ms"] - med["compute_ms"] - med["exposed_comm_ms"], 0.0)
    # the rank drawn is the one whose replay is closest to the replay's median, before the anchor
    rep = min(reps.values(), key=lambda rp: abs(float(np.median(rp.step_ms)) - med["step_ms"]))
    med["unexplained_ms"] = med["step_ms"] * (model.anchor_ratio - 1.0)
    med["step_ms"] += med["unexplained_ms"]
    row = {"world_size": int(world_size), "bucket_mb": float(bucket_mb), "bandwidth_gbps": bw,
           "latency_us": lat, **med, "buckets": len(buckets), "kappa": model.kappa, "algo": model.algo}
    return row, rep, buckets


def comm_hook_of(value: object) -> str:
    """A job's DDP comm hook as run.json records it ('' for none: absent, NaN, "none")."""
    if value is None or (isinstance(value, float) and np.isnan(value)) or str(value) in ("", "none"):
        return ""
    return str(value)


def measured_cells(summary: pd.DataFrame, variant: str, jobs: pd.DataFrame | None = None,
                   source_job: str | None = None) -> pd.DataFrame:
    """The run's completed jobs of ``variant``: job_id, world_size, bucket_mb, step_ms (summarize's).
    ``summary``: the run's :func:`dpcore.read.analysis.summary.job_summary` rows. A job whose ranks
    shared a GPU (``gpus_shared``) is no measured point: its ranks took turns on one device.
    With ``jobs`` (the run's jobs) and ``source_job``: only jobs with the source's comm hook (an
    fp16-compressed job at the same bucket size and ranks sends half the bytes: another cell, not
    a second measurement of this one)."""
    s = summary[(summary["variant"] == variant) & (summary["status"] == "complete")]
    if "gpus_shared" in s:
        s = s[~s["gpus_shared"].astype("boolean").fillna(False).astype(bool)]
    if jobs is not None and source_job is not None and "comm_hook" in jobs:
        hooks = {j: comm_hook_of(h) for j, h in zip(jobs["job_id"], jobs["comm_hook"])}
        s = s[[hooks.get(j, "") == hooks.get(source_job, "") for j in s["job_id"]]]
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
