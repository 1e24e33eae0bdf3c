"""The Compression panel as a newcomer sees it: every marker and label inside the plot, one
reference point for the plain jobs of a bucket sweep, each hook job named once, and the table's
bytes in binary units."""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.read.analysis.comm_hooks import COLUMNS
from dpcore.read.dashboard.table_cells import compression_rows
from dpcore.read.plots.comm_hooks import compression_figure

MIB = 2**20


def _rows() -> pd.DataFrame:
    """A sweep of two bucket sizes: each plain job (hook none, at the origin) before its fp16 job,
    which sends half the bytes; fp16 is 3 ms slower at 1 MiB and 2 ms faster at 25 MiB."""
    rows = []
    for b, added in ((1.0, 3.0), (25.0, -2.0)):
        base = {c: np.nan for c in COLUMNS} | {"world_size": 2, "bucket_mb": b, "status": "complete",
                                                "reason": "", "bytes_in": 4 * MIB}
        rows.append(base | {"job_id": f"torch_ddp-ws2-b{b:g}", "hook": "none", "bytes_wire": 4 * MIB,
                            "saved_pct": 0.0, "added_ms": 0.0})
        rows.append(base | {"job_id": f"torch_ddp-ws2-b{b:g}-fp16", "hook": "fp16", "bytes_wire": 2 * MIB,
                            "saved_pct": 50.0, "added_ms": added, "step_ms": 20.0 + added,
                            "plain_step_ms": 20.0})
    return pd.DataFrame(rows, columns=COLUMNS)


def test_every_point_and_the_origin_sit_inside_the_axes():
    fig = compression_figure(_rows())
    xr, yr = fig.layout.xaxis.range, fig.layout.yaxis.range
    points = [(x, y) for t in fig.data for x, y in zip(t.x, t.y)]
    assert (0.0, 0.0) in points
    for x, y in points:  # a marker at an axis's end is drawn half off the chart
        assert xr[0] < x < xr[1] and yr[0] < y < yr[1], (x, y, xr, yr)
        assert min(x - xr[0], xr[1] - x) >= 0.1 * (xr[1] - xr[0]) * 0.9
    assert (2.0, 3.0) in points and (2.0, -2.0) in points


def test_the_plain_jobs_are_one_point_and_each_hook_job_is_named_once():
    fig = compression_figure(_rows())
    texts = [s for t in fig.data if t.text is not None for s in t.text]
    assert texts == ["no hook"]
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert names == ["fp16: torch_ddp ×2 · 1 MiB", "fp16: torch_ddp ×2 · 25 MiB"]


def test_the_table_shows_bytes_in_binary_units():
    shown = compression_rows(_rows())
    assert shown["bytes_in"].tolist() == ["4 MiB"] * 4
    assert shown["bytes_wire"].tolist() == ["4 MiB", "2 MiB", "4 MiB", "2 MiB"]
    assert shown["bucket_mb"].tolist() == ["1 MiB", "1 MiB", "25 MiB", "25 MiB"]
    assert shown["added_ms"].tolist() == [0.0, 3.0, 0.0, -2.0]  # numbers stay numbers (the page rounds)


def _summary_with_a_hook_job() -> tuple[pd.DataFrame, pd.DataFrame]:
    """job_summary-like rows: torch_ddp ×2 at 1 and 25 MiB, and an fp16 hook job beside the 1 MiB one."""
    ids = ["torch_ddp-ws2-b1", "torch_ddp-ws2-b1-fp16", "torch_ddp-ws2-b25"]
    summary = pd.DataFrame({"job_id": ids, "variant": "torch_ddp", "world_size": 2, "bucket_mb": [1.0, 1.0, 25.0],
                            "step_ms": [30.0, 28.0, 22.0], "exposed_ms": [10.0, 12.0, 4.0],
                            "overlap_pct": [15.0, 14.0, 0.0], "comm_ops": [4, 4, 1]})
    jobs = pd.DataFrame({"job_id": ids, "comm_hook": [None, "fp16", None]})
    return summary, jobs


def test_a_hook_job_gets_its_own_label_beside_the_plain_job():
    from dpcore.read.plots.style import label_jobs

    summary, _ = _summary_with_a_hook_job()
    assert label_jobs(summary).tolist() == ["torch_ddp ×2 · 1 MiB", "torch_ddp ×2 · 1 MiB · fp16",
                                            "torch_ddp ×2 · 25 MiB"]


def test_the_bucket_sweep_is_the_plain_jobs_only():
    from dpcore.read.analysis import bucket_sweep

    summary, jobs = _summary_with_a_hook_job()
    assert bucket_sweep(summary, jobs)["step_ms"].tolist() == [30.0, 22.0]
    assert len(bucket_sweep(summary)) == 3  # without the jobs table nothing tells them apart
