"""Two-sided what-if bands: the fit on held-out signed errors, the band drawn from a family table
with a lower and an upper error, old one-width tables, and the 1-rank source's own family (known
values; no run, no timing)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.read.whatif.advice import (
    ONE_TO_MORE,
    add_family_bands,
    error_text,
    family_errors,
    family_of,
    recommend,
)
from dpcore.read.whatif.bandfit import fit_family, held_out_inside, narrowest, side_needs


def _cells(steps: dict[float, float], ws: int = 2, measured: dict[float, float] | None = None) -> pd.DataFrame:
    measured = measured or {}
    return pd.DataFrame({"world_size": ws, "bucket_mb": list(steps), "step_ms": list(steps.values()),
                         "measured_step_ms": [measured.get(b, np.nan) for b in steps]})


def _table(rows: list[tuple[str, str, str, float, float]]) -> pd.DataFrame:
    """A bands.csv of (variant, buckets, ranks, lower_pct, upper_pct) rows, 30 cells each."""
    df = pd.DataFrame(rows, columns=["variant", "buckets", "ranks", "lower_pct", "upper_pct"])
    return df.assign(cells=30, half_width_pct=(df["lower_pct"] + df["upper_pct"]) / 2,
                     inside_held_out_pct=90.0).set_index(["variant", "buckets", "ranks"])


def test_side_needs_split_each_miss_to_its_side_less_the_sources_doubt() -> None:
    # measured 1.25 x the prediction needs 25 % up, nothing down; 0.8 x needs 20 % down; with a
    # 15 % doubt up the 25 % needs sqrt(0.25^2 - 0.15^2) = 20 %; a doubt wider than the miss needs none
    down, up = side_needs(np.array([0.25, -0.2, 0.25, 0.05]), np.array([0.0, 0.0, 0.0, 0.0]),
                          np.array([0.0, 0.0, 0.15, 0.1]))
    assert down.tolist() == pytest.approx([0.0, 0.2, 0.0, 0.0])
    assert up.tolist() == pytest.approx([0.25, 0.0, 0.2, 0.0])


def test_narrowest_band_on_known_signed_errors_reaches_up_where_the_model_predicts_low() -> None:
    # twenty cells, as a 1-rank source gives them: 18 measured above the prediction by 2, 4, ..., 36 %,
    # two below by 3 and 5 %. 90 % of 20 = 18 held, 2 may miss.
    up = np.array([2.0 * k for k in range(1, 19)] + [0.0, 0.0])
    down = np.array([0.0] * 18 + [3.0, 5.0])
    lo, hi = narrowest(down, up, 0.9)
    # splits: miss both below (lo 0, hi 36: width 36), one each (lo 3, hi 34: 37), both above (lo 5,
    # hi 32: 37): the narrowest misses the two small ones below and reaches 36 % up
    assert (lo, hi) == (0.0, 36.0)
    held = (down <= lo) & (up <= hi)
    assert held.mean() >= 0.9 and held.sum() == 18
    # a symmetric half-width holding the same 18 cells would need 34 % on both sides (68 % wide)
    assert narrowest(down, up, 1.0) == (5.0, 36.0)
    assert narrowest(np.array([]), np.array([]), 0.9) == (0.0, 0.0)


def test_fit_family_raises_the_level_until_sources_left_out_are_held() -> None:
    # four sources of five cells each, all predicted low by 10..28 % (source s: 10 + 6 s .. + 4)
    up = np.array([10.0 + 6 * s + k for s in range(4) for k in range(5)])
    down = np.zeros(20)
    groups = np.repeat(["a", "b", "c", "d"], 5)
    # at 90 %: each source left out gets the others' 90th percentile: d (28..32) sits above a-c's
    # (at most 26), so d is missed whole: 15 of 20 held
    assert held_out_inside(down, up, groups, 0.9) == pytest.approx(0.75)
    fit = fit_family(down, up, groups, 0.9)
    # no level holds d from a-c (its cells are above all of theirs): level 1, every cell in sample
    assert (fit.lower, fit.upper, fit.level) == (0.0, 32.0, 1.0)
    assert fit.held_out == pytest.approx(0.75)
    # interleaved sources (1..40 % up, a: 1, 5, ..., 37; b: 2, 6, ...): at 90 % each source left out
    # gets the 4th largest of the other 30 (27 held: 36, 36, 36, 35) and misses its top cell, d its
    # top two: 35 of 40. At 90.5 % the others keep 28 (the 3rd largest: 38, 37, 37, 37): 37 of 40
    up = np.array([float(k) for k in range(1, 41)])
    groups = np.array(list("abcd") * 10)
    assert held_out_inside(np.zeros(40), up, groups, 0.9) == pytest.approx(35 / 40)
    fit = fit_family(np.zeros(40), up, groups, 0.9)
    assert (fit.lower, fit.level, fit.held_out) == (0.0, pytest.approx(0.905), pytest.approx(37 / 40))
    # then fitted on all 40 at 90.5 %: 37 held, 3 missed: the 4th largest, 37 % up
    assert fit.upper == 37.0 and (up <= fit.upper).mean() >= 0.9
    # one source: nothing to leave out: fitted at the level promised, its held-out share unknown
    one = fit_family(np.zeros(10), np.arange(1.0, 11.0), np.array(["a"] * 10), 0.9)
    assert (one.lower, one.upper, one.level) == (0.0, 9.0, 0.9) and np.isnan(one.held_out)


def test_a_two_sided_family_band_around_a_prediction_from_a_made_table() -> None:
    table = _table([("torch_ddp", "larger", "same", 5.0, 40.0)])
    cells = _cells({32.0: 100.0}, measured={32.0: 130.0})
    out = add_family_bands(cells, (0.0, 0.0), "torch_ddp", 4.0, 2, table).iloc[0]
    assert (out["step_ms_lo"], out["step_ms_hi"]) == pytest.approx((95.0, 140.0))
    assert (out["model_error_lo_pct"], out["model_error_hi_pct"], out["model_error_pct"]) == (5.0, 40.0, 40.0)
    assert bool(out["in_band"]) and "errors -5/+40 % below/above" in out["band_from"]
    # the source's doubt adds on each side in quadrature: 12 % down, 30 % up
    out = add_family_bands(cells, (0.12, 0.3), "torch_ddp", 4.0, 2, table).iloc[0]
    # 100 x (1 - sqrt(0.05^2 + 0.12^2)) = 87; 100 x (1 + sqrt(0.4^2 + 0.3^2)) = 150
    assert (out["step_ms_lo"], out["step_ms_hi"]) == pytest.approx((87.0, 150.0))


def test_an_old_table_with_one_half_width_is_read_symmetric(tmp_path: Path) -> None:
    path = tmp_path / "bands.csv"
    path.write_text("variant,buckets,ranks,cells,mae_pct,half_width_pct,inside_held_out_pct,where\n"
                    "bucketed,larger,same,30,8.3,16.5,90.0,old\nbucketed,larger,more,30,18.4,36.9,90.0,old\n")
    fam = family_errors(path)
    assert fam.loc[("bucketed", "larger", "same"), ["lower_pct", "upper_pct"]].tolist() == [16.5, 16.5]
    out = add_family_bands(_cells({16.0: 10.0}), (0.0, 0.0), "bucketed", 4.0, 2, fam).iloc[0]
    assert (out["step_ms_lo"], out["step_ms_hi"]) == pytest.approx((8.35, 11.65))
    # its "more" rows were the 1 -> 2 cells: a 1-rank source takes them, and says whose they are
    one = add_family_bands(_cells({16.0: 10.0}), (0.0, 0.0), "bucketed", 4.0, 1, fam).iloc[0]
    assert (one["step_ms_lo"], one["step_ms_hi"]) == pytest.approx((6.31, 13.69))
    assert "no held-out cells of family bucketed, larger buckets, more ranks from one rank" in one["band_from"]


def test_a_one_rank_source_takes_the_one_rank_family() -> None:
    assert family_of(4.0, 1, 4.0, 8) == ("same", ONE_TO_MORE) and family_of(4.0, 1, 16.0, 2) == ("larger", ONE_TO_MORE)
    assert family_of(4.0, 2, 4.0, 8) == ("same", "more") and family_of(4.0, 1, 4.0, 1) == ("same", "same")
    table = _table([("bucketed", "same", "more", 10.0, 10.0), ("bucketed", "same", ONE_TO_MORE, 2.0, 50.0)])
    one = add_family_bands(_cells({4.0: 100.0}, ws=8), (0.0, 0.0), "bucketed", 4.0, 1, table).iloc[0]
    assert (one["step_ms_lo"], one["step_ms_hi"]) == pytest.approx((98.0, 150.0))
    assert one["band_from"].startswith("family bucketed, same buckets, more ranks from one rank: errors -2/+50 %")
    two = add_family_bands(_cells({4.0: 100.0}, ws=8), (0.0, 0.0), "bucketed", 4.0, 2, table).iloc[0]
    assert (two["step_ms_lo"], two["step_ms_hi"]) == pytest.approx((90.0, 110.0))
    # a 2-rank source at more ranks where only 1-rank sources were held out: theirs, said so
    only_one = table.drop(index=("bucketed", "same", "more"))
    two = add_family_bands(_cells({4.0: 100.0}, ws=8), (0.0, 0.0), "bucketed", 4.0, 2, only_one).iloc[0]
    assert (two["step_ms_lo"], two["step_ms_hi"]) == pytest.approx((98.0, 150.0))
    assert "no held-out cells of family bucketed, same buckets, more ranks" in two["band_from"]


def test_the_recommendation_weighs_the_upper_error_and_prints_both() -> None:
    assert error_text(20.0, 20.0) == "20 %" and error_text(5.0, 40.0) == "-5/+40 %"
    table = _table([("torch_ddp", "larger", "same", 0.0, 30.0)])
    cells = _cells({1.0: 70.0, 4.0: 60.0, 32.0: 45.0})
    # 45 ms may come out 30 % slower: 58.5 < 60 ms: named; gain band (60 - 58.5) / 60 = 2.5 % to 25 %
    _, line = recommend(add_family_bands(cells, (0.0, 0.0), "torch_ddp", 4.0, 2, table), 2, 4.0)
    assert "15.0 ms (25 %) faster (band 2 to 25 %, the model's -0/+30 % error)" in line
    # 40 % up: 63 ms reaches the own 60 ms: "does not matter", though 40 % down would not have mattered
    table = _table([("torch_ddp", "larger", "same", 0.0, 40.0)])
    _, line = recommend(add_family_bands(cells, (0.0, 0.0), "torch_ddp", 4.0, 2, table), 2, 4.0)
    assert "does not matter" in line and "within the model's -0/+40 % error" in line
