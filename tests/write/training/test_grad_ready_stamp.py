"""grads.csv stamps a gradient when it is ready, before any variant hook launches its bucket.

A bucket's all-reduce cannot start before every gradient in it is ready, so in each (rank, step)
the gradients stamped at or before the i-th all-reduce's launch must hold at least the bytes of
all-reduces 0..i. This needs no bucket plan (DDP's reducer rebuilds its own after the first
step), and it fails when the stamp is taken after the variant's hook has launched the bucket."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank gloo run: bucketed (dpcore's hooks) and torch_ddp (DDP's reducer)."""
    out = tmp_path_factory.mktemp("stamp")
    cmd = [sys.executable, "-m", "dpcore", "profile", "--model", "mlp", "--width", "256", "--variants",
           "bucketed,torch_ddp", "--world-sizes", "2", "--bucket-mb", "0.25", "--steps", "4", "--warmup", "1",
           "--no-trace", "--calibration-steps", "0", "--backend", "gloo", "--progress", "none",
           "--out", str(out), "--run-id", "r"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=600)
    return out / "r"


def late_launches(grads: pd.DataFrame, coll: pd.DataFrame) -> list[tuple]:
    """(rank, step, seq, bytes ready by the launch, bytes launched so far) of every all-reduce
    launched before enough gradient bytes were stamped ready to fill it and the ones before it."""
    bad = []
    ar = coll[coll["op"] == "all_reduce"]
    for (rank, step), c in ar.groupby(["rank", "step"]):
        g = grads[(grads["rank"] == rank) & (grads["step"] == step)]
        ready = pd.to_numeric(g["t_ready_ns"]).to_numpy(np.int64)
        nbytes = g["bytes"].to_numpy(np.int64)
        c = c.sort_values("seq")
        launched = np.cumsum(c["bytes"].to_numpy(np.int64))
        for seq, t, need in zip(c["seq"], pd.to_numeric(c["t_launch_ns"]).to_numpy(np.int64), launched):
            have = int(nbytes[ready <= t].sum())
            if have < need:
                bad.append((int(rank), int(step), int(seq), have, int(need)))
    return bad


@pytest.mark.parametrize("variant", ["bucketed", "torch_ddp"])
def test_every_bucket_is_ready_by_its_launch(run: Path, variant: str) -> None:
    grads, coll = pd.read_csv(run / "grads.csv"), pd.read_csv(run / "collectives.csv")
    job = f"{variant}-ws2-b0.25"
    g, c = grads[grads["job_id"] == job], coll[coll["job_id"] == job]
    assert len(c[c["op"] == "all_reduce"]) >= 2 * 4 * 2      # several buckets per step, both ranks
    assert g["step"].nunique() == 4 and g["rank"].nunique() == 2
    assert late_launches(g, c) == []


def test_the_check_catches_a_stamp_after_its_launch() -> None:
    """The check itself: one gradient stamped 1 ns after its bucket's launch is reported."""
    grads = pd.DataFrame({"rank": 0, "step": 0, "param": [0, 1, 2], "bytes": [4, 4, 8],
                          "t_ready_ns": [30, 20, 10]})
    coll = pd.DataFrame({"rank": 0, "step": 0, "op": "all_reduce", "seq": [0, 1], "bytes": [8, 8],
                         "t_launch_ns": [10, 29]})
    assert late_launches(grads, coll) == [(0, 0, 1, 12, 16)]
