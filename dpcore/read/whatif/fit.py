"""What the what-if model measures from a run: step timelines, compute dilation, alpha and B.

DataFrames in, model inputs out (no disk). Three measurements, each with its source recorded so
the CLI and the view can say where a number came from:

* **timelines** (:func:`job_timelines`): per timed (rank, step) of the source job, forward,
  optimizer, each gradient's ready time from grads.csv relative to backward's start, and the
  comm intervals in flight. A run without grads.csv falls back to the buckets' launch times in
  collectives.csv: each bucket's bytes are spread evenly (in pieces of at most 1 MiB) over the
  time since the previous bucket launched, so other bucket sizes can still be re-packed.
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

import numpy as np
import pandas as pd

from dpcore.contract.units import ranks_text
from dpcore.read.whatif.model import alpha_beta_from_line, fit_line, inflight_before, line_from_alpha_beta

MS = 1e6
MIB = 1024 * 1024
#: How a fit to the job's own collectives names its source (whatif.py keys the comm streams on it).
JOB_FIT = "job's collectives"
#: Fewest backward intervals with and without comm in flight for a within-job kappa.
MIN_SAMPLES = 8
#: α (µs) for a job whose buckets all have one size and no allreduce run: a stated default, the
#: per-message latency of gloo over loopback TCP (stand-alone `allreduce` runs of 4 KB on the
#: 2-core dev box: 90-120 µs per message when the machine was quiet).
DEFAULT_ALPHA_US = 100.0


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


def job_timelines(steps: pd.DataFrame, collectives: pd.DataFrame, grads: pd.DataFrame,
                  job_id: str) -> Source:
    """The source job's timed steps as :class:`Timeline` rows (see the module docstring).
    ValueError naming what is missing when the job has neither grads nor bucket collectives."""
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
    sizes = (gr.drop_duplicates("param").set_index("param")["bytes"].sort_index().to_numpy(float)
             if not gr.empty else None)
    cg = {k: g for k, g in co.groupby(["rank", "step"])}
    gg = {k: g for k, g in gr.groupby(["rank", "step"])} if not gr.empty else {}
    out = []
    for row in st.itertuples(index=False):
        key = (int(row.rank), int(row.step))
        t0 = float(row.t_start_ns)
        c = cg.get(key, co.iloc[0:0]).sort_values("seq")
        cs = (pd.to_numeric(c["t_launch_ns"]).to_numpy(float) - t0) / MS
        ce = (pd.to_numeric(c["t_end_ns"]).to_numpy(float) - t0) / MS
        if sizes is not None:
            g = gg.get(key)
            if g is None or len(g) != len(sizes):
                continue
            ready = np.empty(len(sizes))
            ready[g["param"].to_numpy(int)] = (pd.to_numeric(g["t_ready_ns"]).to_numpy(float) - t0) / MS
            step_sizes = sizes
        else:
            if c.empty:
                continue
            step_sizes, ready = _pieces(c.assign(launch_ms=cs - float(row.fwd_ms)))
            ready = ready + float(row.fwd_ms)
            if sizes is None:
                sizes = step_sizes
            if len(step_sizes) != len(sizes):
                continue
        out.append(Timeline(key[0], key[1], float(row.fwd_ms), float(row.bwd_ms), float(row.opt_ms),
                            float(row.step_ms), float(row.fwd_ms + row.bwd_ms + row.sync_ms), ready,
                            cs, ce, c["bytes"].to_numpy(float)))
    if not out or sizes is None:
        raise ValueError(f"job {job_id!r}: no step has a complete gradient timeline")
    algo = str(co["algo"].iloc[0]) if not co.empty else "native"
    return Source(job_id, str(first["variant"]), int(first["world_size"]), float(first["bucket_mb"]),
                  np.asarray(sizes, float), out, "grads.csv" if not gr.empty else "collectives.csv (fallback)",
                  algo)


def comm_in_backward(tl: Timeline) -> float:
    """Comm in flight during this rank's backward (ms): the O of bwd = W + kappa·O."""
    b0, b1 = tl.fwd_ms, tl.fwd_ms + tl.bwd_ms
    return float(inflight_before(np.array([b1]), tl.comm_start, tl.comm_end)[0]
                 - inflight_before(np.array([b0]), tl.comm_start, tl.comm_end)[0])


def kappa_within(src: Source) -> tuple[float, int]:
    """Kappa from the job alone, and how many intervals support it (0: cannot tell)."""
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
    return (float(np.clip(num / den, 0.0, 0.95)), support) if den > 0 else (float("nan"), 0)


def kappa_across(src: Source, baseline_bwd_ms: float) -> float:
    """Kappa from backward vs a comm-free baseline's backward: (bwd − bwd₀) / O (medians)."""
    bwd = float(np.median([tl.bwd_ms for tl in src.timelines]))
    o = float(np.median([comm_in_backward(tl) for tl in src.timelines]))
    if not (np.isfinite(baseline_bwd_ms) and o > 0):
        return float("nan")
    return float(np.clip((bwd - baseline_bwd_ms) / o, 0.0, 0.95))


def fit_kappa(src: Source, baseline_bwd_ms: float = float("nan")) -> tuple[float, str]:
    """(kappa, where it came from): across jobs against ``baseline_bwd_ms`` (the same variant's
    backward at world size 1, where no comm is in flight) when the run has one, else within the
    job when it has comm-free and comm-busy stretches of backward, else 0 (said so).

    Why across jobs first: the whole backward (glue, bucket staging and the last bucket's
    launch included) is compared, and medians of whole backwards resist a busy machine better
    than per-layer intervals; the within-job estimate sees only the layers' own intervals."""
    k = kappa_across(src, baseline_bwd_ms)
    if np.isfinite(k):
        return k, "across jobs (backward vs the same variant at world size 1, no comm)"
    k, support = kappa_within(src)
    if support:
        return k, f"within job ({support} backward intervals with vs without comm in flight)"
    return 0.0, "unmeasured (no comm-free backward in this run): assumed 0"


def service_times(src: Source) -> pd.DataFrame:
    """Per collective: bytes and serial-equivalent service time (ms), see the module docstring."""
    rows = []
    for tl in src.timelines:
        prev = -np.inf
        for s, e, b in zip(tl.comm_start, tl.comm_end, tl.comm_bytes):
            if np.isfinite(e) and e > s:
                rows.append((b, e - max(s, prev)))
                prev = max(prev, e)
    return pd.DataFrame(rows, columns=["bytes", "ms"])


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


def fit_network(src: Source, algo: str, allreduce: pd.DataFrame | None,
                latency_us: float | None, bandwidth_gbps: float | None) -> dict:
    """α (µs) and B (GB/s) for ``algo``, with their sources. Priority: the user's values, then
    the allreduce rows (same algorithm, nearest world size), then the job's own collectives
    (α only where its buckets differ enough in size; else from allreduce rows, else 0)."""
    n = src.world_size
    out = {"alpha_us": latency_us, "bandwidth_gbps": bandwidth_gbps,
           "alpha_source": "given" if latency_us is not None else "",
           "bandwidth_source": "given" if bandwidth_gbps is not None else ""}
    if latency_us is not None and bandwidth_gbps is not None:
        return out
    line = line_from_allreduce(allreduce, "native" if algo == "ring" else algo, n) if allreduce is not None else None
    if line is not None:
        alpha, bw = alpha_beta_from_line(algo, line[2], line[0], line[1])
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
    return out
