"""``analyze`` and ``stragglers`` on a folder of traces refuse, by file, what cannot be one job's
ranks, by the rule ``import`` uses (:func:`dpcore.read.traces.world.check_one_world`): a rank of
10**12, ranks of different world sizes, two traces of one rank. Exit 2, one line, nothing
averaged."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpcore.cli import main
from tests.synthetic import gpu_trace


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _huge_rank(d: Path) -> str:
    doc = gpu_trace(0, 2, steps=2, kernels_per_step=5)
    doc["distributedInfo"]["rank"] = 10**12
    del doc["distributedInfo"]["world_size"]
    _write(d / "rank0.json", doc)
    return "rank 1000000000000 cannot be a rank of a job; valid ranks: 0..1048575"


def _two_worlds(d: Path) -> str:
    _write(d / "rank0.json", gpu_trace(0, 2, steps=2, kernels_per_step=5))
    _write(d / "rank1.json", gpu_trace(1, 4, steps=2, kernels_per_step=5))
    return "traces of different world sizes"


def _beyond_world(d: Path) -> str:
    doc = gpu_trace(0, 2, steps=2, kernels_per_step=5)
    doc["distributedInfo"]["rank"] = 7
    _write(d / "rank0.json", doc)
    return "rank 7 cannot be a rank of its world of 2; valid ranks: 0..1"


@pytest.mark.parametrize("command", ["analyze", "stragglers"])
@pytest.mark.parametrize("make", [_huge_rank, _two_worlds, _beyond_world])
def test_traces_that_are_not_one_job_are_refused(command, make, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DPCORE_CACHE_DIR", str(tmp_path / "cache"))
    needle = make(tmp_path / "in")
    rc = main([command, str(tmp_path / "in"), "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err, err
