"""The in-training comm rate of a source job without in-training alpha and B (``whatif.model``
assumption 3b): :func:`calibrate_comm` fits it so that replaying the source's own buckets ends its
last all-reduce when collectives.csv says it did.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from dpcore.read.whatif.cells import Model, replay_cell
from dpcore.read.whatif.fit import PER_MESSAGE_RANGE_MS

#: Upper bound of the fitted comm slowdown while backward runs (comm never stops entirely).
KAPPA_COMM_MAX = 0.95
#: The calibration's two plans must differ this many times in all-reduces per step to tell a
#: cost per message.
MIN_MESSAGE_RATIO = 2.0
#: ... and by this many all-reduces: a step's noise (a few ms on the loaded 2-core box) over a
#: difference of one or two messages (the tiny transformer: 1 and 3) is the slope, not the cost.
MIN_MESSAGE_DIFF = 8


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


def _plan_comm_end(plan: dict) -> float:
    """Median over the calibration's rank-steps of one plan of its last all-reduce's end after
    the rank's backward began, ms (NaN without one)."""
    ends = []
    for st in plan.get("steps") or []:
        end = np.asarray(st.get("end_ms") or [], float)
        if end.size and np.isfinite(end).all():
            ends.append(float(end.max()) - float(st.get("bwd_start_ms", np.nan)))
    ok = [e for e in ends if np.isfinite(e)]
    return float(np.median(ok)) if ok else float("nan")


def message_cost(model: Model, cal: dict | None) -> Model:
    """The in-training cost per all-reduce that the alpha-beta replay misses (``whatif.model``
    item 9), from the job's in-job calibration: it ran the source's backward with two bucket
    plans (few large and many small messages); per plan, measured minus replayed end of the
    last all-reduce after backward began; the difference of the two over the difference of
    their message counts is the cost per message the replay leaves out (the same offset in
    both plans cancels). Clipped at 0; none without a calibration of two plans whose message
    counts differ :data:`MIN_MESSAGE_RATIO`-fold and by :data:`MIN_MESSAGE_DIFF` (a model whose
    every layer is larger than the small plan's cap sends 29 and 30; a small one 1 and 3: a
    step's noise over one or two messages is the slope)."""
    plans = [p for p in ((cal or {}).get("data") or []) if isinstance(p, dict)]
    if model.src.world_size < 2 or len(plans) < 2:
        return model
    base = replace(model, anchor_ratio=1.0, message_ms=0.0)
    fwd = float(np.median([tl.start_ms + tl.fwd_ms for tl in model.src.timelines]))
    resid, counts = [], []
    for plan in plans[:2]:
        measured = _plan_comm_end(plan)
        row, _, buckets = replay_cell(base, model.src.world_size, float(plan.get("bucket_mb", np.nan)))
        resid.append(measured - (row["comm_end_ms"] - fwd))
        counts.append(len(buckets))
    if not (np.isfinite(resid).all() and max(counts) >= MIN_MESSAGE_RATIO * max(min(counts), 1)
            and max(counts) - min(counts) >= MIN_MESSAGE_DIFF):
        model.message_source = (f"none (the calibration's plans, {counts[0]} and {counts[1]} all-reduces, do not "
                                "tell a cost per message)")
        return model
    per = (resid[1] - resid[0]) / (counts[1] - counts[0])
    model.message_ms = min(max(float(per), 0.0), PER_MESSAGE_RANGE_MS[1])
    mbs = " and ".join(f"{float(p.get('bucket_mb', np.nan)):g} MiB ({c} all-reduces)" for p, c in zip(plans, counts))
    model.message_source = (f"in-job calibration, plans of {mbs}: the last all-reduce ended "
                            f"{resid[0]:+.1f} and {resid[1]:+.1f} ms after the replay's, {per:.3f} ms per "
                            f"message{' (clipped at 0)' if per < 0 else ''}")
    return model
