"""Labels that never print over each other: the kept labels of a crowded scatter are apart by
more than their size, the dropped ones are left to the hover (issue 24: the Memory trade's
labels piled up unreadably)."""
from __future__ import annotations

from itertools import combinations

import pandas as pd

from dpcore.read.plots.labels import LINE_PX, boxes_overlap, label_box, spaced_labels
from dpcore.read.plots.memory import TRADE_PLOT_PX, memory_tradeoff_figure


def test_crowded_points_keep_only_labels_that_fit() -> None:
    x = [10.0, 10.2, 10.4, 50.0]
    y = [5.0, 5.0, 5.1, 20.0]
    out = spaced_labels(x, y, ["bucketed ×2", "torch_ddp ×2", "zero1 ×2", "fsdp ×2"], (0, 60), (0, 25), (400, 250))
    assert out == ["bucketed ×2", "", "", "fsdp ×2"]  # the first of a pile wins, far points keep theirs
    assert spaced_labels([1.0], [1.0], ["a"], (0, 2), (0, 2), (100, 100)) == ["a"]
    assert spaced_labels([float("nan")], [1.0], ["a"], (0, 2), (0, 2), (100, 100)) == [""]


def test_memory_trade_labels_are_apart_by_more_than_their_height() -> None:
    """Twelve jobs within 2 ms and 1 MiB of each other (what a CPU sweep looks like): the figure's
    own text, placed on its own axes, has no two labels closer than a label's height."""
    jobs = pd.DataFrame({"job_id": [f"j{i}" for i in range(12)],
                         "variant": ["bucketed", "torch_ddp", "zero1", "torch_zero1"] * 3,
                         "world_size": 2, "bucket_mb": [0.25, 1.0, 2.0] * 4,
                         "step_ms": [20 + 0.15 * i for i in range(12)], "step_ms_p10": 19.0, "step_ms_p90": 23.0,
                         "peak_bytes": [(15 + 0.05 * i) * 2**20 for i in range(12)],
                         "peak_bytes_max": 16 * 2**20, "held_bytes": 15 * 2**20})
    fig = memory_tradeoff_figure(jobs)
    (x0, x1), (y0, y1) = fig.layout.xaxis.range, fig.layout.yaxis.range
    w, h = TRADE_PLOT_PX
    boxes = [label_box((xv - x0) / (x1 - x0) * w, (yv - y0) / (y1 - y0) * h, t)
             for tr in fig.data for xv, yv, t in zip(tr.x, tr.y, tr.text) if t]
    assert 1 <= len(boxes) < 12  # crowded: some labels left to the hover
    assert not any(boxes_overlap(a, b) for a, b in combinations(boxes, 2))
    assert all(b[3] - b[1] == LINE_PX for b in boxes)
