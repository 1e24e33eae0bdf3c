"""The what-if model's in-job calibration: what it measures and how it is fitted (pure numpy).

Why: from one job with a few large buckets the in-training cost of *one message* cannot be
seen (two buckets of one size fit any per-message cost), and a stand-alone all-reduce is no
stand-in for it: on a 2-core box it is 3x faster than the same message during backward. So
``profile`` spends a few extra *untimed* steps of every 2+-rank
``bucketed``/``torch_ddp`` job on a second bucket plan (:func:`second_plan_mb`: many small
buckets when the job's are large, one large when they are small), after its timed and traced
steps (they are untouched), and fits from both plans:

* the **per-message cost and the per-byte cost during training**: a line t = a + b·S through
  every bucket's serial-equivalent service time (its end minus max(its launch, the previous
  bucket's end): the time the comm stream spent on it) of both plans; the small buckets pin a,
  the large ones b;
* the **compute slowdown while comm is in flight** (kappa): the two plans run the same backward
  with different comm in flight, so kappa = Δ backward / Δ comm in flight during backward
  (medians over rank-steps). No 1-rank baseline needed, and both are measured in the same
  process, minutes apart at most.

The fit is written into the job's run.json entry (``whatif_calibration``) with the steps it came
from and its cost; the write side computes it here so run.json holds it, the read side
(:mod:`dpcore.read.whatif`) uses it. Shared by both sides, so no torch, no pandas.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Calibration steps per job (after one warm-up step of the second plan, not used).
CAL_STEPS = 4
#: Step indices the calibration steps get in the recorder (never written to steps.csv).
CAL_STEP_BASE = 1_000_000
MIB = 1024 * 1024
#: Below this difference of comm in flight during backward (ms) the two plans cannot tell kappa.
MIN_INFLIGHT_DIFF_MS = 1.0


def second_plan_mb(bucket_mb: float) -> float:
    """The calibration's bucket cap (MiB): many small buckets (0.25 MiB) when the job's are
    1 MiB or more, else one large (64 MiB), so the two plans differ in message count."""
    return 0.25 if bucket_mb >= 1.0 else 64.0


def launch_ns(row: dict[str, Any], events: bool) -> int:
    """When a collective could begin, on the scale of its end and of the phase marks.

    Why: the fit (:func:`fit`) takes each all-reduce's service time as end - max(launch,
    previous end) and its time in flight during backward from the launch, so the launch must be
    on the scale the end and backward's edges are on. On the host clock (CPU jobs) that is
    ``t_launch_ns``, the host time of the call, as ever. With an event clock (CUDA jobs) the end
    and the phase marks are the *stream's* times, and the host runs ahead of the stream: the host
    time of the call can lie before the backward that launched it even began on the device. There
    ``t_start_ns`` is the stream's time at the launch (an event recorded right before the call;
    the collective cannot begin before it), the one launch on that scale. The same rule over a
    table's columns is :func:`dpcore.contract.intervals.comm_start` (a start where known)."""
    if events:
        start = row.get("t_start_ns")
        if isinstance(start, int) and start > 0:
            return start
    return int(row["t_launch_ns"])


def end_ms(end: Any) -> float | None:
    """A collective's end in ms; None while it has none (-1, or an event clock's end stamped
    after the rows were resolved: still an event, not ns)."""
    if isinstance(end, str) and end.lstrip("-").isdigit():
        end = int(end)
    return round(end / 1e6, 4) if isinstance(end, int) and end > 0 else None


def step_entry(rank: int, idx: int, bwd_start_ms: float, bwd_end_ms: float, colls: list[dict[str, Any]],
               events: bool) -> dict[str, Any]:
    """One calibration rank-step as :func:`fit` takes it: backward's window, each all-reduce's
    bytes, launch (:func:`launch_ns`) and end, ms on the run's one clock, in launch order.
    ``events``: the recorder timed with an event clock; then backward's window must be the
    stream's too (the phase timer's events in ``profile``, the recorder's marks in ``record``).
    The window ends where backward's computation did, before DDP's wait for its buckets inside
    ``backward()`` (:class:`dpcore.write.capture.backward_end.BackwardEnd`): with that wait in
    it, Δ backward between the plans would hold a difference of communication, not of compute
    slowed by it, and kappa would read it as slowdown."""
    cs = sorted(colls, key=lambda c: c["seq"])
    return {"rank": rank, "step": idx, "bwd_start_ms": round(bwd_start_ms, 4),
            "bwd_end_ms": round(bwd_end_ms, 4),
            "bytes": [int(c["bytes"]) for c in cs],
            "launch_ms": [round(launch_ns(c, events) / 1e6, 4) for c in cs],
            "end_ms": [end_ms(c["t_end_ns"]) for c in cs]}


def service_ms(launch_ms: np.ndarray, end_ms: np.ndarray) -> np.ndarray:
    """Per collective of one (rank, step), in launch order: end − max(launch, previous end).
    ``launch_ms`` should be the *latest* rank's launch (:func:`latest_launch`): a collective
    cannot start before its last participant joins, and the wait for it is not comm cost."""
    out, prev = [], -math.inf
    for s, e in zip(launch_ms, end_ms):
        out.append(e - max(s, prev))
        prev = max(prev, e)
    return np.asarray(out, float)


def latest_launch(steps: list[dict[str, Any]]) -> dict[int, np.ndarray]:
    """Per step index: each collective's latest launch over the ranks (one clock), by position
    in launch order; only where every rank of the step has the same number of collectives."""
    by: dict[int, list[np.ndarray]] = {}
    for s in steps:
        by.setdefault(int(s["step"]), []).append(np.asarray(s["launch_ms"], float))
    return {k: np.max(np.vstack(v), axis=0) for k, v in by.items() if len({len(x) for x in v}) == 1}


def inflight_ms(a: float, b: float, launch_ms: np.ndarray, end_ms: np.ndarray) -> float:
    """Comm in flight within [a, b] (ms): the union of the collectives' intervals, clipped."""
    iv = sorted((max(s, a), min(e, b)) for s, e in zip(launch_ms, end_ms) if min(e, b) > max(s, a))
    total, cur_s, cur_e = 0.0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            total += (cur_e - cur_s) if cur_e is not None else 0.0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """t = a + b·S, least squares with relative weights (small messages count as much as big
    ones), a >= 0."""
    w = 1.0 / np.maximum(y, 1e-6) ** 2
    sw = np.sqrt(w)
    a, b = np.linalg.lstsq(np.c_[np.ones_like(x), x] * sw[:, None], y * sw, rcond=None)[0]
    if a < 0:
        a, b = 0.0, float(np.sum(w * x * y) / np.sum(w * x * x))
    return float(a), float(b)


def fit(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """The calibration fit of two bucket plans of one job (module docstring).

    ``plans``: per plan ``{"bucket_mb": float, "steps": [{"rank", "step", "bwd_start_ms",
    "bwd_end_ms", "bytes": [...], "launch_ms": [...], "end_ms": [...]}, ...]}`` (times in ms
    on one clock, collectives in launch order). Returns ``per_message_ms`` (a), ``ms_per_mib``
    (b per MiB), ``kappa`` (NaN where the plans' comm in flight barely differs), the number of
    collectives and rank-steps used per plan, and ``note`` saying what could not be fitted."""
    xs, ys, per_plan, notes = [], [], [], []
    for p in plans:
        bwd, inflight, n = [], [], 0
        latest = latest_launch(p["steps"])
        for s in p["steps"]:
            launch, end = np.asarray(s["launch_ms"], float), np.asarray(s["end_ms"], float)
            ok = np.isfinite(launch) & np.isfinite(end) & (end > launch)
            if not ok.all() or not len(launch) or int(s["step"]) not in latest:
                continue
            # service times from the latest rank's launch; a collective that ended before the one
            # launched ahead of it (gloo runs 2 at once) has no serial-equivalent time: left out
            y = service_ms(latest[int(s["step"])], end)
            keep = y > 0
            xs += list(np.asarray(s["bytes"], float)[keep])
            ys += list(y[keep])
            n += int(keep.sum())
            bwd.append(s["bwd_end_ms"] - s["bwd_start_ms"])
            # in flight from when the all-reduce really started (its last participant joined)
            inflight.append(inflight_ms(s["bwd_start_ms"], s["bwd_end_ms"], latest[int(s["step"])], end))
        per_plan.append({"bucket_mb": float(p["bucket_mb"]), "rank_steps": len(bwd), "collectives": n,
                         "bwd_ms": float(np.median(bwd)) if bwd else math.nan,
                         "inflight_ms": float(np.median(inflight)) if inflight else math.nan})
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    a = b = math.nan
    if len(x) >= 2 and np.ptp(x) > 0:
        # one point per message size (the median of its service times), so hundreds of small
        # buckets do not outvote the few large ones that carry the per-byte cost
        sizes = np.unique(x)
        a, b = _line(sizes, np.array([np.median(y[x == v]) for v in sizes]))
    else:
        notes.append("too few all-reduces of different sizes for a line")
    kappa = math.nan
    if len(per_plan) == 2:
        d_o = per_plan[1]["inflight_ms"] - per_plan[0]["inflight_ms"]
        if math.isfinite(d_o) and abs(d_o) >= MIN_INFLIGHT_DIFF_MS:
            kappa = (per_plan[1]["bwd_ms"] - per_plan[0]["bwd_ms"]) / d_o
        else:
            notes.append(f"the plans' comm in flight during backward differs by less than "
                         f"{MIN_INFLIGHT_DIFF_MS:g} ms: kappa not fitted")
    return {"per_message_ms": a, "ms_per_mib": b * MIB if math.isfinite(b) else math.nan, "kappa": kappa,
            "plans": per_plan, "note": "; ".join(notes)}
