"""How a size or an empty cell is written for people: one rule for the CLI and the dashboard.

Why binary units: every size dpcore shows is a power-of-two quantity underneath (float32
buffers, DDP's ``bucket_cap_mb`` is MiB, ``--sizes 16MB`` means 16·2^20 bytes), so a decimal
rendering ("17M" for 16 MiB) misleads. Why one place: the all-reduce table of the CLI, the
dashboard's tables and figure titles must agree on "16 MiB", and an empty cell must say "—"
(not "None", not "nan") everywhere. No torch, no pandas: both wings import this.
"""
from __future__ import annotations

import math

#: What an empty cell shows: the value does not exist (not "zero", not "unknown").
EMPTY = "—"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _missing(value: object) -> bool:
    if value is None:
        return True
    try:
        return not math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True


def binary_size(nbytes: object) -> str:
    """Bytes in binary units with up to 3 significant digits: 16777216 -> '16 MiB',
    1536 -> '1.5 KiB', 512 -> '512 B'; None, NaN or anything not a number -> '—'."""
    if _missing(nbytes):
        return EMPTY
    v = float(nbytes)  # type: ignore[arg-type]
    sign, v = ("-" if v < 0 else ""), abs(v)
    k = 0
    while v >= 1024 and k < len(_UNITS) - 1:
        v /= 1024
        k += 1
    if k == 0 or v >= 100:
        text = f"{v:.0f}"
    else:
        text = f"{v:.1f}" if v >= 10 else f"{v:.2f}"
        text = text.rstrip("0").rstrip(".")
    return f"{sign}{text} {_UNITS[k]}"


def exact_size(nbytes: object) -> str:
    """Bytes readable and exact: '294 KiB = 301,352 B'; below 1 KiB just '16 B' (the same
    number twice says nothing); '—' when unknown. For a value a person may match against a log."""
    if _missing(nbytes):
        return EMPTY
    n = float(nbytes)  # type: ignore[arg-type]
    if abs(n) < 1024:
        return binary_size(n)
    exact = f"{int(n):,}" if n == int(n) else f"{n:,.1f}"
    return f"{binary_size(n)} = {exact} B"


def mib_size(mb: object) -> str:
    """A size given in MB as dpcore's options take it (MiB: ``--bucket-mb 25`` = 25·2^20 bytes)."""
    return EMPTY if _missing(mb) else binary_size(float(mb) * 2**20)  # type: ignore[arg-type]


def cell(value: object, empty: str = EMPTY) -> str:
    """A table cell as text: the value, or ``empty`` for None / NaN / an empty string."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return empty
    return str(value)


def ranks_text(n: object) -> str:
    """'1 rank', '2 ranks': a world size in words (never '1 ranks')."""
    k = int(float(n))  # type: ignore[arg-type]
    return f"{k} rank" if k == 1 else f"{k} ranks"


def number(value: object, spec: str) -> str:
    """A value by a format spec ('.3f', '+.2f'), or '—' when unknown: a text line never
    prints 'nan' for a number its run does not hold."""
    return EMPTY if _missing(value) else format(float(value), spec)  # type: ignore[arg-type]


def percent_number(value: object, digits: int = 1) -> str:
    """A value already in percent as a bare number with one fixed number of decimals, for a
    column whose header says '%': 62.987 -> '63.0'; None/NaN -> '—'."""
    return EMPTY if _missing(value) else f"{float(value):.{digits}f}"  # type: ignore[arg-type]


def percent(value: object, digits: int = 1) -> str:
    """A value already in percent, with one fixed number of decimals: 62.987 -> '63.0%';
    None/NaN -> '—'. One rule, so that a table never mixes 0, 1 and 2 decimals."""
    if _missing(value):
        return EMPTY
    return f"{float(value):.{digits}f}%"  # type: ignore[arg-type]
