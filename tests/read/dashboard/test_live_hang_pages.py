"""The Live and Hang pages in AppTest on known data: the strip and the per-rank numbers of
live.csv (a persistent straggler flagged, a one-off stall not), a half-written last line never
shown, the refresh while running, and a hung job's verdict and stacks."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dpcore.contract import runformat as rf
from dpcore.read.analysis.live import job_rows, slowest_counts
from dpcore.read.rundir.live import read_live
from tests.app_pages import open_page, problems
from tests.contract.test_flightrec import _entry, _steps
from tests.fixtures_run import make_run
from tests.read.dashboard.test_app import start

STACK = ('Current thread 0x2 (most recent call first):\n'
         '  File "/w/dpcore/inject.py", line 49 in injected\n  File "/w/main.py", line 3 in <module>\n')


def _live_rows(job: str = "flat-ws2", steps: int = 20, slow_rank: int = 1) -> str:
    """Rank ``slow_rank`` has 5 ms more work every step; rank 0 has one 50 ms stall at step 3."""
    lines = []
    for s in range(steps):
        for r in range(2):
            busy = 10.0 + (5.0 if r == slow_rank else 0.0) + (50.0 if (r, s) == (0, 3) else 0.0)
            step_ms = 70.0 if s == 3 else 20.0
            lines.append(f"{job},{r},{s},False,{1000 + s},{1700000000 + s / 10},{step_ms},"
                         f"{step_ms - busy},\n")
    return ",".join(rf.LIVE_COLUMNS) + "\n" + "".join(lines)


def test_slowest_rank_counts_flag_the_persistent_straggler_not_the_stall(tmp_path):
    (tmp_path / rf.LIVE_FILE).write_text(_live_rows() + "flat-ws2,0,20,False,12")  # half a row
    live = read_live(tmp_path)
    assert len(live) == 40 and live["step"].max() == 19  # the half row is not read
    slow = slowest_counts(job_rows(live, "flat-ws2")).set_index("rank")
    assert slow.loc[1, "slowest"] == 19 and slow.loc[0, "slowest"] == 1  # the stall: once
    assert bool(slow.loc[1, "persistent"]) and not bool(slow.loc[0, "persistent"])


def add_live_and_hang(run: Path) -> None:
    """Give a synthetic run a live.csv and a hung job's hang/ folder (known answers)."""
    (run / rf.LIVE_FILE).write_text(_live_rows())
    hang = rf.hang_dir(run, "flat-ws2")
    hang.mkdir(parents=True)
    base = _steps(3) + [_entry(7, "barrier", 0)]
    (hang / "rank0.fr.json").write_text(json.dumps({"entries": base + [_entry(8, "all_reduce", 1000, False)]}))
    (hang / "rank1.fr.json").write_text(json.dumps({"entries": base}))
    (hang / "rank0.stack.txt").write_text(STACK.replace("inject.py\", line 49 in injected",
                                                        "distributed_c10d.py\", line 3252 in all_reduce"))
    (hang / "rank1.stack.txt").write_text(STACK)


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    add_live_and_hang(make_run(tmp_path, "20250101-120000-mlp"))
    return tmp_path


def test_live_page_draws_the_strip_and_flags_the_straggler(root, monkeypatch):
    at = open_page(start(root, monkeypatch), "Live")
    assert not problems(at), problems(at)
    assert at.get("plotly_chart")
    stats = at.dataframe[0].value
    assert stats["rank"].tolist() == [0, 1] and stats["step_ms_p50"].tolist() == [20.0, 20.0]
    assert any("rank 1 is a persistent straggler" in w.value for w in at.warning)
    assert not any("rank 0 is a persistent" in w.value for w in at.warning)


def test_live_page_refreshes_while_running(root, monkeypatch):
    run = root / "20250101-120000-mlp"
    meta = json.loads((run / rf.RUN_JSON).read_text())
    meta.update(status="running", pid=__import__("os").getpid(), host=__import__("socket").gethostname())
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    at = open_page(start(root, monkeypatch), "Live")
    assert not problems(at), problems(at)
    assert "running" in " ".join(m.value for m in at.markdown) and "s ago" in " ".join(m.value for m in at.markdown)
    with open(run / rf.LIVE_FILE, "a") as f:  # a new step arrives
        f.write("flat-ws2,0,20,False,2000,1700000002.0,21.0,5.0,\nflat-ws2,1,20,False,2000,1700000002.0,21.0,5.0,\n")
    at.run()
    assert "21 step(s) seen" in " ".join(m.value for m in at.markdown)


def test_hang_page_draws_the_verdict_and_stacks(root, monkeypatch):
    at = open_page(start(root, monkeypatch), "Hang")
    assert not problems(at), problems(at)
    assert at.get("plotly_chart")
    assert at.warning and "rank 1 never entered collective seq 8" in at.warning[0].value
    table = at.dataframe[0].value
    assert isinstance(table, pd.DataFrame) and table["last_enqueued_seq"].tolist() == [8, 7]
    assert table["stack_top"].tolist()[1] == "inject.py:49 in injected"
    assert any("(lagging)" in e.label for e in at.expander)


def test_live_page_links_a_hung_job_to_the_hang_page(root, monkeypatch):
    at = open_page(start(root, monkeypatch), "Live")
    assert not problems(at), problems(at)
    assert any("flat-ws2 hung" in w.value and "Hang page" in w.value for w in at.warning)


def test_a_crafted_hang_folder_name_is_text_in_the_live_pages_link(root, monkeypatch):
    """A hang/ folder's name is the run's text, not Markdown: in the warning and in the
    link's label (Streamlit renders a page link's label as Markdown)."""
    import streamlit

    hang = root / "20250101-120000-mlp" / rf.HANG_DIR
    crafted = "[x](https:evil.test) **b**"
    (hang / "flat-ws2").rename(hang / crafted)
    labels: list[str] = []
    monkeypatch.setattr(streamlit, "page_link", lambda page, label="", **kw: labels.append(label))
    at = open_page(start(root, monkeypatch), "Live")
    assert not problems(at), problems(at)
    assert r"Open Hang (\[x\]\(https\:evil.test\) \*\*b\*\*)" in labels, labels
    assert any(r"\[x\]\(https\:evil.test\) \*\*b\*\* hung" in w.value for w in at.warning)


def test_live_page_names_no_slowest_rank_at_world_size_one(root, monkeypatch):
    run = root / "20250101-120000-mlp"
    lines = _live_rows("single-ws1").splitlines(keepends=True)
    (run / rf.LIVE_FILE).write_text(lines[0] + "".join(li for li in lines[1:] if li.split(",")[1] == "0"))
    at = open_page(start(root, monkeypatch), "Live")
    assert not problems(at), problems(at)
    assert len(at.dataframe) == 1  # the per-rank numbers, no "slowest in 20 of 20" table
    assert any("One rank: no other rank to wait for" in c.value for c in at.caption)
    assert not any("persistent straggler" in w.value for w in at.warning)


def test_live_page_without_live_rows_says_why_in_words(root, monkeypatch):
    (root / "20250101-120000-mlp" / rf.LIVE_FILE).unlink()
    at = open_page(start(root, monkeypatch), "Live")
    assert not problems(at), problems(at)
    text = " ".join(i.value for i in at.info)
    assert "No live rows in this run" in text and "0.x" not in text


def test_heat_strip_ticks_whole_ranks_and_gives_the_colour_bar_room():
    from dpcore.read.plots.heat import MIN_PLOT_PX, rank_step_heat_figure

    two = rank_step_heat_figure(pd.DataFrame([[1.0, 2.0], [3.0, 4.0]], index=[0, 1], columns=[0, 1]))
    assert list(two.layout.yaxis.tickvals) == [0, 1] and list(two.layout.yaxis.ticktext) == ["0", "1"]
    m = two.layout.margin
    assert two.layout.height - m.t - m.b >= MIN_PLOT_PX
    assert two.data[0].colorbar.title.side == "right"
    many = rank_step_heat_figure(pd.DataFrame(1.0, index=range(64), columns=range(3)))
    assert many.layout.yaxis.tickformat == "d" and many.layout.yaxis.tickvals is None
