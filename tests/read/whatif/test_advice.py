"""Bands, the recommendation, kappa's plausible range and the ranks' common clock, on inputs
with known answers (no run, no timing)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dpcore.read.whatif.advice import add_bands, recommend, source_spread
from dpcore.read.whatif.fit import KAPPA_RANGE, fit_kappa
from dpcore.read.whatif.model import RankStep, replay


def _cells(steps: dict[float, float], measured: dict[float, float] | None = None) -> pd.DataFrame:
    measured = measured or {}
    return pd.DataFrame({"world_size": 2, "bucket_mb": list(steps), "step_ms": list(steps.values()),
                         "measured_step_ms": [measured.get(b, np.nan) for b in steps]})


def test_band_adds_the_source_medians_doubt_and_the_model_error_in_quadrature() -> None:
    summary = pd.DataFrame({"job_id": ["j", "one"], "step_ms": [100.0, 100.0], "step_ms_p10": [80.0, 80.0],
                            "step_ms_p90": [150.0, 150.0], "n_steps": [9, 1]})
    # the median of 9 steps: 1.645 x 1.2533 / 1.2816 / sqrt(9) = 0.5362 of (p50 - p10) and of (p90 - p50)
    down, up = source_spread(summary, "j")
    assert (down, up) == pytest.approx((0.5362 * 0.2, 0.5362 * 0.5), abs=1e-4)
    assert source_spread(summary, "one") == pytest.approx((0.2, 0.5))   # one step: its whole spread
    assert source_spread(summary, "other") == (0.0, 0.0)
    out = add_bands(_cells({1.0: 40.0, 4.0: 50.0}, {1.0: 35.0, 4.0: 70.0}), (down, up), model_error_pct=10.0)
    # 40 x (1 - sqrt(0.1^2 + 0.1072^2)) = 34.14; 50 x (1 + sqrt(0.1^2 + 0.2681^2)) = 64.31
    assert out["step_ms_lo"].tolist() == pytest.approx([34.14, 42.67], abs=0.01)
    assert out["step_ms_hi"].tolist() == pytest.approx([51.44, 64.31], abs=0.01)
    assert out["in_band"].tolist() == [True, False]          # 35 >= 34.14; 70 > 64.31
    # no doubt in the source: the band is the model's error alone
    plain = add_bands(_cells({1.0: 40.0}), (0.0, 0.0), model_error_pct=10.0)
    assert plain[["step_ms_lo", "step_ms_hi"]].iloc[0].tolist() == pytest.approx([36.0, 44.0])


def test_recommendation_names_the_knob_or_says_it_does_not_matter() -> None:
    t = add_bands(_cells({0.25: 80.0, 4.0: 60.0, 32.0: 30.0}), (1.0, 1.0), 25.0)
    out, line = recommend(t, 2, 4.0, model_error_pct=25.0)
    # 30 ms (band 22.5-37.5) against 60 ms at 4 MiB: 50 % faster, band 38 to 62 %
    assert out["recommended"].tolist() == [False, False, True]
    assert line.startswith("recommendation: 32 MiB buckets at 2 ranks")
    assert "30.0 ms (50 %) faster (band 38 to 62 %, the model's 25 % error)" in line
    assert "DistributedDataParallel(model, bucket_cap_mb=32)" in line and "ddp_bucket_cap_mb=32" in line
    assert "DDPStrategy(bucket_cap_mb=32)" in line
    # 55 ms against 60: within the model's 25 %: does not matter, the own cell is the one named
    t = add_bands(_cells({1.0: 55.0, 4.0: 60.0}), (1.0, 1.0), 25.0)
    out, line = recommend(t, 2, 4.0, model_error_pct=25.0)
    assert "does not matter" in line and "keep bucket_cap_mb=4" in line
    assert out["recommended"].tolist() == [False, True]
    out, line = recommend(t, 2, 1.0)
    assert line.startswith("recommendation: keep bucket_cap_mb=1") and out["recommended"].tolist() == [True, False]


def _src(bwd: float, comm: tuple[float, float]) -> SimpleNamespace:
    tl = SimpleNamespace(fwd_ms=0.0, bwd_ms=bwd, ready_ms=np.array([bwd]), comm_start=np.array([comm[0]]),
                         comm_end=np.array([comm[1]]))
    return SimpleNamespace(timelines=[tl] * 3, sizes=np.array([4.0]))


def test_kappa_outside_its_plausible_range_is_not_used() -> None:
    # backward 40 ms with 10 ms of comm in flight, 35 ms alone: kappa = 5/10 = 0.5, plausible
    k, how = fit_kappa(_src(40.0, (20.0, 30.0)), baseline_bwd_ms=35.0)
    assert k == pytest.approx(0.5) and how.startswith("across jobs") and KAPPA_RANGE[1] == pytest.approx(2 / 3)
    # a disturbed 1-rank baseline (20 ms): kappa 2.0 means nothing; not used, and said so
    k, how = fit_kappa(_src(40.0, (20.0, 30.0)), baseline_bwd_ms=20.0)
    assert k == 0.0 and "fitted across jobs 2.00" in how and "not used" in how
    # a baseline slower than the job (negative kappa) is refused too
    k, how = fit_kappa(_src(40.0, (20.0, 30.0)), baseline_bwd_ms=45.0)
    assert k == 0.0 and "across jobs -0.50" in how


def test_ranks_that_start_apart_share_one_clock() -> None:
    # rank 1 starts its step 10 ms after rank 0; both need 20 ms of backward after a 5 ms forward.
    # In one clock the bucket is ready at 35 (rank 1: 10 + 5 + 20), not at 25, and ends at 40.
    early = RankStep(5.0, np.array([20.0]), 20.0, 1.0)
    late = RankStep(5.0, np.array([20.0]), 20.0, 1.0, start_ms=10.0)
    rp = replay([early, late], [[0]], np.zeros(1), np.array([5.0]))
    assert rp.bucket_ready.tolist() == [35.0] and rp.bucket_end.tolist() == [40.0]
    # each rank's step from its own start: rank 0 waits for rank 1 (41 ms), rank 1 does not (31 ms)
    assert rp.step_ms.tolist() == pytest.approx([41.0, 31.0])


def test_an_implausible_allreduce_fit_falls_back_to_the_jobs_own_collectives() -> None:
    from dpcore.read.whatif.fit import fit_network

    # two collectives per step of 1 and 8 MB, 2 and 9 ms: the job's own line is plausible
    tl = SimpleNamespace(comm_start=np.array([0.0, 5.0]), comm_end=np.array([2.0, 14.0]),
                         comm_bytes=np.array([1e6, 8e6]))
    src = SimpleNamespace(job_id="j", world_size=2, timelines=[tl, tl])
    # an allreduce run whose 1 MB takes 10 s: B far below 1 MB/s, not used, and said so
    slow = pd.DataFrame({"algo": "native", "world_size": 2, "bytes": [1e6, 8e6], "time_ms": [1e4, 8e4]})
    net = fit_network(src, "ring", slow, None, None)
    assert net["bandwidth_source"].startswith("job's collectives") and "not used" in net["alpha_source"]
    assert net["bandwidth_gbps"] == pytest.approx(1.0, rel=1e-6)    # 1 ms per MB at ring N=2: S/B


def _summary(rows: list[tuple]) -> pd.DataFrame:
    """job_summary rows: (job_id, variant, world_size, bucket_mb, step_ms, p10, p90, status)."""
    return pd.DataFrame(rows, columns=["job_id", "variant", "world_size", "bucket_mb", "step_ms", "step_ms_p10",
                                       "step_ms_p90", "status"])


#: Family errors for the tests: torch_ddp to larger buckets at the same world size errs 20 %;
#: every other family has no held-out cells (the global 42 %).
FAMILIES = pd.DataFrame({"variant": ["torch_ddp"], "buckets": ["larger"], "ranks": ["same"], "cells": [30],
                         "half_width_pct": [20.0]}).set_index(["variant", "buckets", "ranks"])


def _banded_for(zero1_ms: float | None, world_sizes: tuple[int, ...] = (2,)) -> tuple[pd.DataFrame, str]:
    """banded() of a torch_ddp source (2 ranks, 4 MiB, measured 60 ms, no spread) whose cells
    predict 1 MiB 50 ms, 4 MiB 60 ms, 32 MiB 30 ms at every world size, with a measured
    torch_zero1 job at 2 ranks of ``zero1_ms`` (none: None); the model errors of :data:`FAMILIES`."""
    from dpcore.read.whatif.predict import WHATIF_COLUMNS, banded

    steps = {1.0: 50.0, 4.0: 60.0, 32.0: 30.0}
    cells = pd.DataFrame([{c: np.nan for c in WHATIF_COLUMNS} | {"world_size": n, "bucket_mb": b, "step_ms": ms}
                          for n in world_sizes for b, ms in steps.items()])
    cells = cells.drop(columns=["step_ms_lo", "step_ms_hi", "in_band", "recommended"])
    rows = [("torch_ddp-n2-b4", "torch_ddp", 2, 4.0, 60.0, 60.0, 60.0, "complete"),
            ("torch_zero1-n4-b8", "torch_zero1", 4, 8.0, 1.0, 1.0, 1.0, "complete"),    # other world size
            ("zero1-n2-b8", "zero1", 2, 8.0, 2.0, 2.0, 2.0, "failed")]                   # not complete
    if zero1_ms is not None:
        rows.append(("torch_zero1-n2-b8", "torch_zero1", 2, 8.0, zero1_ms, zero1_ms * 0.9, zero1_ms * 1.2,
                     "complete"))
    src = SimpleNamespace(job_id="torch_ddp-n2-b4", variant="torch_ddp", world_size=2, bucket_mb=4.0)
    return banded(SimpleNamespace(src=src, alpha_source="given", alpha_us=5.0), cells, _summary(rows), FAMILIES)


def test_recommendation_weighs_measured_zero1_against_the_predicted_ddp_band() -> None:
    # its family's 20 %: the 32 MiB cell (30 ms) has the band 24-36 ms and beats the own 60 ms (the
    # own cell's family has no held-out cells: the global 42 %, band 34.8-85.2)
    table, line = _banded_for(None)
    assert line.startswith("recommendation: 32 MiB buckets at 2 ranks") and "ZeRO-1" not in line
    assert "30.0 ms (50 %) faster (band 40 to 60 %, the model's 20 % error)" in line
    t = table.set_index("bucket_mb")
    assert t["model_error_pct"].tolist() == [42.0, 42.0, 20.0]
    assert t.loc[32.0, "band_from"].startswith("family torch_ddp, larger buckets, same ranks: errors -20/+20 % "
                                               "below/above")
    assert t.loc[1.0, "band_from"] == "global 42 % (no held-out cells of family torch_ddp, smaller buckets, same ranks)"
    assert (t.loc[32.0, "step_ms_lo"], t.loc[32.0, "step_ms_hi"]) == pytest.approx((24.0, 36.0))
    # ZeRO-1 measured at 12 ms: below the band: it wins, against the own predicted 60 ms (band
    # 34.8-85.2): 80 % faster, band 1-12/34.8 = 66 % to 1-12/85.2 = 86 %; no predicted cell is named
    table, line = _banded_for(12.0)
    assert line.startswith("recommendation: ZeRO-1 at 2 ranks: torch_zero1 (ZeRO-1, 8 MiB buckets, job "
                           "torch_zero1-n2-b8) measured 12.0 ms (p10-p90 10.8-14.4)")
    assert "torch_ddp at 32 MiB predicted 30.0 ms (band 24.0-36.0)" in line
    assert "80 % faster than the job's own 4 MiB (predicted 60.0 ms; band 66 to 86 %)" in line
    assert "measured vs predicted" in line and "ZeroRedundancyOptimizer" in line and "bucket_cap_mb=8" in line
    assert not table["recommended"].any()
    # 30 ms: inside the band: the variant does not matter; the bucket advice stands
    table, line = _banded_for(30.0)
    assert line.startswith("recommendation: 32 MiB buckets at 2 ranks")
    assert "DDP or ZeRO-1 does not matter at 2 ranks" in line and "measured 30.0 ms is inside the band" in line
    assert table.loc[table["recommended"], "bucket_mb"].tolist() == [32.0]
    # 50 ms: above the band: DDP (the replayed variant) is the one to use
    table, line = _banded_for(50.0)
    assert "; torch_ddp over ZeRO-1: torch_zero1 (ZeRO-1, 8 MiB buckets, job torch_zero1-n2-b8) measured " \
           "50.0 ms is above torch_ddp at 32 MiB predicted 30.0 ms" in line
    assert table.loc[table["recommended"], "bucket_mb"].tolist() == [32.0]


def test_recommendation_at_a_world_size_the_source_did_not_run() -> None:
    # only 4 ranks asked for: the recommendation is for 4 ranks, where the 4 ms torch_zero1 job
    # (1 ms) beats every predicted DDP cell; the gain is against the predicted own cell at 4 ranks
    table, line = _banded_for(None, world_sizes=(4,))
    assert line.startswith("recommendation: ZeRO-1 at 4 ranks: torch_zero1 (ZeRO-1, 8 MiB buckets, job "
                           "torch_zero1-n4-b8) measured 1.0 ms")
    assert "98 % faster than the job's own 4 MiB (predicted 60.0 ms" in line


def test_family_bands_name_a_setting_the_global_error_could_not() -> None:
    from dpcore.read.whatif.advice import add_family_bands, family_of

    assert family_of(4.0, 2, 32.0, 2) == ("larger", "same") and family_of(4.0, 2, 1.0, 8) == ("smaller", "more")
    assert family_of(4.0, 2, 4.0, 1) == ("same", "fewer")
    cells = _cells({1.0: 70.0, 4.0: 60.0, 32.0: 45.0})
    # the global 42 %: 45 x 1.42 = 63.9 ms reaches the own 60 ms: "does not matter"
    _, line = recommend(add_bands(cells, (1.0, 1.0)), 2, 4.0)
    assert "the bucket size does not matter" in line and "within the model's 42 % error" in line
    # its family's 20 %: 45 x 1.2 = 54 ms < 60 ms: the bands separate, 32 MiB is named with its gain
    table = add_family_bands(cells, (1.0, 1.0), "torch_ddp", 4.0, 2, FAMILIES)
    out, line = recommend(table, 2, 4.0)
    assert line.startswith("recommendation: 32 MiB buckets at 2 ranks: predicted 45.0 ms against 60.0 ms")
    assert "15.0 ms (25 %) faster (band 10 to 40 %, the model's 20 % error)" in line
    assert out["recommended"].tolist() == [False, False, True]


def test_the_committed_family_table_is_read() -> None:
    from dpcore.read.whatif.advice import BANDS_CSV, family_errors

    fam = family_errors(BANDS_CSV)
    assert fam.index.names == ["variant", "buckets", "ranks"] and len(fam) >= 4
    # two sides, each a finite error; the half-width their mean
    assert ((fam["lower_pct"] >= 0) & (fam["upper_pct"] > 0) & (fam["cells"] >= 10)).all()
    assert np.isfinite(fam[["lower_pct", "upper_pct"]].to_numpy()).all()
    assert (fam["half_width_pct"] - (fam["lower_pct"] + fam["upper_pct"]) / 2).abs().max() < 0.01
    assert ("bucketed", "larger", "same") in fam.index and ("torch_ddp", "larger", "one_to_more") in fam.index
