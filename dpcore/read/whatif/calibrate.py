"""The in-training comm rate of a source job without in-training alpha and B (``whatif.model``
assumption 3b): :func:`calibrate_comm` fits it so that replaying the source's own buckets ends its
last all-reduce when collectives.csv says it did.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from dpcore.read.whatif.cells import Model, replay_cell

#: Upper bound of the fitted comm slowdown while backward runs (comm never stops entirely).
KAPPA_COMM_MAX = 0.95


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
