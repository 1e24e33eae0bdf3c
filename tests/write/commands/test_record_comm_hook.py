"""``dpcore.record`` keeps a comm hook the user registered (PowerSGD, fp16 compression) and logs
the collectives that hook launches. Real 2-rank gloo DDP; known answers:

- with and without recording, PowerSGD trains to bit-identical parameters (recording changes
  nothing the hook computes);
- fp16 compression puts exactly half the bytes of the uncompressed (default) job on the wire;
- PowerSGD rank 1 sends, per 2-D gradient of shape (n, m), n + m values instead of n * m.
"""
from __future__ import annotations

import faulthandler
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel

from dpcore.write.commands.record import record
from tests import spawned

WARMUP, STEPS = 3, 7
START_PSGD = 2  # PowerSGD's first compressed step (it all-reduces plainly before: warm-up here)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))


def _ddp(hook: str) -> DistributedDataParallel:
    model = DistributedDataParallel(_net(), bucket_cap_mb=25)
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=START_PSGD, random_seed=0)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    return model


def _train(model: nn.Module, rec=None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(STEPS):
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 8, (32,), generator=g)
        if rec is None:
            nn.functional.cross_entropy(model(x), y).backward()
        else:
            with rec.step():
                nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _rank(rank: int, store: str, out: str) -> None:
    faulthandler.enable()  # a rank killed by a signal (SIGABRT once in CI) prints its Python stacks
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        finals = {}
        for hook in ("none", "fp16", "powersgd"):
            model = _ddp(hook)
            with record(out, name=hook, model=model, warmup=WARMUP, profile_steps=1) as rec:
                _train(model, rec)
            finals[hook] = [p.detach().clone() for p in model.parameters()]
        plain = _ddp("powersgd")  # the same job without recording
        _train(plain)
        same = all(torch.equal(a, b) for a, b in zip(finals["powersgd"], plain.parameters()))
        if rank == 0:
            Path(out, "identical.txt").write_text(str(same))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    spawned.leave()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hooks")
    out = tmp / "profiles"
    mp.spawn(_rank, args=(str(tmp / "store"), str(out)), nprocs=2, join=True)
    found = {p.name.split("-")[-2]: p for p in out.iterdir() if p.is_dir()}
    assert set(found) == {"none", "fp16", "powersgd"}, found
    return found


def _load(path: Path):
    from dpcore.read.rundir import load_run
    return load_run(path)


def test_powersgd_kept_and_identical(runs: dict[str, Path]) -> None:
    assert (runs["none"].parent / "identical.txt").read_text() == "True"
    job = _load(runs["powersgd"]).meta["jobs"][0]
    assert job["status"] == "complete" and job["comm_hook"] == "powerSGD_hook"
    assert "comm hook kept" in job["note"]


def _bytes_per_step(path: Path) -> set[int]:
    c = _load(path).collectives
    assert len(c) and (c["t_end_ns"] >= c["t_launch_ns"]).all()
    return set(c.groupby(["rank", "step"])["bytes"].sum())


def test_fp16_halves_the_recorded_bytes(runs: dict[str, Path]) -> None:
    grads = sum(p.numel() * 4 for p in _net().parameters())
    assert _bytes_per_step(runs["none"]) == {grads}  # dpcore's own hook: the fp32 buckets
    assert _bytes_per_step(runs["fp16"]) == {grads // 2}
    assert set(_load(runs["fp16"]).collectives["op"]) == {"all_reduce"}


def test_powersgd_collectives_are_logged(runs: dict[str, Path]) -> None:
    """Rank 1: each (n, m) weight sends P (n) and Q (m); biases go uncompressed, in fp32."""
    net = _net()
    low = sum((p.shape[0] + p.shape[1]) * 4 for p in net.parameters() if p.dim() == 2)
    vec = sum(p.numel() * 4 for p in net.parameters() if p.dim() == 1)
    assert _bytes_per_step(runs["powersgd"]) == {low + vec}
    per_step = _load(runs["powersgd"]).collectives.groupby(["rank", "step"]).size()
    assert set(per_step) == {3}  # uncompressed vectors, then P, then Q (from the callback)
