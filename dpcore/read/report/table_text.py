"""How every command prints a table: text for a terminal, CSV for a pipe.

Why one place: ``analyze``, ``summarize``, ``stragglers`` and ``whatif`` print their tables the
same way (two decimals, ``—`` for an empty cell as on the dashboard; percentages in percent;
CSV with four decimals), so a reader learns the
format once and a change of convention is one edit.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

from dpcore.contract.units import EMPTY


def two_decimals(v: float) -> str:
    """The default number format of a text table: ``12.35``."""
    return f"{v:.2f}"


def text_table(df: pd.DataFrame, float_format: Callable[[float], str] | None = two_decimals,
               na_rep: str = EMPTY, formatters: Mapping[str, Callable[[object], str]] | None = None) -> str:
    """``df`` as aligned text without the index: floats through ``float_format`` (None: pandas'
    own), empty cells as ``na_rep`` ('—', what the dashboard shows), and ``formatters`` for single columns."""
    return df.to_string(index=False, float_format=float_format, na_rep=na_rep, formatters=formatters)


def csv_table(df: pd.DataFrame) -> str:
    """``df`` as CSV without the index, floats with four decimals (what every ``--csv`` prints)."""
    return df.to_csv(index=False, float_format="%.4f")
