"""The first-chart benchmark's main-thread profile (``--profile-main-thread``) on a small
synthetic Chromium trace whose answer is known: self times by kind add up to the tasks' CPU,
JavaScript is split by the profiler's samples, style and layout forced by script are named, and
only the window from the document's commit to the chart's mark counts."""
from __future__ import annotations

import pytest

from benchmarks.bench_dashboard_first_chart import CHART_MARK_NAME, OTHER, main_thread_profile

PID, TID = 7, 1


def _x(name: str, ts: float, dur: float, tdur: float | None = None, **args) -> dict:
    return {"name": name, "ph": "X", "pid": PID, "tid": TID, "ts": ts, "dur": dur,
            "tdur": dur if tdur is None else tdur, "args": args}


def _trace(mark_at: float = 10_000) -> list[dict]:
    """Times in µs. Before the commit: a 500 µs task (not counted). From the commit at 1,000:
    a task of 2,000 µs wall / 1,800 µs CPU with HTML parsing (200) and a script run (1,000) that
    forces a layout (300) and a style recalculation of 40 elements (100); a 1,000 µs paint task;
    a task at the mark that draws the chart (1,500 of JS); a task after the mark (not counted)."""
    return [
        {"name": "thread_name", "ph": "M", "pid": PID, "tid": TID, "args": {"name": "CrRendererMain"}},
        _x("RunTask", 0, 500),
        _x("CommitLoad", 1_000, 10),
        _x("RunTask", 1_000, 2_000, 1_800),
        _x("ParseHTML", 1_100, 200),
        _x("FunctionCall", 1_400, 1_000, url="http://x/static/js/index.AbC.js"),
        _x("Layout", 1_500, 300, beginData={"totalObjects": 77}),
        _x("UpdateLayoutTree", 1_900, 100, elementCount=40),
        _x("RunTask", 4_000, 1_000),
        _x("Paint", 4_100, 800),
        _x("RunTask", mark_at - 100, 1_600),
        _x("FunctionCall", mark_at - 50, 1_500),
        {"name": "TimeStamp", "ph": "I", "pid": PID, "tid": TID, "ts": mark_at,
         "args": {"data": {"message": CHART_MARK_NAME}}},
        _x("RunTask", mark_at + 5_000, 9_000),
        {"name": "ResourceSendRequest", "ph": "I", "pid": PID, "tid": TID, "ts": 1_200,
         "args": {"data": {"url": "http://x/static/media/SourceSans.woff2"}}},
        # the profiler: 3 samples in index (600 µs), 1 in PlotlyChart (200 µs), 1 native (program)
        {"name": "Profile", "ph": "P", "pid": PID, "tid": TID, "id": "0x1", "args": {"data": {"startTime": 1_000}}},
        {"name": "ProfileChunk", "ph": "P", "pid": PID, "tid": 99, "id": "0x1", "args": {"data": {
            "cpuProfile": {"nodes": [
                {"id": 1, "callFrame": {"functionName": "(root)"}},
                {"id": 2, "callFrame": {"functionName": "render", "url": "http://x/static/js/index.AbC.js"}},
                {"id": 3, "callFrame": {"functionName": "draw", "url": "http://x/static/js/PlotlyChart.Z9.js"}},
                {"id": 4, "callFrame": {"functionName": "(program)"}}],
                "samples": [2, 2, 2, 3, 4]},
            "timeDeltas": [200, 200, 200, 200, 200]}}},
    ]


def test_rows_add_up_by_kind_within_the_window():
    got = main_thread_profile(_trace())
    # tasks from the commit: 1,800 + 1,000 + 1,600 CPU µs; the one before it and the one after the mark left out
    assert got["main thread CPU"] == pytest.approx(4.4)
    assert got["parse HTML"] == pytest.approx(0.2)
    assert got["layout"] == pytest.approx(0.3)
    assert got["style"] == pytest.approx(0.1)
    assert got["paint, composite"] == pytest.approx(0.8)
    # the script's own time (1,000 less its 400 of layout and style) plus the drawing task's JS
    assert got["run JS"] == pytest.approx(0.6 + 1.5)
    # the first task's self time less its children (1,800 - 200 - 1,000), the paint task's 200, the last's 100
    assert got[OTHER] == pytest.approx(0.6 + 0.2 + 0.1)
    kinds = ["compile JS", "run JS", "style", "layout", "paint, composite", "parse HTML", "garbage collection", OTHER]
    assert sum(got[k] for k in kinds) == pytest.approx(got["main thread CPU"])
    assert got["style + layout forced by JS"] == pytest.approx(0.4)
    assert got["style: elements recalculated"] == 40
    assert got["layout: most layout objects"] == 77
    assert got["web fonts asked for"] == 1


def test_javascript_split_by_sampled_script():
    got = main_thread_profile(_trace())
    # 3 of the 4 JS samples in index, 1 in PlotlyChart; the native sample is not JavaScript
    assert got["  JS in index"] == pytest.approx(2.1 * 3 / 4)
    assert got["  JS in PlotlyChart"] == pytest.approx(2.1 / 4)
    assert not any("program" in k for k in got)


def test_no_mark_no_profile():
    events = [e for e in _trace() if e["name"] != "TimeStamp"]
    assert main_thread_profile(events) == {}
    assert main_thread_profile({"traceEvents": _trace(mark_at=500)}) == {}  # the mark before the commit
