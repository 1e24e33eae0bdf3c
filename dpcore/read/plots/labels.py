"""Text labels that never print on top of each other.

Why: a label drawn next to every marker of a scatter is unreadable where markers crowd (the
Memory trade with a dozen jobs around one point); a plotly trace cannot avoid collisions
itself. :func:`spaced_labels` keeps a label only where its box, in pixels of the plot area the
figure is drawn into, is clear of every label kept before it; the others are left to the hover
and the legend. :func:`boxes_overlap` is the same test, for tests and for the browser check
(label positions closer than their size). Pure: numbers in, strings out.
"""
from __future__ import annotations

from collections.abc import Sequence

#: Width of one character and height of one line of an 11 px plotly label, in px (a generous
#: estimate for the default font: a kept label's real box is no larger).
CHAR_PX = 6.6
LINE_PX = 15.0


def label_box(x_px: float, y_px: float, text: str, above: bool = True) -> tuple[float, float, float, float]:
    """(left, bottom, right, top) in px of ``text`` centred on x, above the point (y grows up),
    leaving room for a 12 px marker."""
    w = CHAR_PX * len(text)
    bottom = y_px + 7.0 if above else y_px - 7.0 - LINE_PX
    return (x_px - w / 2, bottom, x_px + w / 2, bottom + LINE_PX)


def boxes_overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    """Whether two (left, bottom, right, top) boxes share any area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def spaced_labels(x: Sequence[float], y: Sequence[float], texts: Sequence[str], x_range: tuple[float, float],
                  y_range: tuple[float, float], size_px: tuple[float, float]) -> list[str]:
    """``texts`` with "" where a label would overlap one kept earlier (earlier points win), for
    points at (x, y) on axes spanning ``x_range``/``y_range`` drawn into a ``size_px`` (width,
    height) plot area. A point outside the ranges, not a number, or whose label would be cut at the
    plot's edge gets no label."""
    (x0, x1), (y0, y1), (w, h) = x_range, y_range, size_px
    kept: list[tuple[float, float, float, float]] = []
    out = []
    for xv, yv, text in zip(x, y, texts):
        try:
            px, py = (float(xv) - x0) / (x1 - x0) * w, (float(yv) - y0) / (y1 - y0) * h
        except (TypeError, ValueError, ZeroDivisionError):
            out.append("")
            continue
        box = label_box(px, py, str(text))
        inside = 0 <= box[0] and box[2] <= w and 0 <= py <= h and box[3] <= h + LINE_PX  # never cut at an edge
        if text and inside and not any(boxes_overlap(box, k) for k in kept):
            kept.append(box)
            out.append(str(text))
        else:
            out.append("")
    return out
