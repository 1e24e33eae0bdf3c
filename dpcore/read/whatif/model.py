"""The what-if replay model: one measured step, replayed with other buckets, ranks or networks.

Trace-driven replay in the spirit of Lumos (Liang et al. 2025, replay of torch.profiler traces)
and dPRO (Hu et al. 2022, replay of a DAG of ops and comm): keep what was measured (forward,
the backward timeline with each gradient's ready time, the optimizer), change only the
communication, and replay the overlap of the two. Pure numpy; no torch, no pandas, no disk.

The model, and every assumption it makes:

1. **Compute is what was measured, minus the slowdown comm inflicted on it.** Backward is a
   stream of work; gradient ``i`` is ready when ``ready_work[i]`` ms of it are done. While an
   all-reduce is in flight compute runs at rate ``1 - kappa`` (on CPU gloo's threads share the
   rank's cores with backward; on GPU NCCL kernels share SMs and memory bandwidth), else at
   rate 1. ``kappa`` is measured (see ``whatif.fit.fit_kappa``), never assumed 0; the measured
   timeline is first "undilated" with it (:func:`undilate`), then re-dilated by the replayed
   comm. Forward and optimizer have no comm in flight (DDP syncs inside backward) and are
   kept as measured.
2. **Buckets as DDP builds them.** Gradients are re-packed in reverse registration order
   (``dpcore.contract.buckets``); a bucket is ready when its last gradient is ready on EVERY
   rank (an all-reduce cannot finish before its last participant joins).
3. **The comm stream, in bucket order** (as DDP's reducer launches them): bucket k starts when
   it is ready on every rank and bucket k-1 is done; it takes its alpha-beta time
   (:func:`allreduce_ms`): first its latency part, then its transfer part. That is NCCL's one
   stream (``streams=1``). gloo's process group runs up to 2 collectives at once (2 worker
   threads), so for gloo ``streams=2``: bucket k may start once bucket k-2 is done, latencies
   overlap and the transfers in flight share the bandwidth equally. That holds for α and B of
   one collective alone (an ``allreduce`` run, the user's); α and B fitted to a job's own
   serial-equivalent service times already contain the concurrency and replay with 1 stream.
   **Compute slows comm too** (``kappa_comm``): while backward runs on any participant, an
   in-flight all-reduce (latency and transfer alike) progresses at rate ``1 - kappa_comm``,
   else at rate 1: a collective goes at the pace of its slowest rank, and on a CPU box gloo's
   threads get the core only part of the time while backward holds it (thread wake-ups per
   message included, which is why small buckets suffer most). Nothing measures it directly, so
   it is either in alpha and B already (measured during backward by the job's in-job
   calibration, ``dpcore.contract.calibration``: then no further calibration), or
   *calibrated on the source job* (``whatif.calibrate_comm``): the value with which the
   replay of the source's own bucket plan ends its last all-reduce when collectives.csv says it
   did. Assumption: the slowdown is a property of the machine and the model's compute, not of
   the bucket size, so it carries over to other buckets. When the network measurement is slower
   than the job's comm even with ``kappa_comm = 0`` (a disturbed ``allreduce`` run), every
   all-reduce's transfer time (never its per-message α, which one bucket size cannot tell) is
   scaled by a ``comm_scale < 1`` instead; at the bound, ``comm_scale > 1`` on top. A network the
   user names (or a fabric preset) is not calibrated: the source's comm says nothing about it.
   (Before this term the replay of a 32 MB job predicted its own step 18 % short: its 28 MiB
   buckets took 30-40 ms in the job against ~13 ms stand-alone.)
4. **Step** = forward + max(backward end, last all-reduce end) + ``tail_ms`` (measured
   bookkeeping after the last bucket: waits, DDP's copy-out) + optimizer.
5. **Alpha-beta per algorithm** (Thakur et al. 2005; the busbw convention of nccl-tests):
   ring/native 2(N-1)·α + 2(N-1)/N · S/B; central (gather to rank 0, reduce, broadcast)
   2(N-1)·(α + S/B); naive (every rank sends its tensor to every other) (N-1)·(α + S/B).
   One rank moves nothing: 0. ``B`` is the per-link bandwidth the formula divides by.

6. **Closing a bucket costs backward** a fixed ``overhead_ms`` (staging, the hook, the launch),
   comm or not: :func:`rebucket_work` moves it from the source's buckets to the cell's. Measured
   across the run's world-size-1 jobs (``whatif.fit.fit_bucket_overhead``), else 0, said so.
7. **Ranks beyond a CPU's cores share them** (``whatif.cells.core_share``): compute is scaled by
   max(1, N / ranks the cores hold) over the same at the source's N. Assumed, printed.
8. **Anchored on the source's measured step.** The replay of the source's own plan (its bucket
   size at its world size) may miss part of the source's measured median step; every cell's
   replayed step is multiplied by measured / replayed (``whatif.build.anchor``; what that adds is
   the measured ``unexplained_ms``), so the source's own cell predicts its measurement exactly.
   On the quiet held-out mlp-1024 run a 2-rank 1 MiB job measured 136.8 ms where the replay gave
   103.7: its ranks wait for each other after backward (sync 19.7 ms against 1.8 ms of exposed
   comm replayed), and slow steps are slow in several phases at once (median of the step sums
   136.8, sum of the phase medians 126.9), neither of which a replay of per-phase timelines
   reproduces. A ratio, not an added residual: on the held-out cells it erred less (15.5 % MAE
   against 21.8 %), because a 0.25 MiB source's large residual (in-training per-message cost)
   added to a 4 MiB cell's small step tripled it. Assumption: the ratio holds at every bucket
   size and world size; for a 1-rank source (1 -> N) it holds no waits for other ranks.
9. **Each all-reduce costs the step a measured ``message_ms`` the alpha-beta line misses**
   (``whatif.calibrate.message_cost``). The in-job calibration ran the source's backward with
   two bucket plans (1 and 30 all-reduces, say); replaying both, the many-message plan's last
   all-reduce ends far later in training than replayed (mlp-256 on the quiet held-out run: 28.1
   ms late with thirty 0.25 MiB buckets, 1.5 ms with one 4 MiB bucket: 0.92 ms per message; gloo's
   wake-ups and per-collective setup, which a line through service times dominated by tiny and
   huge messages does not carry). That difference over the difference in message counts is added
   per bucket to every cell's step, as exposed comm, before the anchor: the anchor's ratio then
   covers only what does not scale with the messages. Without it a one-bucket source predicted
   the 30-bucket cell 60 % low, and a 30-bucket source, whose large residual the ratio spread over
   compute and comm alike, every 1-bucket cell 100 % high. Needs plans whose message counts
   differ twofold (else 0, said so); not for a network the user names or a fabric.

What it cannot know: changes in compute with world size beyond the batch (weak scaling keeps
the per-rank batch; strong scaling scales forward/backward by N_src/N), memory effects of other
bucket sizes, stragglers, and how much slower comm runs in training than alone where the source
has no comm to calibrate it on (a world-size-1 source on oversubscribed cores).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpcore.contract.config import ALGOS  # the model knows every algorithm allreduce runs, in its order
from dpcore.contract.intervals import clip, merge, union_length


def allreduce_ms(algo: str, n: int, nbytes: float, alpha_us: float, bandwidth_gbps: float) -> float:
    """Time of one all-reduce of ``nbytes`` over ``n`` ranks by the alpha-beta model (ms).

    ``alpha_us``: per-message latency; ``bandwidth_gbps``: per-link bandwidth in GB/s (1e9 B/s).
    """
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; valid choices: {', '.join(ALGOS)}")
    if n <= 1 or nbytes <= 0:
        return 0.0
    if bandwidth_gbps <= 0:
        return float("inf")
    a, b = line_from_alpha_beta(algo, n, alpha_us, bandwidth_gbps)
    return a + b * nbytes


def allreduce_parts(algo: str, n: int, nbytes: float, alpha_us: float,
                    bandwidth_gbps: float) -> tuple[float, float]:
    """:func:`allreduce_ms` split into its latency part (α terms) and transfer part (S/B terms)."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; valid choices: {', '.join(ALGOS)}")
    if n <= 1 or nbytes <= 0:
        return 0.0, 0.0
    a, b = line_from_alpha_beta(algo, n, alpha_us, bandwidth_gbps)
    return a, b * nbytes


def fit_line(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> tuple[float, float]:
    """Least-squares ``y = a + b·x`` (a clipped at 0, the latency cannot be negative)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    w = np.ones_like(x) if weights is None else np.asarray(weights, float)
    if x.size == 0:
        return float("nan"), float("nan")
    if x.size == 1 or np.ptp(x) == 0:
        return 0.0, float(np.sum(w * y) / max(np.sum(w * x), 1e-300))
    sw = np.sqrt(w)
    a, b = np.linalg.lstsq(np.c_[np.ones_like(x), x] * sw[:, None], y * sw, rcond=None)[0]
    if a < 0:
        return 0.0, float(np.sum(w * x * y) / np.sum(w * x * x))
    return float(a), float(b)


def _factors(algo: str, n: int) -> tuple[float, float]:
    """(messages on the critical path, bytes moved per byte of payload) of one all-reduce."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; valid choices: {', '.join(ALGOS)}")
    return {"ring": (2 * (n - 1), 2 * (n - 1) / n), "native": (2 * (n - 1), 2 * (n - 1) / n),
            "central": (2 * (n - 1), 2 * (n - 1)), "naive": (n - 1, n - 1)}[algo]


def alpha_beta_from_line(algo: str, n: int, a_ms: float, b_ms_per_byte: float) -> tuple[float, float]:
    """Invert :func:`allreduce_ms`: a measured ``t = a + b·S`` at ``n`` ranks -> (α µs, B GB/s)."""
    if n <= 1:
        raise ValueError("an all-reduce over 1 rank moves nothing: alpha and B need n >= 2")
    lat, bw = _factors(algo, n)
    bandwidth = bw / (b_ms_per_byte / 1e3) / 1e9 if b_ms_per_byte > 0 else float("inf")
    return a_ms / lat * 1e3, bandwidth


def line_from_alpha_beta(algo: str, n: int, alpha_us: float, bandwidth_gbps: float) -> tuple[float, float]:
    """:func:`allreduce_ms` as ``t = a + b·S`` at ``n`` ranks: (a ms, b ms per byte)."""
    lat, bw = _factors(algo, n)
    return lat * alpha_us / 1e3, bw / (bandwidth_gbps * 1e9) * 1e3


def inflight_before(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each time in ``t``: how long comm was in flight before it (union of [start, end))."""
    t = np.asarray(t, float)
    ms_a, me_a = merge(starts, ends)
    if ms_a.size == 0:
        return np.zeros_like(t)
    return np.clip(t[:, None] - ms_a[None, :], 0, (me_a - ms_a)[None, :]).sum(axis=1)


def undilate(t: np.ndarray, comm_starts: np.ndarray, comm_ends: np.ndarray, kappa: float) -> np.ndarray:
    """Measured backward times -> work done by then: t − kappa · (comm in flight before t)."""
    return np.asarray(t, float) - kappa * inflight_before(t, comm_starts, comm_ends)


def rebucket_work(ready_work: np.ndarray, bwd_work: float, src_buckets: list[list[int]],
                  buckets: list[list[int]], overhead_ms: float) -> tuple[np.ndarray, float]:
    """Move the per-bucket launch cost of backward from the source's buckets to ``buckets``.

    Closing a bucket costs the compute thread ``overhead_ms`` (staging its gradients, the hook,
    launching the collective), spent right after the bucket's last gradient is ready, so every
    later gradient is ready that much later. The source's timeline holds its own buckets' cost;
    a plan with 30 buckets instead of 1 pays 29 more (the sample's mlp at world size 1, no comm:
    backward 4.9 ms with one bucket, 11.2 ms with thirty). Work units (ms of undisturbed
    compute); the source's own plan is returned unchanged."""
    ready = np.asarray(ready_work, float)
    if overhead_ms <= 0 or ready.size == 0:
        return ready, float(bwd_work)

    def closes(work: np.ndarray, plan: list[list[int]]) -> np.ndarray:
        return np.sort([work[b].max() for b in plan if len(b)])

    src_close = closes(ready, src_buckets)
    pure = ready - overhead_ms * np.searchsorted(src_close, ready, side="left")
    pure_total = float(bwd_work) - overhead_ms * len(src_close)
    new_close = closes(pure, buckets)
    out = pure + overhead_ms * np.searchsorted(new_close, pure, side="left")
    return np.maximum(out, 0.0), max(pure_total + overhead_ms * len(new_close), float(out.max(initial=0.0)))


@dataclass(frozen=True)
class RankStep:
    """One rank's measured step in model units (ms from the step's start; work in ms of
    undisturbed compute). ``ready_work`` is indexed by registration index."""

    fwd_ms: float
    ready_work: np.ndarray
    bwd_work: float
    opt_ms: float
    #: when the rank started this step, ms after the step's earliest rank did (ranks do not start
    #: a step at the same instant: up to 8 ms apart on a loaded 2-core box). A bucket is ready
    #: when its gradients are ready on every rank *in one clock*; each rank's own times are from
    #: its own start, so they are shifted by this before the max over ranks is taken.
    start_ms: float = 0.0


@dataclass
class Replay:
    """The replayed step (ms from the earliest rank's start): per bucket when it was ready on
    every rank, started and ended; per rank forward end, backward end, step time (from its own
    start ``start_ms``), comm C and exposed comm E."""

    bucket_ready: np.ndarray
    bucket_start: np.ndarray
    bucket_end: np.ndarray
    fwd_ms: np.ndarray
    bwd_end: np.ndarray
    step_ms: np.ndarray
    comm_ms: np.ndarray
    exposed_ms: np.ndarray
    start_ms: np.ndarray | None = None


def replay(ranks: list[RankStep], buckets: list[list[int]], latency_ms: np.ndarray,
           transfer_ms: np.ndarray, kappa: float = 0.0, streams: int = 1,
           tail_ms: float = 0.0, kappa_comm: float = 0.0) -> Replay:
    """Replay one step over all ranks (see the module docstring for the model).

    ``latency_ms`` / ``transfer_ms``: each bucket's alpha and bandwidth parts
    (:func:`allreduce_parts`). ``streams``: collectives the backend runs at once, launched in
    bucket order (NCCL: 1 stream; gloo: 2 worker threads per process group); in-flight
    transfers share the bandwidth equally, latencies overlap. Event-driven: between two events
    (a rank starts or ends backward, a rank reaches the next bucket's gradients, a latency or
    transfer ends) every rate is constant, so each interval is solved exactly.
    """
    n, nb = len(ranks), len(buckets)
    t0 = np.array([r.start_ms for r in ranks], float)
    fwd = t0 + np.array([r.fwd_ms for r in ranks], float)   # backward begins: the common clock
    total = np.array([r.bwd_work for r in ranks], float)
    need = np.array([[max((r.ready_work[i] for i in b), default=0.0) for b in buckets]
                     for r in ranks], float).reshape(n, nb)
    if nb:  # backward lasts at least until its last gradient (a bucket launched after it, say)
        total = np.maximum(total, need.max(axis=1))
    done = np.zeros(n)
    bwd_end = np.full(n, np.nan)
    start, end = np.full(nb, np.nan), np.full(nb, np.nan)
    lat_left, xfer_left = np.asarray(latency_ms, float).copy(), np.asarray(transfer_ms, float).copy()
    rate_c = max(1.0 - kappa, 1e-6)
    rate_k = max(1.0 - kappa_comm, 1e-6)
    t, k_next = 0.0, 0
    flying: list[int] = []
    trace_t, trace_done = [0.0], [done.copy()]
    for _ in range(8 * (nb + n + 2) ** 2):
        while (k_next < nb and len(flying) < max(streams, 1) and np.all(t >= fwd)
               and np.all(done >= need[:, k_next] - 1e-9)):
            start[k_next] = t
            flying.append(k_next)
            k_next += 1
        computing = (t >= fwd) & (done < total - 1e-9)
        if not computing.any() and not flying and k_next >= nb and np.all(t >= fwd):
            break
        rc = np.where(computing, rate_c if flying else 1.0, 0.0)
        moving = [k for k in flying if lat_left[k] <= 1e-12]
        # a collective runs at the pace of its slowest participant: slowed while any rank computes
        rate_m = rate_k if computing.any() else 1.0
        share = rate_m / max(len(moving), 1)
        dts = [f - t for f in fwd if f > t]
        for r in np.flatnonzero(computing):
            goal = need[r, k_next] if k_next < nb and done[r] < need[r, k_next] - 1e-9 else total[r]
            dts.append((goal - done[r]) / rc[r])
        dts += [lat_left[k] / rate_m for k in flying if lat_left[k] > 1e-12]
        dts += [xfer_left[k] / share for k in moving]
        if not dts:
            break
        dt = max(min(dts), 0.0)
        done = np.minimum(done + rc * dt, total)
        t += dt
        trace_t.append(t)
        trace_done.append(done.copy())
        for r in np.flatnonzero(computing & (done >= total - 1e-9)):
            bwd_end[r] = t
        for k in list(flying):
            if lat_left[k] > 1e-12:
                lat_left[k] = max(lat_left[k] - rate_m * dt, 0.0)
            elif k in moving:
                xfer_left[k] -= share * dt
                if xfer_left[k] <= 1e-9:
                    end[k] = t
                    flying.remove(k)
    bwd_end = np.where(np.isnan(bwd_end), np.maximum(fwd, np.where(total > 0, t, fwd)), bwd_end)
    ready = _ready_times(np.array(trace_t), np.array(trace_done).reshape(-1, n), need, fwd)
    return _finish(ready, start, end, fwd, bwd_end, ranks, tail_ms, t0)


def _finish(ready: np.ndarray, start: np.ndarray, end: np.ndarray, fwd: np.ndarray,
            bwd_end: np.ndarray, ranks: list[RankStep], tail_ms: float, t0: np.ndarray) -> Replay:
    """Step (from the rank's own start), C (union of the buckets' intervals) and E (C after the
    rank's backward) per rank; every other time in the common clock of the earliest rank."""
    last = float(np.nanmax(end)) if end.size and np.isfinite(end).any() else 0.0
    opt = np.array([r.opt_ms for r in ranks], float)
    comm = union_length(start, end) if end.size else 0.0
    exposed = np.array([union_length(*clip(start, end, b, np.inf)) if end.size else 0.0 for b in bwd_end])
    step = np.maximum(bwd_end, last) + tail_ms + opt - t0
    return Replay(ready, start, end, fwd, bwd_end, step, np.full(len(ranks), comm), exposed, t0)


def _ready_times(trace_t: np.ndarray, trace_done: np.ndarray, need: np.ndarray,
                 fwd: np.ndarray) -> np.ndarray:
    """When each bucket was ready on every rank: per rank the first time its work reached the
    bucket's need (linear between events), then the latest rank."""
    n, nb = need.shape
    out = np.zeros((n, nb))
    for r in range(n):
        d = trace_done[:, r]
        for k in range(nb):
            j = int(np.searchsorted(d, need[r, k] - 1e-9, side="left"))
            if j == 0:
                out[r, k] = fwd[r]
            elif j >= len(d):
                out[r, k] = trace_t[-1]
            else:
                frac = (need[r, k] - d[j - 1]) / max(d[j] - d[j - 1], 1e-300)
                out[r, k] = max(trace_t[j - 1] + frac * (trace_t[j] - trace_t[j - 1]), fwd[r])
    return out.max(axis=0) if n else np.zeros(nb)
