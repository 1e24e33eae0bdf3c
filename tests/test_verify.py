"""``verify``: every variant matches ``single`` at 2 and 3 ranks on the toy model."""
from __future__ import annotations

import pytest
import torch

from dpcore.contract.errors import UsageError
from dpcore.write.verify import COLUMNS, format_table, max_abs_diff, run_verify, tolerance, verify_config


@pytest.mark.parametrize("ws", [2, 3])
def test_all_variants_match_single(ws: int) -> None:
    rows, ok = run_verify(ws, model="toy", steps=4, backend="gloo", timeout_s=120)
    by = {r["variant"]: r for r in rows}
    assert list(by) == ["single", "manual", "naive", "flat", "central", "ring", "overlap",
                        "bucketed", "torch_ddp", "data_parallel"]
    assert all(set(COLUMNS) <= set(r) for r in rows)
    assert ok
    for v, r in by.items():
        assert r["world_size"] == ws
        if v == "data_parallel" and torch.cuda.device_count() < 2:
            assert r["verdict"].startswith("skipped: ") and "GPUs" in r["verdict"]
            continue
        assert r["verdict"] == "match", (v, r)
        assert 0.0 <= r["max_abs_diff"] <= r["tolerance"] == tolerance(verify_config("toy", 4))
    table = format_table(rows)
    assert "bucketed" in table and "match" in table and len(table.splitlines()) == 12


def test_subset_and_bad_names() -> None:
    rows, ok = run_verify(1, variants=["single", "manual"], steps=2)
    assert ok and [r["verdict"] for r in rows] == ["match", "match"]
    with pytest.raises(UsageError, match="valid choices"):
        run_verify(2, variants=["bogus"])
    with pytest.raises(UsageError):
        run_verify(2, model="resnet")


def test_max_abs_diff_detects_differences() -> None:
    a = {"w": torch.zeros(7, 13), "b": torch.ones(11)}
    b = {"w": torch.zeros(7, 13), "b": torch.ones(11) + 0.5}
    assert max_abs_diff(a, a) == 0.0
    assert max_abs_diff(a, b) == pytest.approx(0.5)
    assert max_abs_diff(a, {"w": a["w"]}) == float("inf")
    # a bug as small as a 0.1% learning-rate change is far above the tolerance
    assert tolerance(verify_config("toy", 5)) < 1e-5
