"""Interval algebra against hand-computed answers (the base of every overlap number)."""
import numpy as np
import pytest

from dpcore.contract.intervals import clip, overlap_stats
from dpcore.read.analysis import intersect_length, merge, subtract, union_length


@pytest.mark.parametrize("a,b,inter", [
    ([(0, 10)], [(20, 30)], 0.0),                      # no overlap
    ([(0, 10)], [(0, 10)], 10.0),                      # full overlap
    ([(0, 10)], [(2, 3), (4, 6)], 3.0),                # nested
    ([(0, 10)], [(10, 20)], 0.0),                      # touching
    ([(0, 5), (5, 10)], [(4, 6)], 2.0),                # touching pieces merged
    ([(0, 10), (2, 8)], [(1, 3), (7, 12)], 5.0),       # overlapping inside A
])
def test_intersect_length_known(a, b, inter):
    (as_, ae), (bs, be) = zip(*a), zip(*b)
    assert intersect_length(as_, ae, bs, be) == pytest.approx(inter)
    assert intersect_length(bs, be, as_, ae) == pytest.approx(inter)


def test_union_and_merge():
    assert union_length([0, 0.5, 10], [1, 2, 11]) == pytest.approx(3.0)
    assert union_length([], []) == 0.0
    s, e = merge([5, 0, 1, 3], [6, 1, 2, 4])
    assert s.tolist() == [0, 3, 5] and e.tolist() == [2, 4, 6]
    assert union_length([3, 0], [1, 2]) == pytest.approx(2.0)  # inverted interval dropped


def test_many_small_intervals():
    starts = np.arange(0, 10000, 2.0)        # [0,1],[2,3],... 5000 of them
    comp_s, comp_e = np.array([0.0]), np.array([5000.0])
    assert union_length(starts, starts + 1) == pytest.approx(5000.0)
    assert intersect_length(starts, starts + 1, comp_s, comp_e) == pytest.approx(2500.0)
    st = overlap_stats((starts, starts + 1), (comp_s, comp_e))
    assert st["overlap_pct"] == pytest.approx(50.0) and st["exposed"] == pytest.approx(2500.0)


def test_subtract_clip_and_no_comm():
    s, e = subtract([0], [10], [2, 4], [3, 12])
    assert s.tolist() == [0, 3] and e.tolist() == [2, 4]
    s, e = clip([-5, 5, 20], [2, 15, 30], 0, 10)
    assert s.tolist() == [0, 5] and e.tolist() == [2, 10]
    assert np.isnan(overlap_stats((np.empty(0), np.empty(0)), (np.array([0.0]), np.array([1.0])))["overlap_pct"])
