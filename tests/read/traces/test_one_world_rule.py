"""Every reader of rank traces refuses the same things by one rule
(:func:`dpcore.read.traces.world.check_one_world`): the events reader, ``import`` and
``analyze`` agree on two traces of one rank and on a world size that is no world size."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpcore.cli import main
from dpcore.read.traces import TraceFormatError
from tests.synthetic import gpu_trace
from tests.trace_helpers import read_trace_files


def _write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_the_events_reader_refuses_two_traces_of_one_rank_by_the_shared_rule(tmp_path: Path) -> None:
    a = _write(tmp_path / "a" / "rank0.json", gpu_trace(0, 2, steps=2, kernels_per_step=5))
    b = _write(tmp_path / "b" / "rank0.json", gpu_trace(0, 2, steps=2, kernels_per_step=5))
    with pytest.raises(TraceFormatError) as got:
        read_trace_files([a, b])
    assert str(got.value) == (f"two traces for rank 0: {a} and {b} (several jobs or profiling cycles "
                              "in one folder? point at one of them)")


def test_the_events_reader_refuses_a_rank_beyond_any_world(tmp_path: Path) -> None:
    doc = gpu_trace(0, 2, steps=2, kernels_per_step=5)
    doc["distributedInfo"]["rank"] = 2**20
    f = _write(tmp_path / "rank0.json", doc)
    with pytest.raises(TraceFormatError, match=r"rank 1048576 cannot be a rank of a job; valid ranks: 0\.\.1048575"):
        read_trace_files([f, _write(tmp_path / "rank1.json", gpu_trace(1, 2, steps=2, kernels_per_step=5))])


def test_import_and_analyze_read_a_world_size_of_zero_alike(tmp_path: Path, capsys) -> None:
    # world_size 0 names no world: both take the ranks as they are (the rank bound is MAX_RANK)
    for r in range(2):
        doc = gpu_trace(r, 2, steps=2, kernels_per_step=5)
        doc["distributedInfo"]["world_size"] = 0
        _write(tmp_path / "in" / f"rank{r}.json", doc)
    assert main(["analyze", str(tmp_path / "in")]) == 0
    assert main(["import", str(tmp_path / "in"), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    run = next((tmp_path / "out").iterdir())
    assert json.loads((run / "run.json").read_text())["jobs"][0]["world_size"] == 2
