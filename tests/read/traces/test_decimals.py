"""bytescan.decimals: number texts read by word arithmetic give numpy's cast of the text, bit for bit.

Why: the scan reads trace times by integer arithmetic on the text's 8-byte words (N / 10**k)
instead of numpy's text-to-float cast; the events frame must not change by one bit, so every
text is compared with the cast it replaced, on the texts that take the arithmetic (plain
decimals up to 2**53) and on every kind that must go to the cast instead.
"""
from __future__ import annotations

import numpy as np
import pytest

from dpcore.read.traces.bytescan import decimals


def _words(texts: list[str], words: int) -> tuple[np.ndarray, np.ndarray]:
    """(the texts right-aligned after spaces as (m, words) little-endian uint64, the same as S bytes)."""
    raw = np.asarray([t.rjust(8 * words).encode() for t in texts], f"S{8 * words}")
    return np.frombuffer(raw.tobytes(), "<u8").reshape(len(texts), words).copy(), raw


def _random_texts(rng: np.random.Generator, width: int, n: int) -> list[str]:
    out = []
    for _ in range(n):
        d = "".join(rng.choice(list("0123456789"), int(rng.integers(1, min(width, 20))))).lstrip("0") or "0"
        r = rng.random()
        if r < 0.6 and len(d) > 1:
            cut = int(rng.integers(1, len(d)))
            d = d[:cut] + "." + d[cut:]
        elif r < 0.64:
            d = "-" + d
        elif r < 0.68:
            d += "e" + str(int(rng.integers(-30, 30)))
        elif r < 0.7:
            d += " "  # whitespace after the value (before the comma)
        elif r < 0.72:
            d = "0." + d
        if len(d) <= width:
            out.append(d)
    return out


EDGES = [str(2 ** 53), str(2 ** 53 + 1), str(2 ** 53 - 1), "9007199254740993", "900719925474099.3",
         "0", "0.0", "-0", "-0.0", "1.000", "0.001", "9999999999999999", "99999999.99999999",
         "12345678901234567", "1234567890123456.7", "0.0000000000000001", "1212075532088.755",
         "1683564901552478", "1000000.0", "4.0", "\t5", "5\n", "1.5e-3", "1E5", "-12.5", "7"]


@pytest.mark.parametrize("words", [1, 2, 3])
def test_decimals_equal_numpys_cast_bit_for_bit(words: int) -> None:
    rng = np.random.default_rng(20261201 + words)
    texts = [t for t in _random_texts(rng, 8 * words, 20_000) + EDGES if t.strip() and len(t) <= 8 * words]
    w, raw = _words(texts, words)
    got, want = decimals(w), raw.astype(np.float64)
    differ = np.flatnonzero(got.view(np.uint64) != want.view(np.uint64))
    assert not differ.size, [(texts[i], got[i], want[i]) for i in differ[:5]]


def test_trace_times_and_known_values() -> None:
    texts = ["1212075532088.755", "1000000.0", "0.5", "17", "9007199254740992", "0.001", "-0"]
    w, _ = _words(texts, 3)
    got = decimals(w)
    assert got.tolist() == [1212075532088.755, 1000000.0, 0.5, 17.0, 9007199254740992.0, 0.001, -0.0]
    assert got[0] == float("1212075532088.755")


def test_text_that_is_no_number_raises_as_the_cast_does() -> None:
    w, _ = _words(['"ab"', "1.5"], 1)
    with pytest.raises(ValueError):
        decimals(w)
    w, _ = _words(["null", "2"], 1)
    with pytest.raises(ValueError):
        decimals(w)
