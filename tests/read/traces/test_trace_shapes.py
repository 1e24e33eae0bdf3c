"""Foreign trace shapes that dpcore once misread (issue 19), each with known answers.

The traces are small files of our own (``tests/data/shape_*.json.gz``, written by
``tests/data/make_shapes.py``, whose docstrings work the answers out by hand); each
reproduces a shape of a real trace in ``../shared/traces/`` (see test_real_traces.py).
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.read.importer.write_run import import_traces
from dpcore.read.report.analyze import analyze
from dpcore.read.report.importer import import_text
from dpcore.read.report.summarize import summarize
from dpcore.read.rundir import load_run
from dpcore.read.traces.reader import read_trace, step_ranges, trace_notes
from tests.data import make_shapes
from tests.trace_helpers import read_trace_dir

pytestmark = pytest.mark.usefixtures("scan_path")  # each test: a cache of its own

DATA = Path(__file__).resolve().parents[2] / "data"


def _csv(text: str) -> pd.DataFrame:
    from io import StringIO
    return pd.read_csv(StringIO(text))


def near(v: float):
    """A value printed with 4 decimals (the CSV of analyze/summarize)."""
    return pytest.approx(v, abs=1e-3)


def _import(path: Path, tmp_path: Path):
    got = import_traces(path, tmp_path / "profiles", "shape")
    return got, load_run(got.run_dir)


def test_the_committed_files_are_what_the_script_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(make_shapes, "DATA", tmp_path)
    make_shapes.main()
    for name in make_shapes.SHAPES:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_a_foreign_forward_op_is_not_a_phase(tmp_path):
    """A TorchScript ``forward`` cpu_op is an op: compute is every main-thread op of the step."""
    f = DATA / "shape_foreign_forward.json.gz"
    ev = read_trace(f)
    assert set(ev.loc[ev["name"] == "forward", "kind"]) == {"compute"}
    assert set(ev.loc[ev["name"] == "aten::mm", "kind"]) == {"compute"}  # outside the `forward` op
    row = _csv(analyze(str(f), csv=True)).iloc[0]
    assert row["steps"] == 2
    assert row["compute_ms"] == near(0.760)
    assert row["comm_ms"] == near(0.400)
    assert row["overlap_pct"] == near(72.5)
    got, run = _import(f, tmp_path)
    s = run.steps.sort_values("step")
    assert s["step"].tolist() == [1, 2]
    assert s["fwd_ms"].tolist() == pytest.approx([0.3, 0.3])   # `## forward ##`, not the op
    assert s["bwd_ms"].tolist() == pytest.approx([0.5, 0.5])   # `## backward ##`
    assert s["opt_ms"].tolist() == pytest.approx([0.15, 0.15])  # Optimizer.step#SGD.step
    assert got.collectives == 2 and set(run.collectives["op"]) == {"all_reduce"}
    assert run.collectives["bytes"].isna().all()  # a gloo span says no size: unknown, not 0
    assert {"bytes", "comm_bytes"} <= set(got.missing)


def test_dpcore_phases_are_its_own_annotations_only(tmp_path):
    """The same trace with dpcore's own ``forward`` annotation around [0,300]: now compute is
    the ops inside dpcore's phases only (forward; no backward/optimizer annotation here)."""
    doc = make_shapes.foreign_forward()
    for k in range(2):
        t = 1000.0 * (k + 1)
        doc["traceEvents"].append(make_shapes.x("forward", "user_annotation", t, t + 300))
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(doc))
    row = _csv(analyze(str(f), csv=True)).iloc[0]
    assert row["compute_ms"] == near(0.230)  # [10,100] + [150,290]
    assert row["overlap_pct"] == near(0.0)


def test_kernels_launched_before_the_trace_belong_to_no_step(tmp_path):
    f = DATA / "shape_queued_kernels.json.gz"
    ev = read_trace(f)
    queued = ev["name"].astype(str).str.startswith("void queued") | ((ev["stream"] >= 0) & (ev["ts"] < 1100))
    assert queued.sum() == 2 and (ev.loc[queued, "step"] == -1).all()
    kernels = ev[(ev["category"] == "kernel") & ~queued]
    assert kernels.groupby("step").size().to_dict() == {1: 2, 2: 2}  # the launching step
    assert any("2 GPU event(s) (1 of them collectives) were launched before the trace began" in n
               for n in trace_notes(ev))
    row = _csv(analyze(str(f), csv=True)).iloc[0]
    assert row["steps"] == 2 and row["comm_ms"] == near(0.3) and row["compute_ms"] == near(0.3)
    assert row["overlap_pct"] == near(100 / 3)  # 38.1 % when queued kernels count by GPU time
    got, run = _import(f, tmp_path)
    assert got.collectives == 2 and sorted(run.collectives["step"]) == [1, 2]
    assert run.collectives["bytes"].tolist() == [4000, 4000]  # Float x 1000 from record_param_comms
    assert run.steps["comm_ops"].tolist() == [1, 1] and run.steps["comm_bytes"].tolist() == [4000, 4000]
    assert "launched before the trace began" in import_text(got)


def test_legacy_categories_and_no_rank(tmp_path):
    """Categories of kineto before torch 1.10 read as today's; a lone trace without a rank is
    rank 0 of 1, with a note; two such traces in one folder are one clear error."""
    f = DATA / "shape_legacy_norank.pt.trace.json.gz"
    ev = read_trace(f)
    assert set(ev["rank"]) == {0}
    assert set(ev["category"].astype(str)) == {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy"}
    assert set(ev.loc[ev["category"] == "kernel", "kind"]) == {"compute"}
    assert set(ev.loc[ev["category"] == "gpu_memcpy", "kind"]) == {"memcpy"}
    assert (ev.loc[ev["stream"] >= 0, "stream"] == make_shapes.COMPUTE_STREAM).all()
    notes = trace_notes(ev)
    assert any("read as rank 0 of 1" in n for n in notes)
    assert any("legacy categories" in n and "Kernel" in n for n in notes)
    row = _csv(analyze(str(f), csv=True)).iloc[0]
    assert row["rank"] == 0 and row["steps"] == 2 and row["compute_ms"] == near(0.3)
    assert np.isnan(row["overlap_pct"]) and row["comm_ms"] == 0
    got, run = _import(f, tmp_path)
    assert got.ranks == [0] and sorted(run.steps["step"]) == [5, 6]
    two = tmp_path / "two"
    two.mkdir()
    shutil.copy(f, two / "a.pt.trace.json.gz")
    shutil.copy(f, two / "b.pt.trace.json.gz")
    assert main(["analyze", str(two)]) == 2
    assert main(["import", str(two), "--out", str(tmp_path / "p2")]) == 2


def test_the_cli_reads_a_rankless_trace(tmp_path, capsys):
    assert main(["analyze", str(DATA / "shape_legacy_norank.pt.trace.json.gz"), "--csv"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].startswith("0,") and "note:" in err and "rank 0 of 1" in err


def test_no_profiler_steps_is_one_step_for_every_command(tmp_path):
    f = DATA / "shape_no_steps.json.gz"
    ev = read_trace(f)
    assert set(ev.loc[ev["stream"] < 0, "step"]) == {0} and set(ev.loc[ev["stream"] >= 0, "step"]) == {0}
    assert step_ranges(ev)[["rank", "step", "ts", "dur"]].values.tolist() == [[0, 0, 0.0, 1000.0]]
    row = _csv(analyze(str(f), csv=True)).iloc[0]
    assert row["steps"] == 1 and row["overlap_pct"] == near(60.0)
    assert "the whole trace is one step" in analyze(str(f))
    got, run = _import(f, tmp_path)
    # a GPU step is its kernels' window [120, 400] µs, the one analyze measures it in (not the host's 1 ms)
    assert got.steps == 1 and run.steps["step"].tolist() == [0] and run.steps["step_ms"].tolist() == [0.28]
    assert row["step_ms"] == near(0.28)
    assert any("the whole trace is one step" in n for n in got.notes)
    assert any("the whole trace is one step" in n for n in run.meta["jobs"][0]["notes"])
    assert "the whole trace is one step" in summarize(str(got.run_dir))  # said on screen by every command
    s = _csv(summarize(str(got.run_dir), csv=True)).iloc[0]
    assert s["comm_steps"] == 1 and s["overlap_pct"] == near(60.0) and s["step_ms"] == near(0.28)
    c = run.collectives.iloc[0]
    assert (c["op"], c["bytes"], c["step"]) == ("all_gather", 1600, 0)  # BFloat16 x max(100, 800)


def test_collective_metadata_names_and_sizes(tmp_path):
    """RCCL runs every collective as ncclDevKernel_Generic: the op comes from record_param_comms."""
    f = DATA / "shape_coll_meta.json.gz"
    ev = read_trace(f)
    comm = ev[ev["kind"] == "comm"].sort_values("ts")
    assert comm["collective"].astype(str).tolist() == ["broadcast", "allreduce", "all_gather_into_tensor"]
    assert comm["bytes"].tolist()[:2] == [80.0, 2000.0] and np.isnan(comm["bytes"].iloc[2])
    assert ev.loc[ev["kind"] != "comm", "bytes"].isna().all()
    got, run = _import(f, tmp_path)
    c = run.collectives.sort_values("seq")
    assert c["op"].tolist() == ["broadcast", "all_reduce", "all_gather"]
    assert c["bytes"].tolist()[:2] == [80, 2000] and pd.isna(c["bytes"].iloc[2])
    assert pd.isna(run.steps["comm_bytes"].iloc[0])  # one call of unknown size: the sum is unknown
    assert {"bytes", "comm_bytes"} <= set(got.missing)


def test_metadata_keys_take_the_fast_path_and_match_json(tmp_path, monkeypatch):
    """The scanner reads the metadata keys (two share their last 8 bytes: "In/Out msg nelems")
    exactly as json.load gives them, without falling back to the full parse."""
    from dpcore.read.traces import columns as tf
    ref_events = []
    for name in make_shapes.SHAPES:
        ref_events += json.loads(gzip.decompress((DATA / name).read_bytes()))["traceEvents"]
    odd = [{"ph": "X", "name": "record_param_comms", "cat": "cpu_op", "ts": 1, "dur": 1, "pid": 1, "tid": 1,
            "args": {"Out msg nelems": 7, "In msg nelems": 3, "dtype": None, "Collective name": 5,
                     "Group size": "8", "xIn msg nelems": 99, "Collective namex": "no"}},
           {"ph": "X", "name": "k", "cat": "kernel", "ts": 2, "dur": 1, "args": {"In msg nelems": 2 ** 70}}]
    path = tmp_path / "meta.json"
    path.write_text(json.dumps({"traceEvents": ref_events + odd}))
    monkeypatch.setattr(tf, "load_trace", lambda p, **_: pytest.fail("full parse"))
    for window in (64, 1 << 20):
        _, cols = tf.read_columns(path, window=window)
        coll = [cols.tables["coll"][c] for c in cols.codes["coll"]]
        dtype = [cols.tables["dtype"][c] for c in cols.codes["dtype"]]
        xs = [e for e in ref_events + odd if e.get("ph") == "X"]
        assert coll == [str(e.get("args", {})["Collective name"]) if "Collective name" in e.get("args", {})
                        else "" for e in xs]
        assert dtype == [str(e["args"]["dtype"]) if "dtype" in e.get("args", {}) else "" for e in xs]
        assert cols.nums["in_nelems"][-2:].tolist() == [3, -1] and cols.nums["out_nelems"][-2:].tolist() == [7, -1]
        assert cols.nums["group_size"][-2] == 8 and coll[-2] == "5" and dtype[-2] == "None"
        assert cols.nums["in_nelems"].tolist().count(1000) == 2 + 1  # queued_kernels x2, coll_meta x1


def test_a_folder_of_shapes_reads_every_rank(tmp_path):
    """Shapes with a rank read together (two ranks of one folder), notes kept per file."""
    d = tmp_path / "two"
    d.mkdir()
    shutil.copy(DATA / "shape_queued_kernels.json.gz", d / "rank0.json.gz")
    doc = make_shapes.no_steps()
    doc["distributedInfo"]["rank"] = 1
    (d / "rank1.json").write_text(json.dumps(doc))
    ev = read_trace_dir(d)
    assert set(ev["rank"]) == {0, 1}
    notes = trace_notes(ev)
    assert any(n.startswith("rank0.json.gz: 2 GPU event(s)") for n in notes)
    assert any(n.startswith("rank1.json: no ProfilerStep#N markers") for n in notes)
    assert step_ranges(ev)[["rank", "step"]].values.tolist() == [[0, 1], [0, 2], [1, 0]]
