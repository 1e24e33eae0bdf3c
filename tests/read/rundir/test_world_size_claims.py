"""A run.json world size that is no number of ranks (10**15, 0, 2.5, text) is ignored with one
warning naming the job, and changes no number: 10**15 once doubled ring-ws2's bus bytes in
``summarize`` with exit 0 and no word."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from dpcore.contract import runformat as rf
from dpcore.read.ranks import Scale
from dpcore.read.report.summarize import summarize
from dpcore.read.rundir import load_run
from tests.fixtures_run import make_run


def _claim(run: Path, job: str, value: object) -> None:
    meta = json.loads((run / rf.RUN_JSON).read_text())
    for j in meta["jobs"]:
        if j["id"] == job:
            j["world_size"] = value
    (run / rf.RUN_JSON).write_text(json.dumps(meta))


@pytest.mark.parametrize("value", [10**15, 0, -2, 2.5, "two", True])
def test_an_impossible_world_size_is_ignored_and_named(tmp_path: Path, value: object) -> None:
    run = make_run(tmp_path / "profiles")
    truth = pd.read_csv(io.StringIO(summarize(str(run), csv=True, scale=Scale(workers=1))))
    _claim(run, "ring-ws2", value)
    loaded = load_run(run)
    assert loaded.jobs.set_index("job_id").loc["ring-ws2", "world_size"] is None
    assert [w for w in loaded.warnings if "world size" in w] == [
        f"{run / rf.RUN_JSON}: job ring-ws2: world size {value} is not a whole number of ranks "
        "1 .. 1048576; ignored (unknown), no number uses it"]
    got = pd.read_csv(io.StringIO(summarize(str(run), csv=True, scale=Scale(workers=1))))
    assert got.set_index("job_id")["world_size"].isna().tolist() == (truth["job_id"] == "ring-ws2").tolist()
    pd.testing.assert_frame_equal(got.drop(columns="world_size"), truth.drop(columns="world_size"))


def test_a_plausible_world_size_is_kept(tmp_path: Path) -> None:
    run = make_run(tmp_path / "profiles")
    loaded = load_run(run)
    assert loaded.jobs.set_index("job_id").loc["ring-ws4", "world_size"] == 4
    assert not [w for w in loaded.warnings if "world size" in w]
