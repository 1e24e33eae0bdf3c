"""The GPU time ledger (dpcore.read.analysis.gpu_time) on a small trace with every shape, against
the answers worked out by hand in tests/data/make_gpu_shapes.py's docstring."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dpcore.read.analysis.advice import advice
from dpcore.read.analysis.gpu_time import LEDGER_COLUMNS, gpu_ledger
from dpcore.read.traces.reader import read_trace

TRACE = Path(__file__).resolve().parents[2] / "data" / "gpu_ledger_rank0.json.gz"
GLOO_CPU = Path(__file__).resolve().parents[2] / "data" / "gloo_blocking_rank0.json.gz"

#: (window step) -> span, compute, non-compute, comm, exposed comm, memory, idle, host idle, device idle (ms)
WANT = {-1: (1.85, 0.75, 0.27, 0.30, 0.20, 0.07, 0.83, 0.73, 0.10),
        1: (0.72, 0.30, 0.27, 0.30, 0.20, 0.07, 0.15, 0.15, 0.00),
        2: (0.85, 0.35, 0.00, 0.00, 0.00, 0.00, 0.50, 0.45, 0.05)}
MS = ["span_ms", "compute_ms", "non_compute_ms", "comm_ms", "exposed_comm_ms", "memory_ms", "idle_ms",
      "idle_host_ms", "idle_device_ms"]


@pytest.fixture(scope="module")
def ledger() -> tuple[pd.DataFrame, pd.DataFrame]:
    return gpu_ledger(read_trace(TRACE))


def test_windows_and_columns(ledger) -> None:
    led, _ = ledger
    assert list(led.columns) == LEDGER_COLUMNS
    assert list(zip(led["window"], led["step"])) == [("trace", -1), ("step", 1), ("step", 2)]
    assert (led["rank"] == 0).all()


@pytest.mark.parametrize("step", sorted(WANT))
def test_ledger_values_are_the_hand_computed_ones(ledger, step) -> None:
    row = ledger[0].set_index("step").loc[step]
    assert [row[c] for c in MS] == pytest.approx(WANT[step], abs=1e-9)
    # the stacked bar sums to the span; idle splits into host and device
    assert row["compute_ms"] + row["non_compute_ms"] + row["idle_ms"] == pytest.approx(row["span_ms"])
    assert row["idle_host_ms"] + row["idle_device_ms"] == pytest.approx(row["idle_ms"])


def test_shares_host_bound_and_top_cause(ledger) -> None:
    led = ledger[0].set_index("step")
    assert [led.loc[-1, c] for c in ("idle_pct", "compute_pct", "non_compute_pct")] == pytest.approx(
        [100 * 830 / 1850, 100 * 750 / 1850, 100 * 270 / 1850])
    assert led["host_bound"].tolist() == [False, False, True]  # step 2: host 450 > 425 µs
    assert led["top_idle_cause"].tolist() == ["aten::item", "Optimizer.step#SGD.step", "aten::item"]
    assert led["top_idle_cause_ms"].tolist() == pytest.approx([0.30, 0.15, 0.30])


def test_causes_name_the_outermost_op_or_python(ledger) -> None:
    causes = ledger[1]
    trace = causes[causes["step"] == -1]
    # aten::add_ inside Optimizer.step covers the gap's start too, but it is not the outermost op
    assert list(zip(trace["cause"], trace["idle_ms"].round(9))) == [
        ("aten::item", 0.30), ("python", 0.28), ("Optimizer.step#SGD.step", 0.15)]
    step2 = causes[causes["step"] == 2]
    assert list(zip(step2["cause"], step2["idle_ms"].round(9))) == [("aten::item", 0.30), ("python", 0.15)]


def test_a_cpu_trace_has_no_ledger() -> None:
    led, causes = gpu_ledger(read_trace(GLOO_CPU))
    assert led.empty and causes.empty and list(led.columns) == LEDGER_COLUMNS


def test_advice_only_where_clear(ledger) -> None:
    led = ledger[0].set_index("step")
    tip = advice(led.loc[2])
    assert tip.startswith("host-bound: the GPU waited 0.45 ms (53 % of the span)")
    # a synchronising op is the top cause: its remedy (no value read back per step), not launch overhead's
    assert "the top cause is aten::item" in tip and "no .item()" in tip and "CUDA graphs" not in tip
    assert advice(led.loc[1]) == ""  # 150 of 720 µs host idle, no device idle: nothing clear
