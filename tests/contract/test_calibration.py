"""The in-job calibration's fit (dpcore.contract.calibration) on synthetic timelines with a known
per-message cost, per-byte cost and compute slowdown: it must give them back."""
from __future__ import annotations

import math

import pytest

from dpcore.contract.calibration import MIB, fit, second_plan_mb, service_ms

A_MS, B_MS_PER_MIB, KAPPA, WORK_MS = 1.0, 2.0, 0.4, 40.0


def _cost(nbytes: float) -> float:
    return A_MS + B_MS_PER_MIB * nbytes / MIB


def _plan(mb: float, sizes: list[float], launches: list[float], late_ms: float = 0.1) -> dict:
    """Two ranks; rank 1 launches every collective ``late_ms`` later (the all-reduce starts
    with its last participant); one comm stream: each starts at max(last launch, previous end)
    and takes a + b·S. Backward: WORK_MS of work at rate 1 − KAPPA while comm is in flight."""
    ends, prev = [], -math.inf
    for s, n in zip(launches, sizes):
        prev = max(s + late_ms, prev) + _cost(n)
        ends.append(prev)
    # backward time = work + kappa x (comm in flight during it); here all comm ends inside
    # backward or all of it comes after, so the in-flight part is known in closed form
    inflight = sum(e - max(s + late_ms, p) for s, e, p in zip(launches, ends, [-math.inf] + ends[:-1])
                   if e <= WORK_MS + KAPPA * 1e9)
    bwd = WORK_MS + KAPPA * inflight if launches[0] < WORK_MS else WORK_MS
    steps = []
    for step in range(3):
        for rank in range(2):
            lag = late_ms * rank
            steps.append({"rank": rank, "step": step, "bwd_start_ms": 0.0, "bwd_end_ms": bwd, "bytes": sizes,
                          "launch_ms": [s + lag for s in launches], "end_ms": ends})
    return {"bucket_mb": mb, "steps": steps}


def test_fit_gives_back_known_message_cost_bandwidth_and_slowdown() -> None:
    # own plan: two 8 MiB buckets launched when backward ends (no comm in flight during it)
    big = _plan(8.0, [8 * MIB, 8 * MIB], [WORK_MS, WORK_MS])
    # second plan: twenty 0.25 MiB buckets, one every 2 ms from the start of backward: each takes
    # 1 + 0.5 = 1.5 ms, so 30 ms of comm are in flight during backward (it ends at 52 ms)
    small = _plan(0.25, [MIB / 4] * 20, [2.0 * i for i in range(20)])
    assert small["steps"][0]["bwd_end_ms"] == pytest.approx(WORK_MS + KAPPA * 30.0)
    got = fit([big, small])
    assert got["per_message_ms"] == pytest.approx(A_MS, rel=1e-6)
    assert got["ms_per_mib"] == pytest.approx(B_MS_PER_MIB, rel=1e-6)
    assert got["kappa"] == pytest.approx(KAPPA, rel=1e-6)
    assert [p["collectives"] for p in got["plans"]] == [12, 120] and got["note"] == ""


def test_fit_says_what_it_cannot_fit() -> None:
    # both plans with the same comm in flight and one message size: no line, no kappa
    one = _plan(4.0, [4 * MIB], [WORK_MS])
    got = fit([one, one])
    assert math.isnan(got["per_message_ms"]) and math.isnan(got["kappa"])
    assert "too few all-reduces" in got["note"] and "kappa not fitted" in got["note"]


def test_service_times_and_second_plan() -> None:
    # a collective that waits for the one before it is charged from that one's end
    assert service_ms([0.0, 1.0, 10.0], [5.0, 7.0, 12.0]).tolist() == [5.0, 2.0, 2.0]
    assert second_plan_mb(25.0) == 0.25 and second_plan_mb(1.0) == 0.25 and second_plan_mb(0.5) == 64.0
