"""An imported rank of a larger job keeps the job's world size: the traces' own
``distributedInfo.world_size`` (one rank of an 8-GPU job is a rank of a world of 8), not the
number of ranks imported. At world size 1 its collectives would read as having no peer (comm 0)
and every world-size comparison would place the job at 1."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dpcore.read.importer.write_run import import_traces, job_world_size
from dpcore.read.report.summarize import summary_table
from dpcore.read.rundir.load import load_run
from tests.synthetic import gpu_trace

MI300 = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "tracelens_mi300_resnet_ddp_1r"


def test_one_rank_of_eight_is_imported_at_world_size_8(tmp_path: Path) -> None:
    src = tmp_path / "src" / "rank0.json"
    src.parent.mkdir()
    src.write_text(json.dumps(gpu_trace(0, 8, steps=3, kernels_per_step=20)))
    res = import_traces(src.parent, tmp_path / "out")
    assert res.job_id == "imported-ws8" and res.ranks == [0]
    meta = json.loads((res.run_dir / "run.json").read_text())
    job = meta["jobs"][0]
    assert job["world_size"] == 8 and job["ranks"] == [0] and meta["environment"]["trace_world_size"] == 8
    assert any(n.startswith("1 of the job's 8 ranks is here") for n in job["notes"])
    steps = pd.read_csv(res.run_dir / "steps.csv")
    assert set(steps["world_size"]) == {8}
    s = summary_table(load_run(res.run_dir)).iloc[0]
    assert s["world_size"] == 8 and s["comm_ms"] > 0  # its collectives have peers


def test_the_world_size_rule() -> None:
    assert job_world_size({"trace_world_size": 8}, [0]) == 8
    assert job_world_size({}, [0, 1]) == 2  # the traces say nothing: the ranks imported
    assert job_world_size({"trace_world_size": 1}, [0, 1]) == 2  # never fewer than the ranks present
    assert job_world_size({"trace_world_size": True}, [0]) == 1  # not a number


def test_the_mi300_rank_is_of_a_world_of_8(tmp_path: Path) -> None:
    if not MI300.is_dir():
        pytest.skip(f"{MI300} is absent (a fresh clone): the foreign MI300 trace is checked where it exists")
    res = import_traces(MI300, tmp_path / "out")
    assert res.job_id == "imported-ws8"
    s = summary_table(load_run(res.run_dir)).iloc[0]
    assert s["world_size"] == 8 and s["comm_ms"] > 0 and s["comm_source"] == "trace"
