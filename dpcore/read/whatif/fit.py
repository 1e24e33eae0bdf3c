"""What the what-if model measures from a run: step timelines, compute dilation, alpha and B.

DataFrames in, model inputs out (no disk). Three measurements, each with its source recorded so
the CLI and the view can say where a number came from:

* **timelines** (:func:`job_timelines`): per timed (rank, step) of the source job, when the
  rank started the step after the first rank did (``*_ns`` columns are one clock for all
  ranks, docs/DESIGN.md), forward,
  optimizer, each gradient's ready time from grads.csv relative to backward's start, and the
  comm intervals in flight. A run without grads.csv falls back to the buckets' launch times in
  collectives.csv: each bucket's bytes are spread evenly (in pieces of at most 1 MiB) over the
  time since the previous bucket launched, so other bucket sizes can still be re-packed. A GPU
  job timed with CUDA events is read on the stream's scale (its launches from ``t_start_ns``;
  grads.csv's host ready times give way to the same fallback, :func:`job_timelines`).
* **kappa** (:func:`fit_kappa`): the fraction of compute speed lost while comm is in flight.
  Within the job: the median backward interval ending at gradients of one size with comm in
  flight vs without (equal-sized gradients of a stack of equal layers cost the same work).
  Across jobs when the job has no comm-free stretch: backward of the job vs backward of the
  same variant at world size 1 (no comm), divided by the comm time in flight during backward.
* **alpha and B** (:func:`fit_network`): from allreduce.csv rows (nccl-tests style, one line
  t = a + b·S fitted with relative weights), or from the job's own collectives (serial-
  equivalent service time: a bucket's end minus max(its launch, the previous bucket's end), the
  time the comm stream spent on it), then inverted through the algorithm's alpha-beta formula.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpcore.contract.buckets import pack_reverse, rule_for
from dpcore.contract.calibration import fit as calibration_fit
from dpcore.contract.intervals import comm_start
from dpcore.contract.units import ranks_text
from dpcore.read.whatif.model import alpha_beta_from_line, fit_line, inflight_before, line_from_alpha_beta

MS = 1e6
MIB = 1024 * 1024
#: How a fit to the job's own collectives names its source (whatif.py keys the comm streams on it).
JOB_FIT = "job's collectives"
#: ``Source.grads_source`` of a GPU job recorded with events: grads.csv's ready times are host
#: times there, so the buckets' stream launches stand in for them (:func:`job_timelines`).
GRADS_FROM_STREAM = "collectives.csv (fallback: grads.csv ready times are host times on a GPU job)"
#: Fewest backward intervals with and without comm in flight for a within-job kappa.
MIN_SAMPLES = 8
#: α (µs) for a job whose buckets all have one size and no allreduce run: a stated default, the
#: per-message latency of gloo over loopback TCP (stand-alone `allreduce` runs of 4 KB on the
#: 2-core dev box: 90-120 µs per message when the machine was quiet).
DEFAULT_ALPHA_US = 100.0
#: Plausible range of kappa. Above 2/3 comm would take more than two thirds of a rank's compute
#: while in flight: on the 2-core box a rank's backward and gloo's 2 worker threads can at most
#: share its core three ways (on GPU NCCL kernels take far less). A fit above that comes from a
#: disturbed baseline (a 1-rank job 2-5x slower than the same backward at 2 ranks on a loaded
#: machine gave 0.95, the old clip), and replaying with it is not even an identity on the source
#: job: the replay takes kappa x the comm in flight out of the measured backward and puts back
#: only what its own comm overlaps (-4.5 % on the source's own cell against -0.9 % with kappa 0,
#: on a loaded run). Quiet-machine fits were 0.29-0.53 (docs/whatif.md).
KAPPA_RANGE = (0.0, 2.0 / 3.0)
#: Plausible range of kappa from the in-job calibration (dpcore.contract.calibration): the same
#: backward, alternating two bucket plans step by step in one process, so no other job's load
#: enters; it measured 0.76-0.99 with 0.25 MiB buckets on the loaded 2-core box (backward ~50 ms
#: longer with 30 small all-reduces in flight than with one). The bound is the replay's old clip.
KAPPA_RANGE_CAL = (0.0, 0.95)
#: Plausible in-training per-message cost (ms) and bandwidth (GB/s) of the in-job calibration:
#: outside, the fit is said to be implausible and the next source of alpha and B is used.
PER_MESSAGE_RANGE_MS = (0.0, 100.0)
BANDWIDTH_RANGE_GBPS = (1e-3, 1e4)


@dataclass
class Timeline:
    """One (rank, step) of the source job, times in ms from the step's start."""

    rank: int
    step: int
    fwd_ms: float
    bwd_ms: float
    opt_ms: float
    step_ms: float
    sync_end_ms: float
    ready_ms: np.ndarray          # by registration index, from the step's start
    comm_start: np.ndarray        # collectives of the step (launch), from the step's start
    comm_end: np.ndarray
    comm_bytes: np.ndarray
    start_ms: float = 0.0         # this rank's step start after the step's earliest rank's (ms)


@dataclass
class Source:
    """Everything measured about the source job that the replay needs."""

    job_id: str
    variant: str
    world_size: int
    bucket_mb: float
    sizes: np.ndarray             # gradient bytes by registration index
    timelines: list[Timeline]
    grads_source: str             # "grads.csv" or "collectives.csv (fallback)"
    algo: str                     # the collectives' algorithm column ("native", ...)


def _pieces(coll: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Fallback gradients of one (rank, step) from its buckets: sizes in registration order and
    ready times (ms from backward start in launch order, reversed to registration order)."""
    sizes, ready, prev = [], [], 0.0
    for nbytes, launch in zip(coll["bytes"], coll["launch_ms"]):
        k = max(1, int(np.ceil(nbytes / MIB)))
        sizes += [nbytes / k] * k
        ready += list(prev + (launch - prev) * np.arange(1, k + 1) / k)
        prev = launch
    return np.array(sizes[::-1]), np.array(ready[::-1])


def stream_timed(collectives: pd.DataFrame) -> bool:
    """Whether a job's collectives were timed on the device's stream (a CUDA job recorded with
    events): its rows carry ``t_start_ns``, the stream's time at the launch. The recorder fills
    that column only with an event clock; a CPU job, and a GPU job written before dpcore timed
    GPUs with events (all host times then), leave it empty. Recognised from the rows rather than
    run.json's ``device``, because such an older GPU run is on the host clock throughout."""
    if "t_start_ns" not in collectives or collectives.empty:
        return False
    start = pd.to_numeric(collectives["t_start_ns"], errors="coerce").to_numpy(float)
    return bool((np.isfinite(start) & (start >= 0)).any())


def job_timelines(steps: pd.DataFrame, collectives: pd.DataFrame, grads: pd.DataFrame,
                  job_id: str) -> Source:
    """The source job's timed steps as :class:`Timeline` rows (see the module docstring).
    ValueError naming what is missing when the job has neither grads nor bucket collectives.

    Every time of a timeline is measured from the step's start on one scale. On a CPU job that
    is the host clock throughout. On a GPU job recorded with events (:func:`stream_timed`) the
    step's start and phases and the collectives' ends are the stream's times, so a collective's
    launch is its ``t_start_ns`` (the stream's time at the call, the rule of
    :func:`dpcore.contract.calibration.launch_ns`), not ``t_launch_ns``: the host runs ahead of
    the stream, and the host time of the call can lie before backward began on the device.

    grads.csv's ``t_ready_ns`` is a host time on every device: when autograd on the host handed
    over the gradient (on a GPU, when its kernels were queued, not when they ran). It compares
    with ``t_launch_ns`` and comm_calls.csv, never with a GPU job's step start, phases or
    collective edges, and the run holds no host-side step start to measure it from. So on a GPU
    job recorded with events the ready times come from the buckets' stream launches instead, as
    for a run without grads.csv (``grads_source`` says so)."""
    st = steps[(steps["job_id"] == job_id) & ~steps["profiled"].astype(bool)]
    if st.empty:
        st = steps[steps["job_id"] == job_id]
    if st.empty:
        raise ValueError(f"job {job_id!r} has no steps in steps.csv")
    first = st.iloc[0]
    co = collectives[(collectives["job_id"] == job_id) & (collectives["op"] == "all_reduce")]
    gr = grads[grads["job_id"] == job_id] if grads is not None and not grads.empty else grads.iloc[0:0]
    if gr.empty and co.empty:
        raise ValueError(f"job {job_id!r} has no grads.csv rows and no all-reduce collectives: the what-if "
                         "model needs a bucketed or torch_ddp job of a multi-process run")
    events = stream_timed(co)
    host_grads = not gr.empty and events
    if host_grads:
        gr = gr.iloc[0:0]
    sizes = (gr.drop_duplicates("param").set_index("param")["bytes"].sort_index().to_numpy(float)
             if not gr.empty else None)
    first_start = st.groupby("step")["t_start_ns"].min()
    cg = {k: g for k, g in co.groupby(["rank", "step"])}
    gg = {k: g for k, g in gr.groupby(["rank", "step"])} if not gr.empty else {}
    out = []
    for row in st.itertuples(index=False):
        key = (int(row.rank), int(row.step))
        t0 = float(row.t_start_ns)
        c = cg.get(key, co.iloc[0:0]).sort_values("seq")
        launch = pd.to_numeric(c["t_launch_ns"]).to_numpy(float)
        if events:
            launch = comm_start(launch, pd.to_numeric(c["t_start_ns"], errors="coerce").to_numpy(float))
        cs = (launch - t0) / MS
        ce = (pd.to_numeric(c["t_end_ns"]).to_numpy(float) - t0) / MS
        if not gr.empty and sizes is not None:  # sizes: grads.csv's then
            g = gg.get(key)
            if g is None or len(g) != len(sizes):
                continue
            ready = np.empty(len(sizes))
            ready[g["param"].to_numpy(int)] = (pd.to_numeric(g["t_ready_ns"]).to_numpy(float) - t0) / MS
            step_sizes = sizes
        else:
            if c.empty:
                continue
            # every rank-step from its own buckets (``sizes`` is the first one's, kept as the
            # job's), so a run without usable ready times keeps all its timed steps
            step_sizes, ready = _pieces(c.assign(launch_ms=cs - float(row.fwd_ms)))
            ready = ready + float(row.fwd_ms)
            if sizes is None:
                sizes = step_sizes
            if len(step_sizes) != len(sizes):
                continue
        out.append(Timeline(key[0], key[1], float(row.fwd_ms), float(row.bwd_ms), float(row.opt_ms),
                            float(row.step_ms), float(row.fwd_ms + row.bwd_ms + row.sync_ms), ready,
                            cs, ce, c["bytes"].to_numpy(float), (t0 - float(first_start[key[1]])) / MS))
    if not out or sizes is None:
        raise ValueError(f"job {job_id!r}: no step has a complete gradient timeline")
    if not gr.empty:
        plan = pack_reverse(sizes.tolist(), float(first["bucket_mb"]), rule_for(str(first["variant"])))
        for tl in out:
            clamp_to_launch(tl, plan, sizes)
    algo = str(co["algo"].iloc[0]) if not co.empty else "native"
    grads_source = "grads.csv" if not gr.empty else GRADS_FROM_STREAM if host_grads else "collectives.csv (fallback)"
    return Source(job_id, str(first["variant"]), int(first["world_size"]), float(first["bucket_mb"]),
                  np.asarray(sizes, float), out, grads_source, algo)


def clamp_to_launch(tl: Timeline, plan: list[list[int]], sizes: np.ndarray) -> None:
    """A gradient is ready no later than the launch of the bucket that holds it (in place).

    Runs written by this version stamp each gradient before any variant hook runs (the trainer
    registers its grad-ready hook before the variant wraps the model), so the cap changes
    nothing for them. It is kept for runs written before that, the committed sample among them:
    there the stamp came from a hook that ran *after* the variant's own, and the variant's hook
    that completes a bucket launches its all-reduce first, so the stamp of a bucket's last
    gradient included the launch call (2-3 ms on a busy 2-core box, measured on the sample's
    ``bucketed-ws2-b25``: launch at 7.7 ms, last stamp at 10.3 ms). Replayed as it is, the bucket
    would start 2.7 ms late and the comm calibration would shrink every all-reduce to fit (the
    "all-reduces x 0.13" of the sample). Applied only where the step's all-reduces are the plan's
    buckets (same count and bytes), so other collectives are never matched to buckets."""
    if len(plan) != len(tl.comm_start) or not len(plan):
        return
    if not np.allclose([sizes[b].sum() for b in plan], tl.comm_bytes, rtol=0.02, atol=64):
        return
    for b, launch in zip(plan, tl.comm_start):
        if np.isfinite(launch):
            tl.ready_ms[b] = np.minimum(tl.ready_ms[b], launch)


def comm_in_backward(tl: Timeline) -> float:
    """Comm in flight during this rank's backward (ms): the O of bwd = W + kappa·O."""
    b0, b1 = tl.fwd_ms, tl.fwd_ms + tl.bwd_ms
    return float(inflight_before(np.array([b1]), tl.comm_start, tl.comm_end)[0]
                 - inflight_before(np.array([b0]), tl.comm_start, tl.comm_end)[0])


def kappa_within(src: Source, clip: bool = True) -> tuple[float, int]:
    """Kappa from the job alone, and how many intervals support it (0: cannot tell); ``clip``
    False gives the raw fit (for the plausibility check of :func:`fit_kappa`)."""
    rows = []
    for tl in src.timelines:
        order = np.argsort(tl.ready_ms)
        t = np.r_[tl.fwd_ms, tl.ready_ms[order]]
        inflight = inflight_before(t, tl.comm_start, tl.comm_end)
        d, o = np.diff(t), np.diff(inflight)
        ok = d > 0
        rows.append(pd.DataFrame({"size": src.sizes[order][ok], "d": d[ok], "f": o[ok] / d[ok]}))
    df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["size", "d", "f"])
    num = den = 0.0
    support = 0
    for _, g in df.groupby("size"):
        free, busy = g[g["f"] < 0.1]["d"], g[g["f"] > 0.9]["d"]
        n = min(len(free), len(busy))
        if n >= MIN_SAMPLES and busy.median() > 0:
            k = 1.0 - free.median() / busy.median()
            w = n * free.median()  # weight: samples x work per interval (layers, not glue)
            num, den, support = num + w * k, den + w, support + n
    if den <= 0:
        return float("nan"), 0
    k = num / den
    return (float(np.clip(k, 0.0, 0.95)) if clip else float(k)), support


def kappa_across(src: Source, baseline_bwd_ms: float, clip: bool = True) -> float:
    """Kappa from backward vs a comm-free baseline's backward: (bwd − bwd₀) / O (medians)."""
    bwd = float(np.median([tl.bwd_ms for tl in src.timelines]))
    o = float(np.median([comm_in_backward(tl) for tl in src.timelines]))
    if not (np.isfinite(baseline_bwd_ms) and o > 0):
        return float("nan")
    k = (bwd - baseline_bwd_ms) / o
    return float(np.clip(k, 0.0, 0.95)) if clip else float(k)


def plausible_kappa(k: float) -> bool:
    """Within :data:`KAPPA_RANGE`: outside, a fitted kappa is a disturbed measurement, not used."""
    return bool(np.isfinite(k) and KAPPA_RANGE[0] <= k <= KAPPA_RANGE[1])


def plausible_network(alpha_us: float, bandwidth_gbps: float) -> bool:
    """alpha within 0-100 ms and B within 1 MB/s-10 TB/s: outside, a fit is not used."""
    return bool(np.isfinite(alpha_us) and np.isfinite(bandwidth_gbps)
                and 0.0 <= alpha_us <= PER_MESSAGE_RANGE_MS[1] * 1e3
                and BANDWIDTH_RANGE_GBPS[0] <= bandwidth_gbps <= BANDWIDTH_RANGE_GBPS[1])


def calibration_of(meta: dict, job_id: str) -> dict | None:
    """The job's in-job calibration from run.json (``whatif_calibration``), or None. Where it
    holds the steps it came from (``data``) the fit is recomputed from them by the same function
    that wrote it (:func:`dpcore.contract.calibration.fit`), so a run written before a fix of
    the fit reads as a new one would."""
    for job in meta.get("jobs") or []:
        cal = job.get("whatif_calibration")
        if str(job.get("id")) == job_id and isinstance(cal, dict):
            try:
                return {**cal, **calibration_fit(cal["data"])} if cal.get("data") else cal
            except (KeyError, TypeError, ValueError):  # a hand-edited entry: its stored numbers
                return cal
    return None


def _num(v: object) -> float:
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")


def _plans_text(cal: dict) -> str:
    plans = cal.get("plans") or []
    mbs = " and ".join(f"{_num(p.get('bucket_mb')):g} MiB" for p in plans)
    return (f"in-job calibration ({cal.get('steps_per_plan', '?')} untimed steps per plan, buckets of {mbs}, "
            f"cost {_num(cal.get('cost_ms')):.0f} ms)")


def kappa_from_calibration(cal: dict | None, src: Source | None = None,
                           overhead_ms: float = 0.0) -> tuple[float, str]:
    """(kappa, why) from the in-job calibration; NaN with the reason when absent or implausible.

    The two plans differ in bucket count as well as in comm in flight, and closing a bucket
    costs backward ``overhead_ms`` (:func:`fit_bucket_overhead`) with or without comm, so that
    part of the plans' difference in backward is not comm's slowdown: with the source ``src``
    it is taken out, kappa = (Δ backward − overhead · Δ buckets) / Δ comm in flight. Without
    it the held-out mlp-256 at 0.25 MiB had kappa 0.57, its backward undilated to 0.7 ms of work
    where every other bucket size of it had ~5."""
    if not cal:
        return float("nan"), ""
    k = _num(cal.get("kappa"))
    lo, hi = KAPPA_RANGE_CAL
    if not np.isfinite(k):
        why = cal.get("note") or cal.get("error") or "no data"
        return float("nan"), f"{_plans_text(cal)}: kappa not fitted ({why})"
    less = ""
    plans = cal.get("plans") or []
    if src is not None and overhead_ms > 0 and len(plans) == 2:
        n = [len(pack_reverse(src.sizes.tolist(), _num(p.get("bucket_mb")), rule_for(src.variant))) for p in plans]
        d_o = _num(plans[1].get("inflight_ms")) - _num(plans[0].get("inflight_ms"))
        if np.isfinite(d_o) and d_o != 0 and n[0] != n[1]:
            k -= overhead_ms * (n[1] - n[0]) / d_o
            less = f", less {overhead_ms:.2f} ms per bucket for the plans' {n[0]} and {n[1]} buckets"
    if not lo <= k <= hi:
        return float("nan"), f"{_plans_text(cal)} gave {k:.2f}{less}, outside the plausible {lo:g}-{hi:g}: not used"
    return k, f"{_plans_text(cal)}: backward with vs without the second plan's comm in flight{less}"


def network_from_calibration(cal: dict | None, algo: str, n: int) -> tuple[dict | None, str]:
    """(alpha_us, bandwidth_gbps and their sources) from the in-job calibration's line, or
    (None, why not)."""
    if not cal:
        return None, ""
    a, b_mib = _num(cal.get("per_message_ms")), _num(cal.get("ms_per_mib"))
    if not (np.isfinite(a) and np.isfinite(b_mib) and b_mib > 0):
        return None, f"{_plans_text(cal)}: no line ({cal.get('note') or cal.get('error') or 'no data'})"
    alpha, bw = alpha_beta_from_line(algo, n, a, b_mib / MIB)
    if not (PER_MESSAGE_RANGE_MS[0] <= a <= PER_MESSAGE_RANGE_MS[1]
            and BANDWIDTH_RANGE_GBPS[0] <= bw <= BANDWIDTH_RANGE_GBPS[1]):
        return None, (f"{_plans_text(cal)} gave {a:.2f} ms per message and {bw:.3g} GB/s, outside the "
                      f"plausible {PER_MESSAGE_RANGE_MS[1]:g} ms and {BANDWIDTH_RANGE_GBPS[0]:g}-"
                      f"{BANDWIDTH_RANGE_GBPS[1]:g} GB/s: not used")
    src = f"{_plans_text(cal)}: {a:.2f} ms per message, {b_mib:.2f} ms per MiB during training"
    return {"alpha_us": alpha, "bandwidth_gbps": bw, "alpha_source": src, "bandwidth_source": src}, ""


def fit_kappa(src: Source, baseline_bwd_ms: float = float("nan")) -> tuple[float, str]:
    """(kappa, where it came from): across jobs against ``baseline_bwd_ms`` (the same variant's
    backward at world size 1, where no comm is in flight) when the run has one, else within the
    job when it has comm-free and comm-busy stretches of backward, else 0 (said so). A fit
    outside :data:`KAPPA_RANGE` is not used: the next one is, and the source says so.

    Why across jobs first: the whole backward (glue, bucket staging and the last bucket's
    launch included) is compared, and medians of whole backwards resist a busy machine better
    than per-layer intervals; the within-job estimate sees only the layers' own intervals."""
    rejected = []
    raw = kappa_across(src, baseline_bwd_ms, clip=False)
    if plausible_kappa(raw):
        return raw, "across jobs (backward vs the same variant at world size 1, no comm)"
    if np.isfinite(raw):
        rejected.append(f"across jobs {raw:.2f}")
    k, support = kappa_within(src, clip=False)
    if support and plausible_kappa(k):
        return k, f"within job ({support} backward intervals with vs without comm in flight)"
    if support:
        rejected.append(f"within job {k:.2f}")
    lo, hi = KAPPA_RANGE
    why = (f" (fitted {', '.join(rejected)}: outside the plausible {lo:.2f}-{hi:.2f}, a disturbed measurement;"
           " not used)" if rejected else "")
    if rejected:
        return 0.0, "assumed 0" + why
    return 0.0, "unmeasured (no comm-free backward in this run): assumed 0"


def service_times(src: Source) -> pd.DataFrame:
    """Per collective: bytes, serial-equivalent service time (ms, see the module docstring) and
    ``k``, its position among the step's all-reduces (the bucket, in launch order)."""
    rows = []
    for tl in src.timelines:
        prev = -np.inf
        for k, (s, e, b) in enumerate(zip(tl.comm_start, tl.comm_end, tl.comm_bytes)):
            if np.isfinite(e) and e > s:
                rows.append((b, e - max(s, prev), k))
                prev = max(prev, e)
    return pd.DataFrame(rows, columns=["bytes", "ms", "k"])


def line_from_allreduce(allreduce: pd.DataFrame, algo: str, n: int) -> tuple[float, float, int] | None:
    """(a ms, b ms/byte, world size used) from allreduce.csv rows of ``algo`` at the world size
    closest to ``n`` (>= 2), or None when there are none."""
    if allreduce is None or allreduce.empty:
        return None
    rows = allreduce[(allreduce["algo"] == algo) & (allreduce["world_size"] >= 2)]
    if rows.empty:
        return None
    ws = int(min(rows["world_size"].unique(), key=lambda w: (abs(w - n), w)))
    r = rows[rows["world_size"] == ws]
    t = r["time_ms"].to_numpy(float)
    a, b = fit_line(r["bytes"].to_numpy(float), t, 1.0 / np.maximum(t, 1e-9) ** 2)
    return a, b, ws


def allreduce_lines(allreduce: pd.DataFrame, algo: str) -> dict[int, tuple[float, float]]:
    """(α µs, B GB/s) of ``algo`` at every world size >= 2 the allreduce rows measured (each
    fitted as :func:`line_from_allreduce` does; implausible fits left out). Why per world size:
    gloo on a CPU box does not follow the ring formula from 2 ranks to 3 (the committed-style
    run at 3 ranks on 2 cores: 0.83 ms per message against 0.22 ms at 2), so a cell at a world
    size the run measured takes that world size's line, not the one nearest the source's."""
    out: dict[int, tuple[float, float]] = {}
    rows = allreduce[(allreduce["algo"] == ("native" if algo == "ring" else algo)) & (allreduce["world_size"] >= 2)]
    for ws in sorted({int(w) for w in rows["world_size"]}):
        line = line_from_allreduce(rows, "native" if algo == "ring" else algo, ws)
        if line is not None and line[2] == ws:
            alpha, bw = alpha_beta_from_line(algo, ws, line[0], line[1])
            if plausible_network(alpha, bw):
                out[ws] = (alpha, bw)
    return out


def fit_network(src: Source, algo: str, allreduce: pd.DataFrame | None,
                latency_us: float | None, bandwidth_gbps: float | None) -> dict:
    """α (µs) and B (GB/s) for ``algo``, with their sources. Priority: the user's values, then
    the allreduce rows (same algorithm, nearest world size), then the job's own collectives
    (α only where its buckets differ enough in size; else from allreduce rows, else 0)."""
    n = src.world_size
    out: dict[str, Any] = {"alpha_us": latency_us, "bandwidth_gbps": bandwidth_gbps,
           "alpha_source": "given" if latency_us is not None else "",
           "bandwidth_source": "given" if bandwidth_gbps is not None else ""}
    if latency_us is not None and bandwidth_gbps is not None:
        return out
    line = line_from_allreduce(allreduce, "native" if algo == "ring" else algo, n) if allreduce is not None else None
    rejected = ""
    if line is not None:
        alpha, bw = alpha_beta_from_line(algo, line[2], line[0], line[1])
        if not plausible_network(alpha, bw):
            rejected = (f" (allreduce.csv gave alpha {alpha:.3g} us and B {bw:.3g} GB/s, outside the plausible "
                        f"{PER_MESSAGE_RANGE_MS[1] * 1e3:g} us and {BANDWIDTH_RANGE_GBPS[0]:g}-"
                        f"{BANDWIDTH_RANGE_GBPS[1]:g} GB/s: not used)")
            line = None
    if line is not None:
        if latency_us is None and bandwidth_gbps is None:
            out["by_world_size"] = allreduce_lines(allreduce, algo)
        for key, val in (("alpha_us", alpha), ("bandwidth_gbps", bw)):
            if out[key] is None:
                out[key] = val
                out[key.split("_")[0] + "_source"] = f"allreduce.csv, {algo} at {ranks_text(line[2])}"
        return out
    sv = service_times(src)
    if n < 2 or sv.empty:
        raise ValueError(f"job {src.job_id!r} has no timed all-reduces at world size >= 2 to fit alpha "
                         "and B from; give --latency-us and --bandwidth-gbps, or an allreduce run")
    x, y = sv["bytes"].to_numpy(float), sv["ms"].to_numpy(float)
    varied = x.min() > 0 and x.max() / x.min() >= 4
    if out["alpha_us"] is not None or not varied:
        a_ms = line_from_alpha_beta(algo, n, DEFAULT_ALPHA_US if out["alpha_us"] is None else out["alpha_us"],
                                    1.0)[0]
        b = max(float(np.sum(x * (y - a_ms)) / np.sum(x * x)), 1e-300)
    else:
        a_ms, b = fit_line(x, y)
    if not b > 1e-12:  # sizes do not explain the times (or all are within the latency): a
        # bandwidth of infinity would say "bytes are free"; fit the times as pure transfer
        # instead, a stated upper bound on the per-byte cost
        a_ms, b = 0.0, float(np.sum(x * y) / np.sum(x * x))
        degenerate = True
    else:
        degenerate = False
    alpha, bw = alpha_beta_from_line(algo, n, a_ms, b)
    src_txt = f"{JOB_FIT} ({len(x)} all-reduces, serial-equivalent service times)"
    if out["alpha_us"] is None:
        out["alpha_us"] = alpha
        out["alpha_source"] = (
            "not fitted: the job's all-reduce times do not grow with their bytes, so all of "
            "their time is charged to B (alpha 0; give --latency-us or an allreduce run)"
            if degenerate else src_txt if varied else
            f"unknown (buckets of one size, no allreduce run): default {DEFAULT_ALPHA_US:g} µs")
    if out["bandwidth_gbps"] is None:
        out["bandwidth_gbps"], out["bandwidth_source"] = bw, src_txt
        if not plausible_network(0.0, bw):  # nothing measured is left to fall back to: said so
            out["bandwidth_source"] += (f" (implausible: outside {BANDWIDTH_RANGE_GBPS[0]:g}-"
                                        f"{BANDWIDTH_RANGE_GBPS[1]:g} GB/s; give --bandwidth-gbps)")
    out["alpha_source"] += rejected
    return out


def fit_bucket_overhead(steps: pd.DataFrame, src: Source) -> tuple[float, str]:
    """(ms of backward per bucket, where it came from): the slope of the median backward over
    bucket count across the run's jobs of the source's variant at world size 1, where no comm
    is in flight to slow backward, so what grows with the buckets is their own cost on the
    compute thread (staging, the hook, the launch). Needs two bucket counts; else 0, said so.

    Why it matters: the replay keeps the source's backward, and with it the cost of the
    source's buckets. Without this term a 1-bucket source predicted a 30-bucket cell low by the
    29 buckets' cost and a 30-bucket source every other cell high (the sample's mlp: backward
    4.9 ms with 1 bucket, 11.2 ms with 30, at world size 1)."""
    st = steps[(steps["variant"] == src.variant) & (steps["world_size"] == 1) & ~steps["profiled"].astype(bool)]
    rule = rule_for(src.variant)
    pts = [(len(pack_reverse(src.sizes.tolist(), float(mb), rule)), float(g["bwd_ms"].median()))
           for mb, g in st.groupby("bucket_mb") if np.isfinite(mb) and mb > 0]
    counts = {n for n, _ in pts}
    if len(counts) < 2:
        return 0.0, ("unmeasured (no world-size-1 jobs of the variant at two bucket counts): assumed 0 ms "
                     "per bucket; profile world size 1 at two bucket sizes to measure it")
    x, y = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
    _, b = fit_line(x, y)
    b = max(float(b), 0.0)
    return b, (f"across jobs: backward of {len(pts)} world-size-1 {src.variant} jobs "
               f"({int(x.min())}-{int(x.max())} buckets, no comm), slope per bucket")
