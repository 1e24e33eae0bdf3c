"""The in-training cost per all-reduce the replay misses (``whatif.model`` item 9): measured from
the source job's in-job calibration (two bucket plans, few and many messages), added per bucket to
every cell's step before the anchor, printed with the other factors."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dpcore.read.analysis.summary import job_summary
from dpcore.read.rundir import load_run
from dpcore.read.whatif.build import anchor
from dpcore.read.whatif.calibrate import message_cost
from dpcore.read.whatif.fit import calibration_of
from dpcore.read.whatif.predict import build_model, predict, scale_factors

ROOT = Path(__file__).resolve().parents[3]
#: mlp-256, 4 MiB buckets (1 all-reduce per step), calibrated with 0.25 MiB (30 all-reduces)
MESSAGES = ROOT / "tests" / "data" / "whatif_messages"
JOB = "bucketed-ws2-b4"
MEASURED_025_MS = 61.839205  # summarize's median step of bucketed-ws2-b0.25 (steps.csv)


@pytest.fixture(scope="module")
def source():
    run = load_run(MESSAGES)
    summary = job_summary(run, None)
    return run, summary, build_model(run, JOB, summary=summary)


def test_the_cost_per_message_is_measured_from_the_calibration_plans(source) -> None:
    _, _, model = source
    # the replay ends the 30-message plan 28.1 ms early, the 1-message plan 1.5 ms: (28.1-1.5)/29
    assert model.message_ms == pytest.approx(0.9185, abs=5e-4)
    assert "+1.5 and +28.1 ms after the replay's" in model.message_source
    row = [r for r in scale_factors(model) if r[0].startswith("in-training cost per all-reduce")]
    assert len(row) == 1 and row[0][1] == "0.918 ms" and row[0][2] == "measured"


def test_kappa_from_the_calibration_leaves_out_the_plans_per_bucket_cost(source) -> None:
    run, _, model = source
    from dpcore.read.whatif.fit import job_timelines, kappa_from_calibration
    cal = calibration_of(run.meta, JOB)
    src = job_timelines(run.steps, run.collectives, run.grads, JOB)
    # the plans' backwards differ by 29 buckets' cost as well as by comm in flight: without taking
    # it out the calibration reads that cost as comm's slowdown of compute
    raw, _ = kappa_from_calibration(cal)
    assert raw == pytest.approx(cal["kappa"], rel=1e-12)
    d_o = cal["plans"][1]["inflight_ms"] - cal["plans"][0]["inflight_ms"]
    assert model.kappa == pytest.approx(raw - model.bucket_overhead_ms * 29 / d_o, rel=1e-9)
    assert model.kappa == pytest.approx(0.146, abs=5e-4) and raw > 0.5
    assert "less 0.13 ms per bucket for the plans' 1 and 30 buckets" in model.kappa_source
    same, _ = kappa_from_calibration(cal, src, 0.0)
    assert same == raw


def test_many_small_buckets_are_predicted_from_one_large(source) -> None:
    run, summary, model = source
    cells = predict(model, [0.25, 4.0], [2]).set_index("bucket_mb")
    # the source's own cell still predicts its measurement (the anchor)
    own = float(summary.loc[summary["job_id"] == JOB, "step_ms"].iloc[0])
    assert cells.loc[4.0, "step_ms"] == pytest.approx(own, rel=1e-9)
    assert cells.loc[0.25, "step_ms"] == pytest.approx(48.65, abs=0.05)
    assert abs(cells.loc[0.25, "step_ms"] / MEASURED_025_MS - 1) < 0.25
    # without the term the replay misses most of the 30 messages' cost: 22.8 ms, -63 %
    without = predict(anchor(replace(model, message_ms=0.0), summary), [0.25], [2]).iloc[0]["step_ms"]
    assert without == pytest.approx(22.76, abs=0.05)
    assert without / MEASURED_025_MS - 1 < -0.55


def test_the_term_is_exposed_comm_per_bucket(source) -> None:
    _, summary, model = source
    with_ = predict(replace(model, anchor_ratio=1.0), [0.25, 1.0], [2, 3])
    alone = predict(replace(model, anchor_ratio=1.0, message_ms=0.0), [0.25, 1.0], [2, 3])
    for col in ("step_ms", "exposed_comm_ms", "comm_ms"):
        assert np.allclose(with_[col] - alone[col], model.message_ms * with_["buckets"])
    # one rank sends nothing
    assert predict(model, [0.25], [1]).iloc[0]["step_ms"] == pytest.approx(
        predict(replace(model, message_ms=0.0), [0.25], [1]).iloc[0]["step_ms"], rel=1e-12)


def test_plans_of_nearly_equal_message_counts_tell_no_cost(source) -> None:
    run, _, model = source
    cal = calibration_of(run.meta, JOB)
    # the small plan re-labelled as 4 MiB: one message each, nothing to take a slope over
    same = {**cal, "data": [cal["data"][0], {**cal["data"][0]}]}
    out = message_cost(replace(model, message_ms=0.0, message_source="none"), same)
    assert out.message_ms == 0.0 and "do not tell a cost per message" in out.message_source


def test_a_named_network_takes_no_cost_from_the_job_own(source) -> None:
    run, summary, _ = source
    named = build_model(run, JOB, bandwidth_gbps=5.0, latency_us=50.0, summary=summary)
    assert named.message_ms == 0.0 and "network asked about" in named.message_source
    row = [r for r in scale_factors(named) if r[0].startswith("in-training cost per all-reduce")][0]
    assert row[1] == "0.000 ms" and row[2] == "none"
