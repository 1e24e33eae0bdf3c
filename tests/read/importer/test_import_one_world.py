"""``import`` works out its environment and world size once (the job's name and its run.json
from one computation), and the device id it records for each trace is the GPU time ledger's
device (gpu_time.device_pid), not a second rule."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpcore.read.analysis.gpu_time import gpu_ledger
from dpcore.read.importer import write_run
from dpcore.read.importer.rows import rank_rows
from dpcore.read.traces.reader import read_trace
from tests.synthetic import gpu_trace


def test_import_computes_the_environment_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "rank0.json").write_text(json.dumps(gpu_trace(0, 8, steps=2, kernels_per_step=10)))
    calls: list[int] = []
    real = write_run._environment

    def counted(traces):
        calls.append(len(traces))
        return real(traces)

    monkeypatch.setattr(write_run, "_environment", counted)
    res = write_run.import_traces(src, tmp_path / "out")
    assert calls == [1]
    meta = json.loads((res.run_dir / "run.json").read_text())
    assert res.job_id == meta["jobs"][0]["id"] == "imported-ws8" and meta["jobs"][0]["world_size"] == 8


def _two_devices(tmp_path: Path) -> Path:
    """A trace whose kernels ran on device 0, with more ``gpu_user_annotation`` ranges (on a
    stream too) on device 1: device 0 is the GPU that computed."""
    trace = gpu_trace(0, 1, steps=2, kernels_per_step=10)
    kernels = sum(e.get("cat") in ("kernel", "gpu_memcpy") for e in trace["traceEvents"])
    for i in range(kernels + 5):
        trace["traceEvents"].append({"ph": "X", "cat": "gpu_user_annotation", "name": f"range{i}", "pid": 1,
                                     "tid": 9, "ts": 1_000_000.0 + i, "dur": 1.0,
                                     "args": {"device": 1, "stream": 9}})
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(trace))
    return p


def test_the_imported_device_is_the_ledgers(tmp_path: Path) -> None:
    events = read_trace(_two_devices(tmp_path))
    ledger, _ = gpu_ledger(events, per_step=False)
    g = events[events["category"].isin(("kernel", "gpu_memcpy", "gpu_memset")).to_numpy()
               & (events["pid"].astype(str) == "0").to_numpy()]
    assert ledger.loc[0, "span_ms"] * 1e3 == pytest.approx(float((g["ts"] + g["dur"]).max() - g["ts"].min()))
    facts = rank_rows(events, {})["import_facts"].iloc[0]
    assert int(facts["gpu_device"]) == 0  # (a second rule counted the annotations: device 1)


def test_one_rule_names_the_device(tmp_path: Path) -> None:
    from dpcore.read.analysis.gpu_time import device_events, device_pid

    events = read_trace(_two_devices(tmp_path))
    assert device_pid(events) == "0"
    assert set(events.loc[device_events(events), "pid"].astype(str)) == {"0"}
    assert device_pid(events.iloc[0:0]) == ""
