"""The what-if anchored on its source (``whatif.model`` item 8): the source's own cell predicts
its measured step, the ratio measured / replayed is carried to every cell (what it adds is the
CSV's ``unexplained_ms``) and printed with the other factors."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dpcore.read.analysis.summary import job_summary
from dpcore.read.rundir import load_run
from dpcore.read.whatif.predict import build_model, predict, scale_factors

ROOT = Path(__file__).resolve().parents[3]
#: one 2-rank job of the quiet held-out run whose replay alone is 31 % short of its measured step
HELDOUT = ROOT / "tests" / "data" / "whatif_heldout"
QUIET = ROOT / "tests" / "data" / "whatif_quiet"
JOB = "bucketed-ws2-b1"
MEASURED_MS = 136.837896  # summarize's median step of that job (steps.csv, 20 timed rank-steps)


@pytest.fixture(scope="module")
def heldout():
    run = load_run(HELDOUT)
    return run, job_summary(run, None)


def test_the_source_own_cell_predicts_its_measured_step(heldout) -> None:
    run, summary = heldout
    assert float(summary.loc[summary["job_id"] == JOB, "step_ms"].iloc[0]) == pytest.approx(MEASURED_MS, abs=1e-3)
    model = build_model(run, JOB, summary=summary)
    own = predict(model, [1.0], [2]).iloc[0]
    # the replay alone gave 93.9 ms here (-31 %): the anchor adds the 42.9 ms it misses
    assert own["step_ms"] == pytest.approx(MEASURED_MS, rel=1e-9)
    assert own["unexplained_ms"] == pytest.approx(42.90, abs=0.05)
    alone = predict(replace(model, anchor_ratio=1.0), [1.0], [2]).iloc[0]["step_ms"]
    assert alone == pytest.approx(MEASURED_MS - own["unexplained_ms"], rel=1e-9)
    assert alone < 0.8 * MEASURED_MS


def test_the_anchor_scales_every_cell_and_is_printed_as_measured(heldout) -> None:
    run, summary = heldout
    model = build_model(run, JOB, summary=summary)
    assert model.anchor_ratio == pytest.approx(136.837896 / 93.94, rel=1e-3)
    cells = predict(model, [0.25, 4.0, 16.0], [2, 4])
    alone = predict(replace(model, anchor_ratio=1.0), [0.25, 4.0, 16.0], [2, 4])
    assert np.allclose(cells["step_ms"], alone["step_ms"] * model.anchor_ratio)
    assert np.allclose(cells["unexplained_ms"], cells["step_ms"] - alone["step_ms"])
    row = [r for r in scale_factors(model) if r[0].startswith("step x anchor")]
    assert len(row) == 1 and row[0][1] == f"x{model.anchor_ratio:.3f}" and row[0][2] == "measured"
    assert "median step 136.84 ms over the replay of its own plan (1 MiB at 2 ranks) 93.94 ms" in row[0][3]


def test_a_named_network_keeps_the_anchor_of_the_job_own_network(heldout) -> None:
    run, summary = heldout
    own = build_model(run, JOB, summary=summary)
    named = build_model(run, JOB, bandwidth_gbps=50.0, summary=summary)
    # the named network is not what the job ran on: its difference is the prediction, not anchor
    assert named.anchor_ratio == pytest.approx(own.anchor_ratio, rel=1e-12)
    assert "the network the job ran on" in named.anchor_source


def test_a_one_rank_source_carries_its_anchor_to_more_ranks_and_says_so() -> None:
    run = load_run(QUIET / "sample-train")
    summary = job_summary(run, None)
    model = build_model(run, "bucketed-ws1-b1", allreduce=load_run(QUIET / "sample-allreduce").allreduce,
                        summary=summary)
    cells = predict(model, [1.0], [1, 2])
    measured = float(summary.loc[summary["job_id"] == "bucketed-ws1-b1", "step_ms"].iloc[0])
    assert cells.iloc[0]["step_ms"] == pytest.approx(measured, rel=1e-9)
    alone = predict(replace(model, anchor_ratio=1.0), [1.0], [1, 2])
    assert np.allclose(cells["step_ms"], alone["step_ms"] * model.anchor_ratio)
    assert model.anchor_ratio != pytest.approx(1.0, abs=1e-3)
    assert "holds no waits for other ranks" in model.anchor_source


def test_without_a_measured_step_there_is_no_anchor(heldout) -> None:
    run, summary = heldout
    model = build_model(run, JOB, summary=summary.assign(step_ms=np.nan))
    assert model.anchor_ratio == 1.0 and model.anchor_source.startswith("none")
    row = [r for r in scale_factors(model) if r[0].startswith("step x anchor")][0]
    assert row[2] == "none"


def test_the_page_breakdown_draws_what_the_anchor_adds(heldout) -> None:
    from dpcore.read.plots.whatif import breakdown_figure

    run, summary = heldout
    cells = predict(build_model(run, JOB, summary=summary), [1.0, 4.0], [2])
    bars = {t.name: list(t.y) for t in breakdown_figure(cells).data if t.type == "bar"}
    added = [v for k, v in bars.items() if k.startswith("unexplained")]
    assert len(added) == 1 and np.allclose(added[0], cells.sort_values("bucket_mb")["unexplained_ms"])
    # the stacked parts reach the predicted step
    assert np.allclose(np.sum(list(bars.values()), axis=0), cells.sort_values("bucket_mb")["step_ms"], rtol=1e-6)
