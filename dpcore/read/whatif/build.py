"""Measure the source job into a :class:`~dpcore.read.whatif.cells.Model`: :func:`build_model`.

The timelines, compute dilation kappa, alpha and B come from :mod:`dpcore.read.whatif.fit`, from
the job's in-job calibration in run.json first, each value only inside its plausible range;
without in-training alpha and B, the in-training comm slowdown kappa_comm is calibrated
(:func:`dpcore.read.whatif.calibrate.calibrate_comm`). A fabric preset replaces the messages
(:mod:`dpcore.read.whatif.fabrics`). Bad input (an unusable job, an algorithm or a network value
out of range) is a UsageError naming the valid choices.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from dpcore.contract.config import ALGOS
from dpcore.contract.errors import UsageError, choices_error
from dpcore.read.analysis.summary import job_summary
from dpcore.read.rundir.load import Run
from dpcore.read.whatif.calibrate import calibrate_comm, message_cost
from dpcore.read.whatif.cells import Model, replay_cell
from dpcore.read.whatif.fabrics import Network
from dpcore.read.whatif.fit import (
    BANDWIDTH_RANGE_GBPS,
    JOB_FIT,
    PER_MESSAGE_RANGE_MS,
    Source,
    calibration_of,
    fit_bucket_overhead,
    fit_kappa,
    fit_network,
    job_timelines,
    kappa_across,
    kappa_from_calibration,
    network_from_calibration,
    plausible_kappa,
)

#: Collectives a backend runs at once per process group: gloo's ProcessGroupGloo has 2 worker
#: threads (``Options::threads{2}`` in ProcessGroupGloo.hpp), NCCL one stream per group.
STREAMS = {"gloo": 2, "nccl": 1}


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
    return algo


#: kappa for a source without comm (world size 1), on a fabric or any other network: nothing measures it, so
#: it is an assumption with a band, and the band of every predicted step spans both ends. On GPU
#: an NCCL all-reduce in flight takes a few of the SMs and some memory bandwidth from backward;
#: 0.1 is the middle, 0 (comm free) and 0.3 the ends.
ASSUMED_KAPPA, ASSUMED_KAPPA_BAND = 0.1, (0.0, 0.3)


def _source_kappa(run: Run, src: Source, cal: dict | None,
                  overhead_ms: float) -> tuple[float, str, tuple[float, float] | None]:
    """(kappa, its source, its band or None): fitted (:func:`_kappa`) from a source of 2+ ranks;
    :data:`ASSUMED_KAPPA` and its band from a world-size-1 source, whatever network is asked about.

    Why: at one rank there is no comm to slow backward, so what a fit reads there is something
    else: on the sample run, bucketed-ws1-b1's "across jobs" fit gave 0.20, its backward against
    the median of the 1-rank jobs of every bucket size (their per-bucket cost, not comm), and was
    printed as fitted. Held-out 1 -> 2 cells (three rounds of 2026-11-28, on a loaded machine, each
    evaluated both ways): MAE 32.8 -> 32.2 %, inside their bands 50 -> 51 %."""
    if src.world_size >= 2:
        return (*_kappa(run, src, cal, overhead_ms), None)
    return ASSUMED_KAPPA, (f"assumed {ASSUMED_KAPPA:g}, band {ASSUMED_KAPPA_BAND[0]:g}-{ASSUMED_KAPPA_BAND[1]:g} "
                           "(a world-size-1 job has no comm to measure it from; an all-reduce in flight takes "
                           "some SMs and memory bandwidth from backward)"), ASSUMED_KAPPA_BAND


def _kappa(run: Run, src: Source, cal: dict | None, overhead_ms: float) -> tuple[float, str]:
    """kappa and its source: across jobs first (the source's backward against the same variant's
    comm-free backward at world size 1, :func:`_baseline_bwd`: medians over every timed step of
    both), else the in-job calibration (4 untimed steps per plan, less the plans' per-bucket cost
    of backward, ``overhead_ms``), else the job alone (:func:`fit_kappa`), else 0, said so.

    Why this order: both whole backwards are medians over every timed step (30 in the held-out
    runs), the calibration's over 4 untimed steps per plan; on the quiet held-out mlp-1024 at
    0.25 MiB the calibration gave kappa 0.58 where the backward against its baseline gave 0.44,
    and a too-large kappa undilates the source's backward to too little work (45 ms where its
    comm-free backward takes ~60), so cells with less comm in flight were predicted short.
    Chosen on the three-round held-out run (2 -> 2 MAE 9.5 -> 8.9 %) and checked on the three
    earlier sets, out of sample (8.1 -> 7.4 %)."""
    base = _baseline_bwd(run, src.variant)
    raw = kappa_across(src, base, clip=False)
    if plausible_kappa(raw):
        return raw, "across jobs (backward vs the same variant at world size 1, no comm)"
    kappa, ksrc = kappa_from_calibration(cal, src, overhead_ms)
    if not np.isfinite(kappa):
        kappa, ksrc2 = fit_kappa(src, base)
        ksrc = f"{ksrc2} ({ksrc})" if ksrc else ksrc2
    return kappa, ksrc


def _ranks_that_fit(run: Run) -> float:
    """Ranks whose compute threads a CPU run's cores hold at once (cores / threads per rank),
    from run.json's environment; 0 for GPU runs and where it is not recorded."""
    env = run.meta.get("environment") or {}
    try:
        cores, threads = float(env.get("cpu_cores") or 0), float(env.get("threads_per_rank") or 1)
    except (TypeError, ValueError):
        return 0.0
    return cores / threads if env.get("device") == "cpu" and cores > 0 and threads > 0 else 0.0


def _tail(src: Source) -> float:
    """Median bookkeeping after the last bucket (ms) over the source's timed rank-steps."""
    tails = [tl.sync_end_ms - max(tl.fwd_ms + tl.bwd_ms, float(np.max(tl.comm_end, initial=0.0)))
             for tl in src.timelines]
    return max(float(np.median(tails)), 0.0)


def _fabric_model(run: Run, job_id: str, net: Network, latency_us: float | None,
                  bandwidth_gbps: float | None) -> Model:
    """A model whose messages come from a fabric preset (:mod:`dpcore.read.whatif.fabrics`);
    from a world-size-1 source, kappa is :data:`ASSUMED_KAPPA` and its band."""
    try:
        src = job_timelines(run.steps, run.collectives, run.grads, job_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    overhead = fit_bucket_overhead(run.steps, src)
    kappa, ksrc, band = _source_kappa(run, src, calibration_of(run.meta, job_id), overhead[0])
    strong = (run.meta.get("config") or {}).get("scaling") == "strong"
    given = "given (overrides the fabric)"
    model = Model(src, kappa, ksrc, _tail(src), "ring",
                  net.intra.alpha_us if latency_us is None else latency_us,
                  net.intra.busbw_gbps if bandwidth_gbps is None else bandwidth_gbps,
                  f"fabric {net.label}: {net.intra.source}" if latency_us is None else given,
                  f"fabric {net.label}: {net.intra.source}" if bandwidth_gbps is None else given,
                  strong, 1, fabric=net, kappa_band=band, network_given=(latency_us, bandwidth_gbps))
    model.bucket_overhead_ms, model.bucket_overhead_source = overhead
    model.calibration_source = ("none (messages from a fabric preset, one NCCL stream; the source job's comm "
                                "does not describe that fabric)")
    return model


def build_model(run: Run, job_id: str, algo: str | None = None, latency_us: float | None = None,
                bandwidth_gbps: float | None = None, allreduce: pd.DataFrame | None = None,
                fabric: Network | None = None, summary: pd.DataFrame | None = None) -> Model:
    """Measure the source job and anchor it on its measured step (:func:`anchor`).
    ``allreduce``: allreduce.csv rows to fit α and B from (default: the run's own); ``fabric``:
    take the messages from a fabric preset instead (then ``latency_us`` / ``bandwidth_gbps``
    override the preset's); ``summary``: the run's ``job_summary`` rows the measured step comes
    from (what ``summarize`` prints; default: summarized here from the recorded intervals, without
    traces). UsageError naming the valid choices for an unusable job or algorithm."""
    model = _measure(run, job_id, algo, latency_us, bandwidth_gbps, allreduce, fabric)
    own_network = fabric is None and latency_us is None and bandwidth_gbps is None and allreduce is None
    if own_network:
        # what the calibration measured per message is the job's own network's: not a named one's
        model = message_cost(model, calibration_of(run.meta, job_id))
    else:
        model.message_source = "none (a network asked about: the job's own per-message cost does not describe it)"
    base, note = model, ""
    if not own_network and model.src.world_size >= 2:
        # a named network is not the one the source ran on: its replay of the source's own plan
        # would put the network's difference into the anchor, so the anchor is the one of the
        # job's own network (the fit the plain `whatif` makes)
        try:
            base = _measure(run, job_id, algo if fabric is None else None, None, None, None, None)
            note = "; with the network the job ran on (its own fit), not the one asked about"
        except UsageError:
            note = "; with the network asked about (the job's own could not be fitted)"
    if summary is None:
        summary = job_summary(run, None)
    return anchor(model, summary, base, note)


def anchor(model: Model, summary: pd.DataFrame, base: Model | None = None, note: str = "") -> Model:
    """``model`` with its anchor (``whatif.model`` item 8): the source job's measured median
    step (``summary``'s ``step_ms``, the number ``summarize`` prints) over the replay of its own
    plan (its bucket size at its world size) by ``base`` (default: ``model``); every cell's
    replayed step is multiplied by it, so the source's own cell predicts its measurement. No
    measured step: ratio 1, said so."""
    src = model.src
    row = summary.loc[summary["job_id"].astype(str) == src.job_id, "step_ms"]
    measured = float(row.iloc[0]) if not row.empty else float("nan")
    base = model if base is None else base
    own = replay_cell(replace(base, anchor_ratio=1.0), src.world_size, src.bucket_mb)[0]["step_ms"]
    if not (np.isfinite(measured) and np.isfinite(own) and own > 0):
        model.anchor_ratio = 1.0
        model.anchor_source = f"none (no measured step of {src.job_id} to anchor on)"
        return model
    model.anchor_ratio = measured / own
    carry = ("the same ratio at every cell; at another world size that is an assumption: what the replay misses "
             "at the source's world size is missed in proportion at every world size")
    if src.world_size == 1:
        carry += " (a 1-rank source's ratio holds no waits for other ranks: those are not in it)"
    model.anchor_source = (f"{src.job_id}'s median step {measured:.2f} ms over the replay of its own plan "
                           f"({src.bucket_mb:g} MiB at {src.world_size} rank{'s' if src.world_size > 1 else ''}) "
                           f"{own:.2f} ms{note}; {carry}")
    return model


def _measure(run: Run, job_id: str, algo: str | None, latency_us: float | None, bandwidth_gbps: float | None,
             allreduce: pd.DataFrame | None, fabric: Network | None) -> Model:
    """:func:`build_model` before the anchor: the fitted replay model alone."""
    algo = _check_job(run, job_id, algo)
    check_network(latency_us, bandwidth_gbps)
    if fabric is not None:
        return _fabric_model(run, job_id, fabric, latency_us, bandwidth_gbps)
    cal = calibration_of(run.meta, job_id)
    try:
        src = job_timelines(run.steps, run.collectives, run.grads, job_id)
        overhead = fit_bucket_overhead(run.steps, src)
        kappa, ksrc, band = _source_kappa(run, src, cal, overhead[0])
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
                  float(net["bandwidth_gbps"]), net["alpha_source"], net["bandwidth_source"], strong, streams,
                  kappa_band=band)
    model.bucket_overhead_ms, model.bucket_overhead_source = overhead
    model.ranks_that_fit = _ranks_that_fit(run)
    model.network_by_ws = dict(net.get("by_world_size") or {})
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
