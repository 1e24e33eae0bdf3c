"""What an import records of where its traces ran, from the traces themselves and never guessed:
the backend (distributedInfo's, else what the comm events are, else none), whether two ranks
shared one GPU (then the job is no scaling point), the precision the compute ran in (a
``trace_handler`` run recorded none), and a word on a trace with no metadata at all (a JSON
array of events)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dpcore.read.importer.rows import trace_dtype
from dpcore.read.importer.write_run import import_traces, index_run
from dpcore.read.report.summarize import summarize
from dpcore.read.traces.files import trace_files
from tests.synthetic import gpu_trace
from tests.trace_helpers import read_trace_files

SHARED = Path(__file__).resolve().parents[3].parent / "shared"
GLOO_CUDA = SHARED / "gpu" / "traces" / "h200_ddp_gloo_cuda_2r"
TH_GPU = SHARED / "gpu" / "runs" / "h200_th-gpu"


def _meta(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def test_backend_from_the_comm_events_when_distributed_info_says_none(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for r in (0, 1):
        doc = gpu_trace(r, 2, steps=2, kernels_per_step=10)
        del doc["distributedInfo"]["backend"]
        (src / f"rank{r}.json").write_text(json.dumps(doc))
    meta = _meta(import_traces(src, tmp_path / "out").run_dir)
    assert meta["environment"]["backend"] == "nccl" and meta["environment"]["backend_from"] == "comm events"
    job = meta["jobs"][0]
    assert (job["backend"], job["device"]) == ("nccl", "cuda")
    assert job["gpus_shared"] is False  # synthetic ranks: one GPU each (pid 1000 + rank)


def test_a_cpu_trace_without_comm_has_no_backend(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": 1000.0 + 50 * k + i, "dur": 10.0}
              for k in range(3) for i, n in enumerate((f"ProfilerStep#{k}", "aten::mm"))]
    (src / "trace.json").write_text(json.dumps(events))  # a JSON array: no metadata at all
    res = import_traces(src, tmp_path / "out")
    meta = _meta(res.run_dir)
    assert meta["environment"]["backend"] == "none" and meta["jobs"][0]["backend"] == "none"
    assert meta["environment"]["backend_from"] == "none: no distributedInfo and no comm events"
    assert any(n.startswith("trace.json: no metadata in the trace (a JSON array of events") for n in res.notes)
    assert "dtype" not in meta["config"]  # a CPU trace without shapes: unknown, not guessed


def test_gloo_over_one_gpu_is_shared_and_fp32(tmp_path: Path) -> None:
    if not GLOO_CUDA.is_dir():
        pytest.skip(f"{GLOO_CUDA} is absent (a fresh clone): the shared GPU traces are checked where they exist")
    run = import_traces(GLOO_CUDA, tmp_path / "out").run_dir
    meta = _meta(run)
    job = meta["jobs"][0]
    assert meta["environment"]["backend"] == "gloo" and meta["environment"]["backend_from"] == "distributedInfo"
    assert job["gpus_shared"] is True and job["world_size"] == 2
    assert meta["config"]["dtype"] == "fp32" and meta["config"]["dtype_from"] == "the traces' matrix products' inputs"
    assert "note: ranks shared a GPU in imported-ws2:" in summarize(str(run))


def test_a_trace_handler_run_records_its_precision(tmp_path: Path) -> None:
    if not TH_GPU.is_dir():
        pytest.skip(f"{TH_GPU} is absent (a fresh clone): the shared GPU runs are checked where they exist")
    run = tmp_path / "run"
    shutil.copytree(TH_GPU / "traces", run / "traces")
    index_run(run, config={"source": "dpcore.trace_handler"})
    cfg = _meta(run)["config"]
    assert (cfg["dtype"], cfg["dtype_from"]) == ("bf16", "the traces' kernel names")  # bf16 autocast, no shapes
    assert trace_dtype(read_trace_files(trace_files(run / "traces"))) == ("bf16", "kernel names")


def test_the_precision_does_not_replace_the_clock_alignment(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "rank0.json").write_text(json.dumps(gpu_trace(0, 1, steps=2, kernels_per_step=10)))
    meta = _meta(import_traces(src, tmp_path / "out").run_dir)
    assert meta["jobs"][0]["clock_alignment"].startswith("trace clocks used as they are")
    assert meta["config"]["dtype"] == "fp32"
