"""The views on a 256-rank run (issue 23): every page draws without an exception, and no view
draws more than MAX_RANK_LANES rank lanes; the Timeline defaults to rank 0, the slowest and the
most-often-last rank, and its picker draws any other."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dpcore.read.analysis.rank_pick import MAX_RANK_LANES, default_ranks, rank_step_matrix
from dpcore.read.dashboard.pages import PAGES
from dpcore.read.importer.write_run import import_traces
from tests.app_pages import APP, heading, open_page, problems
from tests.synthetic import write_gpu_trace_dir


def test_default_ranks_known_answer() -> None:
    steps = pd.DataFrame({"rank": [0, 1, 2, 3] * 3 + list(range(4, 20)),
                          "step_ms": [1, 1, 1, 9] * 3 + [1] * 16})
    last = pd.DataFrame({"rank": [0, 1, 7, 12], "last_arrival_pct": [10.0, 20.0, 80.0, 80.0]})
    assert default_ranks(list(range(20)), steps, last) == [0, 3, 7]
    assert default_ranks(list(range(5)), steps, last) == [0, 1, 2, 3, 4]  # few ranks: all of them
    assert default_ranks(list(range(1, 20)), None, None) == [1]
    m = rank_step_matrix(pd.DataFrame({"rank": [1, 0, 1, 0], "step": [0, 0, 1, 1], "step_ms": [2.0, 1.0, 4.0, 3.0]}))
    assert m.index.tolist() == [0, 1] and m.columns.tolist() == [0, 1] and m.to_numpy().tolist() == [[1, 3], [2, 4]]


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many")
    write_gpu_trace_dir(root / "src" / "job256", world_size=256, steps=3, kernels_per_step=6, seed=2)
    import_traces(root / "src" / "job256", root / "profiles", "many")
    return root / "profiles"


def _lane_ranks(at: AppTest) -> set[int]:
    """The ranks the Timeline's figure draws lanes for (its y-axis categories name them)."""
    fig = at.get("plotly_chart")[0].proto.spec
    return {int(t) for t in __import__("re").findall(r"rank (\d+)", fig)}


def test_every_page_draws_on_a_256_rank_run(many: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPCORE_PROFILES", str(many))
    at = AppTest.from_file(APP, default_timeout=300).run()
    for page in PAGES:
        open_page(at, page.title)
        assert not problems(at), (page.title, problems(at))
        assert heading(at) == page.title
    open_page(at, "Timeline")
    picker = at.multiselect(key=next(k for k in (w.key for w in at.multiselect) if k.startswith("tl-ranks-")))
    assert picker.value[0] == 0 and 1 <= len(picker.value) <= 3
    drawn = _lane_ranks(at)
    assert drawn == set(picker.value) and len(drawn) <= MAX_RANK_LANES
    picker.set_value([0, 200]).run()
    assert not problems(at) and _lane_ranks(at) == {0, 200}
    assert len(at.get("plotly_chart")) == 2  # the lanes and the rank x step heat strip of all ranks
