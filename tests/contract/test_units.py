"""Sizes as people read them (contract.units): binary units, exact bytes where a log must match."""
from __future__ import annotations

import math

from dpcore.contract.units import EMPTY, binary_size, exact_size


def test_exact_size_is_readable_and_exact() -> None:
    assert exact_size(301_352) == "294 KiB = 301,352 B"
    assert exact_size(4_000) == "3.91 KiB = 4,000 B"
    assert exact_size(16 * 2**20) == "16 MiB = 16,777,216 B"
    assert exact_size(16) == "16 B" and exact_size(0) == "0 B"  # below 1 KiB: once
    assert exact_size(None) == exact_size(math.nan) == exact_size("x") == EMPTY
    assert exact_size(301_352).startswith(binary_size(301_352))


def test_number_formats_by_spec_and_dashes_the_unknown():
    from dpcore.contract.units import number
    assert number(1.23456, "+.2f") == "+1.23" and number(3, ".0f") == "3"
    assert number(2.3074841, ".7g") == "2.307484"
    assert [number(v, ".3f") for v in (float("nan"), None, float("inf"), "x")] == ["—"] * 4
