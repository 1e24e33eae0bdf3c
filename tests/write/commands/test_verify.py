"""``verify``: every variant matches ``single`` at 2 and 3 ranks on the toy model."""
from __future__ import annotations

import pytest
import torch

from dpcore.contract.errors import UsageError
from dpcore.write.commands.verify import (
    COLUMNS,
    REFERENCE,
    compute_tolerance,
    format_table,
    max_abs_diff,
    run_verify,
    tolerance,
    verify_config,
)


@pytest.mark.parametrize("ws", [2, 3])
def test_all_variants_match_single(ws: int) -> None:
    rows, ok = run_verify(ws, model="toy", steps=4, backend="gloo", timeout_s=120)
    by = {r["variant"]: r for r in rows}
    assert list(by) == ["single", "manual", "naive", "flat", "central", "ring", "overlap",
                        "bucketed", "torch_ddp", "data_parallel", "zero1", "torch_zero1", "fsdp",
                        "fsdp[float16]", "fsdp[bfloat16]", "torch_fsdp"]
    assert all(set(COLUMNS) <= set(r) for r in rows)
    assert ok
    # single is the reference: one process with the whole batch, never "world size N"
    assert (by["single"]["world_size"], by["single"]["verdict"]) == (1, REFERENCE)
    assert by["single"]["max_abs_diff"] is None
    for v, r in by.items():
        if v == "single":
            continue
        assert r["world_size"] == ws
        if v == "data_parallel" and torch.cuda.device_count() < 2:
            assert r["verdict"].startswith("skipped: ") and "GPUs" in r["verdict"]
            continue
        if v == "torch_fsdp" and r["verdict"].startswith("skipped: "):
            continue  # a backend without reduce_scatter_tensor: skipped with the reason
        assert r["verdict"] == "match", (v, r)
        cfg = verify_config("toy", 4)
        tol = compute_tolerance(cfg, v[5:-1]) if v.startswith("fsdp[") else tolerance(cfg)
        assert 0.0 <= r["max_abs_diff"] <= r["tolerance"] == tol
    table = format_table(rows)
    assert "bucketed" in table and "match" in table and len(table.splitlines()) == 18


def test_subset_and_bad_names() -> None:
    rows, ok = run_verify(1, variants=["single", "manual"], steps=2)
    assert ok and [r["verdict"] for r in rows] == [REFERENCE, "match"]
    assert "single   1      -" in format_table(rows)
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


def test_sharded_variants_verify_with_adam() -> None:
    """--optimizer adam: ZeRO-1 and FSDP step Adam on shards and still end where single ends;
    the half-compute rows train with SGD against single with SGD (named so)."""
    cfg = verify_config("toy", 3, optimizer="adam")
    rows, ok = run_verify(2, steps=3, variants=["single", "zero1", "torch_zero1", "fsdp"],
                          backend="gloo", timeout_s=120, cfg=cfg)
    by = {r["variant"]: r for r in rows}
    assert list(by) == ["single", "zero1", "torch_zero1", "fsdp", "fsdp[float16,sgd]",
                        "fsdp[bfloat16,sgd]"]
    assert ok, rows
    assert by["zero1"]["tolerance"] == tolerance(cfg) == 10 * tolerance(verify_config("toy", 3))


def test_compute_tolerance_is_stated_per_dtype() -> None:
    cfg = verify_config("toy", 4)
    assert compute_tolerance(cfg, "float16") == 4 * 2.0 ** -12
    assert compute_tolerance(cfg, "bfloat16") == 8 * compute_tolerance(cfg, "float16")
