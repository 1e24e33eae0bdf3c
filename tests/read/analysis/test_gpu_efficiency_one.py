"""Step MFU, GEMM efficiency and FLOPs coverage have one set of formulas
(gpu_flops.with_efficiency): a rank's headline (rank_efficiency) is that function on the rank's
pooled sums, so a window and a rank can never be computed two ways."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpcore.read.analysis import gpu_flops
from dpcore.read.analysis.gpu_flops import EFFICIENCY_COLUMNS, rank_efficiency, with_efficiency


def _ledger() -> pd.DataFrame:
    """A made ledger: rank 0 with its trace window and two steps, rank 1 with a trace window
    only (no step had GPU events), rank 2 without FLOPs."""
    base = {"set_aside_events": 0, "flops_set_aside": 0, "model_tflop": 0.5}
    rows = [
        {"rank": 0, "step": -1, "span_ms": 100.0, "ideal_ms": 30.0, "ideal_ms_tf32": 20.0, "flops_ms": 60.0,
         "kernel_ms": 80.0, "gemm_ms": 50.0, "gemm_ideal_ms": 25.0, "gemm_ideal_ms_tf32": 15.0, **base,
         "flops_set_aside": 2, "set_aside_events": 1},
        {"rank": 0, "step": 1, "span_ms": 40.0, "ideal_ms": 12.0, "ideal_ms_tf32": 8.0, "flops_ms": 24.0,
         "kernel_ms": 30.0, "gemm_ms": 20.0, "gemm_ideal_ms": 10.0, "gemm_ideal_ms_tf32": 6.0, **base},
        {"rank": 0, "step": 2, "span_ms": 60.0, "ideal_ms": 18.0, "ideal_ms_tf32": 12.0, "flops_ms": 36.0,
         "kernel_ms": 50.0, "gemm_ms": 30.0, "gemm_ideal_ms": 15.0, "gemm_ideal_ms_tf32": 9.0, **base},
        {"rank": 1, "step": -1, "span_ms": 10.0, "ideal_ms": 1.0, "ideal_ms_tf32": 0.5, "flops_ms": 4.0,
         "kernel_ms": 8.0, "gemm_ms": 4.0, "gemm_ideal_ms": 1.0, "gemm_ideal_ms_tf32": 0.5, **base},
        {"rank": 2, "step": -1, "span_ms": 10.0, "ideal_ms": 0.0, "ideal_ms_tf32": 0.0, "flops_ms": 0.0,
         "kernel_ms": 8.0, "gemm_ms": 0.0, "gemm_ideal_ms": 0.0, "gemm_ideal_ms_tf32": 0.0, **base},
    ]
    return pd.DataFrame(rows).assign(job_id="j")


@pytest.mark.parametrize("tf32", [False, True])
def test_rank_numbers_are_the_pooled_window_formulas(tf32: bool) -> None:
    got = rank_efficiency(_ledger(), tf32).set_index("rank")
    sfx = "_tf32" if tf32 else ""
    # rank 0: steps pooled for MFU and coverage, the trace window for GEMM efficiency
    ideal = (12.0 + 18.0) if not tf32 else (8.0 + 12.0)
    assert got.loc[0, "step_mfu_pct"] == pytest.approx(100 * ideal / 100.0)
    assert got.loc[0, "flops_coverage_pct"] == pytest.approx(100 * 60.0 / 80.0)
    assert got.loc[0, "gemm_eff_pct"] == pytest.approx(100 * (25.0 if not tf32 else 15.0) / 50.0)
    assert got.loc[0, "mfu_windows"] == "steps" and got.loc[0, "model_tflop_per_step"] == pytest.approx(0.5)
    assert (got.loc[0, "flops_set_aside"], got.loc[0, "set_aside_events"]) == (2, 1)
    # rank 1, one window: exactly that window's with_efficiency numbers
    one = with_efficiency(_ledger(), tf32).set_index("rank").loc[1]
    for c in EFFICIENCY_COLUMNS:
        assert got.loc[1, c] == pytest.approx(one[c])
    assert got.loc[1, "step_mfu_pct"] == pytest.approx(100 * _ledger().set_index("rank").loc[1, f"ideal_ms{sfx}"] / 10)
    # rank 2: no FLOPs, empty MFU and GEMM efficiency, never 0 %
    assert np.isnan(got.loc[2, "step_mfu_pct"]) and np.isnan(got.loc[2, "gemm_eff_pct"])
    assert got.loc[2, "flops_coverage_pct"] == 0.0


def test_rank_efficiency_uses_with_efficiency(monkeypatch: pytest.MonkeyPatch) -> None:
    """The formulas live in with_efficiency alone: rank_efficiency goes through it."""
    calls: list[int] = []
    real = gpu_flops.with_efficiency

    def counted(ledger: pd.DataFrame, tf32: bool = False) -> pd.DataFrame:
        calls.append(len(ledger))
        return real(ledger, tf32)

    monkeypatch.setattr(gpu_flops, "with_efficiency", counted)
    rank_efficiency(_ledger())
    assert calls == [3]  # one row of sums per rank
