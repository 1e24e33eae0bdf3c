"""An imported GPU step is the window analyze measures it in (its first kernel's start to its last
one's end), so summarize and analyze give one step time and one compute: a steps.csv time of the
CPU's ProfilerStep range made summarize scale the trace's shares to a step they were not measured
in (the one-step H100 trace: step 1,211 against 1,078 ms, compute 619 against 551 ms)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dpcore.read.analysis.comm_overlap import overlap_from_trace
from dpcore.read.importer.write_run import import_traces
from dpcore.read.report.summarize import summary_table
from dpcore.read.rundir.load import load_run
from dpcore.read.traces.files import trace_files
from dpcore.read.traces.reader import step_ranges
from tests.synthetic import gpu_trace
from tests.trace_helpers import read_trace_files

OWL = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "tl_h100_owlv2_1r"


def _late_kernels(rank: int) -> dict:
    """A GPU trace of 2 steps with kernels (and a last one without) whose kernels run 300 µs
    after their launches, past their ProfilerStep ranges: the CPU range and the GPU window differ."""
    doc = gpu_trace(rank, 1, steps=2, kernels_per_step=10)
    for e in doc["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            e["ts"] += 300.0
    return doc


def test_a_gpu_step_is_its_kernels_window(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "rank0.json").write_text(json.dumps(_late_kernels(0)))
    events = read_trace_files(trace_files(src))
    cpu = step_ranges(events).set_index("step")
    trace = overlap_from_trace(events).set_index("step")
    gap = (cpu["dur"] / 1e3 - trace["step_ms"]).abs()
    assert (gap.loc[[0, 1]] > 0.015).all()  # steps with kernels: the two windows really differ
    run = import_traces(src, tmp_path / "out").run_dir
    steps = pd.read_csv(run / "steps.csv").set_index("step")
    assert steps["step_ms"].to_numpy() == pytest.approx(trace.loc[steps.index, "step_ms"].to_numpy(), abs=1e-6)
    s = summary_table(load_run(run)).iloc[0]
    assert s["step_ms"] == pytest.approx(float(trace["step_ms"].median()), abs=1e-6)
    share = trace["compute_ms"].sum() / trace["step_ms"].sum()  # summarize: share of the traced steps x T
    assert s["compute_ms"] == pytest.approx(float(share * trace["step_ms"].median()), rel=1e-9)


def test_the_h100_trace_reads_the_same_in_summarize_and_analyze(tmp_path: Path) -> None:
    if not OWL.is_dir():
        pytest.skip(f"{OWL} is absent (a fresh clone): the foreign H100 trace is checked where it exists")
    run = import_traces(OWL, tmp_path / "out").run_dir
    s = summary_table(load_run(run)).iloc[0]
    assert round(float(s["step_ms"]), 2) == 1078.29 and round(float(s["compute_ms"]), 2) == 551.45
