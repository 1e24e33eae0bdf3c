"""Plot builders are pure: DataFrames shaped as docs/ANALYSIS_API.md documents in, figures out.

Why these tests: the dashboard's figures must not depend on Streamlit, must survive empty input
(a run without a sweep or without messages), and the timeline must reduce a 250,000-event trace
to something a browser can draw.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from dpcore.read.plots.bandwidth import bandwidth_figure
from dpcore.read.plots.buckets import bucket_figure
from dpcore.read.plots.overview import breakdown_figure, comparison_figure
from dpcore.read.plots.ring import chunk_figure, message_count_figure, message_figure, wait_transfer_figure
from dpcore.read.plots.scaling import scaling_figure
from dpcore.read.plots.timeline import reduce_intervals, timeline_figure


def summary() -> pd.DataFrame:
    rows = []
    for v, ws, b, step, comp, ov, exp in [("single", 1, 25.0, 26, 26, 0, 0), ("ring", 2, 25.0, 40, 26, 0, 12),
                                          ("bucketed", 2, 5.0, 31, 26, 8, 3), ("bucketed", 2, 25.0, 33, 26, 2, 5)]:
        rows.append(dict(job_id=f"{v}-ws{ws}", variant=v, world_size=ws, bucket_mb=b, status="complete",
                         step_ms=step, step_ms_p10=step * .9, step_ms_p90=step * 1.1, compute_ms=comp,
                         overlapped_ms=ov, exposed_ms=exp, other_ms=step - comp - exp, comm_ms=ov + exp,
                         comm_fraction=exp / step, overlap_pct=100 * ov / max(ov + exp, 1e-9), comm_ops=3,
                         comm_bytes=4 << 20, throughput=32 * ws / step * 1e3, oversubscribed=False))
    return pd.DataFrame(rows)


def test_breakdown_stacks_to_step_time() -> None:
    s = summary()
    fig = breakdown_figure(s)
    bars = [t for t in fig.data if t.type == "bar"]
    assert fig.layout.barmode == "stack" and len(bars) == 4
    total = sum(np.asarray(t.y, float) for t in bars)
    ranked = s.assign(o=s.variant.map({"single": 0, "ring": 1, "bucketed": 2}))
    order = ranked.sort_values(["o", "world_size", "bucket_mb"])["step_ms"].to_numpy(float)
    assert np.allclose(total, order)
    assert "5 MiB" in " ".join(fig.data[0].x)  # bucket shown where a variant has several (binary units)
    whiskers = [t for t in fig.data if t.type == "scatter"][0]
    assert np.allclose(np.asarray(whiskers.error_y.array, float), order * 0.1)  # p90 - median
    assert np.allclose(np.asarray(whiskers.error_y.arrayminus, float), order * 0.1)  # median - p10
    assert fig.layout.yaxis.range is None  # no outlier: plotly's own range


def test_many_long_labels_are_upright_with_their_room_made_before_plotly_measures() -> None:
    """upright_labels: 52 jobs with labels up to 28 characters (the sample run's): upright, the
    bottom margin the longest label's estimated width plus the axis title, the figure taller by it
    so the plot keeps its 285 px; four short labels are left to Plotly (no angle, the base margins)."""
    from dpcore.read.plots.overview import LABEL_PX_PER_CHAR, PLOT_AREA_PX

    few = breakdown_figure(summary())
    assert few.layout.xaxis.tickangle is None and few.layout.margin.b == 50 and few.layout.height == 420
    rows = pd.concat([summary()] * 13, ignore_index=True)
    rows["variant"] = [f"torch_ddp_{i:02d}" for i in range(len(rows))]
    rows.loc[0, "variant"] = "torch_ddp×2 · 256 KiB · fp16x"  # 28 characters, the longest label
    many = breakdown_figure(rows, "Where a training step's time goes")
    labels = list(many.data[0].x)
    longest = max(len(x) for x in labels)
    assert len(labels) == 52 and longest >= 28
    assert many.layout.xaxis.tickangle == -90
    assert many.layout.margin.b == round(longest * LABEL_PX_PER_CHAR) + 40
    assert many.layout.height == many.layout.margin.t + PLOT_AREA_PX + many.layout.margin.b
    assert many.layout.margin.l == 80
    both = comparison_figure({"a": rows, "b": rows.assign(step_ms=lambda d: d.step_ms * 2)})
    assert both.layout.xaxis.tickangle == -90  # compare mode: the same 52 categories, the same room
    assert both.layout.margin.b == many.layout.margin.b
    assert both.layout.height == both.layout.margin.t + PLOT_AREA_PX + both.layout.margin.b
    assert comparison_figure({"a": summary(), "b": summary()}).layout.xaxis.tickangle is None


def test_one_exploded_job_does_not_squash_the_overview() -> None:
    s = summary()
    s.loc[0, ["step_ms", "step_ms_p10", "step_ms_p90", "compute_ms"]] = [830.0, 12.0, 900.0, 26.0]
    s.loc[0, "other_ms"] = 830.0 - 26.0
    s["noisy"] = [True, False, False, False]
    fig = breakdown_figure(s)
    top = fig.layout.yaxis.range[1]
    assert 40 * 1.1 < top < 40 * 1.1 * 1.2  # the highest p90 of the other jobs (44), plus headroom
    assert any("830" in a.text for a in fig.layout.annotations)
    whiskers = [t for t in fig.data if t.type == "scatter"][0]
    assert list(whiskers.marker.symbol).count("x") == 1  # the noisy job is marked


def test_every_cut_bar_is_labelled_and_neighbouring_labels_cannot_collide() -> None:
    """Issue 24: a bar above a shared (compare-mode) cap was cut with no "↑" label, and two
    neighbouring labels printed over each other. Every bar whose stack passes the top gets one,
    drawn up its own bar (rotated): one bar wide, so neighbours never overlap."""
    s = summary()
    fig = breakdown_figure(s, y_max=15.0)  # a cap below several jobs, as a shared compare axis
    order = s.assign(o=s.variant.map({"single": 0, "ring": 1, "bucketed": 2})).sort_values(
        ["o", "world_size", "bucket_mb"])
    stack = sum(np.asarray(t.y, float) for t in fig.data if t.type == "bar")
    cut = [label for label, h in zip(fig.data[0].x, stack) if h > 15.0]
    labels = [a for a in fig.layout.annotations if a.text.startswith("↑")]
    assert cut and [a.x for a in labels] == cut
    assert [a.text for a in labels] == [f"↑ {v:,.0f} ms" for v, h in zip(order["step_ms"], stack) if h > 15.0]
    assert all(a.textangle == -90 and a.yanchor == "top" for a in labels)
    assert len({a.x for a in labels}) == len(labels)  # one per bar


def test_empty_inputs_give_explanatory_figures() -> None:
    for fig in (breakdown_figure(pd.DataFrame()), scaling_figure(pd.DataFrame()), bucket_figure(pd.DataFrame()),
                bandwidth_figure(pd.DataFrame()), timeline_figure(pd.DataFrame(columns=["rank"])),
                message_figure(pd.DataFrame()), wait_transfer_figure(pd.DataFrame()),
                message_count_figure(pd.DataFrame()), comparison_figure({})):
        assert isinstance(fig, go.Figure) and fig.layout.annotations


def test_comparison_groups_runs() -> None:
    fig = comparison_figure({"a": summary(), "b": summary().assign(step_ms=lambda d: d.step_ms * 2)})
    assert [t.name for t in fig.data] == ["a", "b"]


def test_scaling_marks_ideal_and_oversubscribed() -> None:
    df = pd.DataFrame(dict(variant=["ring"] * 3, world_size=[1, 2, 4], step_ms=[10, 11, 15], throughput=[1, 2, 3],
                           speedup=[1, 1.8, 2.6], efficiency=[1, .9, .66], ideal_speedup=[1, 2, 4],
                           oversubscribed=[False, False, True]))
    fig = scaling_figure(df, "weak")
    names = [t.name for t in fig.data]
    assert "ideal" in names and "× = oversubscribed" in names
    assert list(fig.data[0].marker.symbol) == ["circle", "circle", "x-open"]


def test_bandwidth_and_buckets_use_log_axes() -> None:
    bw = pd.DataFrame(dict(algo=["ring", "ring"], world_size=[2, 2], bytes=[1024, 1 << 20], time_ms=[.1, 1.0],
                           algbw_gbps=[.01, 1.0], busbw_gbps=[.01, 1.0]))
    fig = bandwidth_figure(bw)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log" and len(fig.data) == 2
    bk = pd.DataFrame(dict(variant=["bucketed"] * 3, world_size=[2] * 3, bucket_mb=[1, 5, 25], step_ms=[3, 2, 4],
                           exposed_ms=[1, .5, 2]))
    assert bucket_figure(bk).layout.xaxis.type == "log"


def test_timeline_lanes_and_reduction_of_a_huge_trace() -> None:
    small = pd.DataFrame(dict(rank=[0, 0, 1, 1], lane=["compute", "comm", "compute", "comm"],
                              name=["forward", "all_reduce", "forward", "all_reduce"],
                              start_ms=[0, 5, 0, 6], end_ms=[10, 12, 9, 13]))
    fig = timeline_figure(small)
    assert list(fig.layout.yaxis.categoryarray)[::-1][:2] == ["rank 0 · compute", "rank 0 · comm"]
    n = 250_000
    rng = np.random.default_rng(0)
    start = np.sort(rng.uniform(0, 500, n))
    big = pd.DataFrame(dict(rank=rng.integers(0, 2, n), lane=np.where(rng.random(n) < .7, "compute", "comm"),
                            name="aten::add", start_ms=start, end_ms=start + rng.uniform(0, .01, n)))
    reduced = reduce_intervals(big, max_bars_per_lane=1500)
    fig = timeline_figure(big)  # its speed is benchmarked (benchmarks/), not timed here
    assert reduced.groupby(["rank", "lane"]).size().max() <= 1500
    assert reduced["ops"].sum() == n  # every op is accounted for in some merged bar
    assert sum(len(t.x) for t in fig.data) <= 4 * 1500


def messages() -> pd.DataFrame:
    rows = []
    for k, phase in enumerate(["reduce_scatter", "all_gather"]):
        for r in range(2):
            common = dict(job_id="ring-ws2", algo="ring", step=0, call=0, phase=phase, ring_step=0, bytes=100)
            rows.append(dict(common, rank=r, src=r, dst=1 - r, chunk=r, side="send", t_post_ns=k * 10**6,
                             t_done_ns=k * 10**6 + 400_000))
            rows.append(dict(common, rank=r, src=1 - r, dst=r, chunk=1 - r, side="recv", t_post_ns=k * 10**6,
                             t_done_ns=k * 10**6 + 900_000))
    return pd.DataFrame(rows)


def test_ring_figures() -> None:
    fig = message_figure(messages())
    arrows = [t for t in fig.data if isinstance(t, go.Scatter)]
    assert len(arrows) == 2 and sum(np.isnan(np.asarray(a.x, float)).sum() for a in arrows) == 4
    wt = pd.DataFrame(dict(job_id="ring-ws2", algo="ring", call=0, phase=["reduce_scatter", "all_gather"],
                           ring_step=0, rank=0, transfer_ms=[.4, .4], wait_ms=[.5, .1]))
    # ring steps count from 1, as in the ring picture and the chunk slider beside it
    assert [str(x) for x in wait_transfer_figure(wt).data[0].x] == ["RS 1", "AG 1"]
    cells = pd.DataFrame(dict(frame=["start"] * 4 + ["RS 0"] * 4, rank=[0, 0, 1, 1] * 2, chunk=[0, 1] * 4,
                              count=[1, 1, 1, 1, 1, 2, 2, 1], text=["x"] * 8))
    fig = chunk_figure(cells, 2)
    assert len(fig.frames) == 2 and len(fig.layout.sliders[0].steps) == 2
    counts = pd.DataFrame(dict(job_id=["a", "b"], algo=["ring", "naive"], messages=[4, 2], bytes=[200, 400]))
    assert list(message_count_figure(counts).data[0].y) == [2, 4]


@pytest.mark.parametrize("bad", [pd.DataFrame(dict(rank=[0], lane=["compute"], name=["x"], start_ms=[np.nan],
                                                   end_ms=[1.0]))])
def test_timeline_ignores_broken_rows(bad: pd.DataFrame) -> None:
    assert isinstance(timeline_figure(bad), go.Figure)


def test_timeline_colours_each_collective_family() -> None:
    from dpcore.read.plots.style import OP_COLORS

    # the family comes from the analysis's `op` column, never from the name: the last comm bar is
    # named like an all-reduce but its row says broadcast, and the plot must believe the row
    df = pd.DataFrame(dict(rank=[0] * 6, lane=["compute", "comm", "comm", "comm", "comm", "comm"],
                           name=["forward", "fsdp_all_gather", "gloo:allgather", "reduce_scatter #2", "all_reduce #3",
                                 "all_reduce #4"],
                           op=["", "all_gather", "all_gather", "reduce_scatter", "all_reduce", "broadcast"],
                           start_ms=[0, 1, 1.01, 5, 6, 8], end_ms=[10, 1.01, 2, 6, 7, 9]))
    fig = timeline_figure(df, max_bars_per_lane=1)  # force merging: families must stay apart
    bars = {t.name: t for t in fig.data}
    assert set(bars) == {"compute", "all-gather", "reduce-scatter", "all-reduce", "broadcast"}
    assert bars["all-gather"].marker.color == OP_COLORS["all_gather"] != bars["all-reduce"].marker.color
    assert len(bars["all-gather"].x) == 1 and len(bars["reduce-scatter"].x) == 1  # the two all-gathers merged
    assert list(bars["broadcast"].customdata[:, 0]) == ["all_reduce #4"]
    # rows without a family (no `op` column, or one the plot has no colour for) draw as "other comm"
    bare = timeline_figure(df.drop(columns="op"))
    assert {t.name for t in bare.data} == {"compute", "other comm"}
    odd = timeline_figure(df.assign(op=["", "all_gather", "mystery", "mystery", "mystery", "mystery"]))
    assert {t.name: len(t.x) for t in odd.data} == {"compute": 1, "all-gather": 1, "other comm": 4}


def test_plots_never_import_the_analysis() -> None:
    """The plot layer draws what it is given: it imports the contract and other plots only."""
    import ast
    from pathlib import Path

    plots = Path(__file__).resolve().parents[3] / "dpcore" / "read" / "plots"
    bad = []
    for f in sorted(plots.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{f.name}: {m}" for m in mods
                    if m.startswith("dpcore") and not m.startswith(("dpcore.contract", "dpcore.read.plots"))]
    assert not bad, bad
