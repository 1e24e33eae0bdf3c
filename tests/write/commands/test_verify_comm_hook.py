"""``verify --comm-hook``: DDP with fp16 compression and PowerSGD differs from single-process
training by design; verify reports those rows as ``lossy`` with the measured difference (not
as failures, exit 0), and bf16, refused by gloo, as skipped with the reason."""
from __future__ import annotations

from dpcore.write.commands.verify import run_verify


def test_compressed_rows_are_lossy() -> None:
    rows, ok = run_verify(2, model="toy", steps=5, variants=["single", "torch_ddp"], backend="gloo",
                          comm_hooks=["fp16", "bf16", "powersgd"])
    by = {r["variant"]: r for r in rows}
    assert list(by) == ["single", "torch_ddp", "torch_ddp[fp16]", "torch_ddp[bf16]", "torch_ddp[powersgd]"]
    assert ok and by["torch_ddp"]["verdict"] == "match"
    for hook in ("fp16", "powersgd"):
        r = by[f"torch_ddp[{hook}]"]
        assert r["verdict"] == "lossy", r
        assert 0 < r["max_abs_diff"] < 1.0  # measured: a real, bounded difference
    # rank-1 PowerSGD throws away far more of each gradient than fp16 rounding does
    assert by["torch_ddp[powersgd]"]["max_abs_diff"] > by["torch_ddp[fp16]"]["max_abs_diff"]
    assert by["torch_ddp[bf16]"]["verdict"].startswith("skipped: bf16_compress_hook does not run on gloo")
