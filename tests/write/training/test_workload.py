"""``--model MODULE:FUNCTION``: a model defined outside dpcore profiles and verifies, and every
mistake in the spec or the workload is one line and exit 2 before anything runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dpcore.cli import main
from dpcore.contract.config import TrainConfig
from dpcore.write.training.trainer import local_context, make_trainer
from dpcore.write.training.workload import Batch, TupleInputs, check_workload, shard_batch

ROOT = Path(__file__).resolve().parents[3]

# Tied weight (embedding == head), a frozen parameter, tuple inputs, sizes not divisible by 2/3.
GOOD = '''
import torch, torch.nn as nn, torch.nn.functional as F
import dpcore

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(13, 7)
        self.side = nn.Linear(5, 7)
        self.frozen = nn.Parameter(torch.randn(7), requires_grad=False)
        self.head = nn.Linear(7, 13, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens, feats):
        return self.head(torch.tanh(self.emb(tokens).mean(1) + self.side(feats) + self.frozen))

def make_batch(n, g):
    return ((torch.randint(0, 13, (n, 3), generator=g), torch.randn(n, 5, generator=g)),
            torch.randint(0, 13, (n,), generator=g))

def build():
    return dpcore.Workload(Net(), make_batch, F.cross_entropy, batch_size=6)
'''


def _write(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))


def _dpcore(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m dpcore`` as a user runs it: from their folder, dpcore on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "dpcore", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_user_model_profiles_from_its_own_folder(tmp_path: Path) -> None:
    _write(tmp_path, "mymod", GOOD)
    proc = _dpcore(tmp_path, "profile", "--model", "mymod:build", "--variants",
                   "single,manual,flat,bucketed,torch_ddp", "--world-sizes", "1,2", "--steps", "2",
                   "--warmup", "1", "--profile-steps", "1", "--progress", "none", "--out", "runs")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = (tmp_path / "runs").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["config"]["model"] == "mymod:build"
    assert meta["config"]["batch_size"] == 6  # Workload.batch_size is the default
    assert meta["status"] == "complete"
    assert {j["status"] for j in meta["jobs"]} == {"complete"}
    assert (run / "steps.csv").read_text().count("\n") > 8


def test_user_model_verifies_from_its_own_folder(tmp_path: Path) -> None:
    _write(tmp_path, "mymod", GOOD)
    proc = _dpcore(tmp_path, "verify", "--model", "mymod:build", "--world-size", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    rows = {ln.split()[0]: ln for ln in proc.stdout.splitlines()[2:]}
    assert "reference" in rows["single"] and rows["single"].split()[1] == "1", proc.stdout  # at world size 1
    for v in ("manual", "naive", "flat", "central", "ring", "overlap", "bucketed", "torch_ddp"):
        assert rows[v].rstrip().endswith("match"), proc.stdout
    assert "skipped" in rows["data_parallel"] or rows["data_parallel"].endswith("match")


def test_user_model_verifies_at_world_size_3(tmp_path: Path, monkeypatch) -> None:
    from dpcore.write.commands.verify import run_verify, verify_config

    _write(tmp_path, "wl_three", GOOD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = verify_config("wl_three:build", 3)
    assert cfg.bucket_mb < 1e-3  # sized from the model: several buckets
    rows, ok = run_verify(3, model="wl_three:build", steps=3, backend="gloo", timeout_s=120,
                          cfg=cfg)
    assert ok, rows
    verdicts = {r["variant"]: r["verdict"] for r in rows if r["variant"] != "data_parallel"}
    assert verdicts.pop("single").startswith("reference")  # single is what the others are compared with
    assert list(verdicts.values()) == ["match"] * 14, verdicts


def test_trainer_shards_tuple_inputs_and_manual_splits_them(tmp_path: Path, monkeypatch) -> None:
    _write(tmp_path, "wl_trainer", GOOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = TrainConfig(model="wl_trainer:build", batch_size=4, steps=1)
    tr = make_trainer("manual", local_context("cpu"), cfg, replicas=2)
    x, y = tr.batch(0)
    assert isinstance(x, Batch) and [t.shape[0] for t in x] == [8, 8] and y.shape == (8,)
    halves = x.chunk(2)
    assert torch.equal(halves[1][0], x[0][4:]) and torch.equal(shard_batch(x, 1, 2)[1], x[1][4:])
    frozen = tr.module.model.frozen.clone()
    from dpcore.write.capture.comm_log import PhaseTimer
    loss = tr.step(x, y, PhaseTimer(torch.device("cpu")))
    assert loss > 0 and torch.equal(tr.module.model.frozen, frozen)
    assert tr.module.model.head.weight is tr.module.model.emb.weight
    # same seed, same weights: what every rank relies on
    other = make_trainer("single", local_context("cpu"), cfg, replicas=2)
    assert torch.equal(other.module.model.side.weight, make_trainer(
        "single", local_context("cpu"), cfg).module.model.side.weight)
    assert isinstance(other.module, TupleInputs)


def test_check_workload_returns_the_workload(tmp_path: Path, monkeypatch) -> None:
    _write(tmp_path, "wl_check", GOOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    wl = check_workload("wl_check:build", 0, [1, 2, 3])
    assert wl.batch_size == 6 and isinstance(wl.model, torch.nn.Module)


BAD = {
    "wl_raises": ("raise RuntimeError('no GPU here')\n", "build",
                  "importing 'wl_raises' raised RuntimeError: no GPU here"),
    "wl_nofunc": ("def buidl(): pass\ndef helper(): pass\n", "build",
                  "module 'wl_nofunc' has no function 'build'; it defines: buidl, helper"),
    "wl_fnraises": ("def build(): raise ValueError('bad width')\n", "build",
                    "build() raised ValueError: bad width"),
    "wl_wrongtype": ("import torch\ndef build(): return torch.nn.Linear(2, 2)\n", "build",
                     "build() must return a dpcore.Workload(model, make_batch, loss_fn), got Linear"),
    "wl_shape": (GOOD.replace("torch.randint(0, 13, (n,), generator=g)",
                              "torch.randint(0, 13, (n + 1,), generator=g)"), "build",
                 "returned tensors with first dimensions 4, 4, 5; every input and the targets "
                 "must have the batch (4) first"),
    "wl_random": (GOOD.replace("torch.randn(n, 5, generator=g)", "torch.randn(n, 5)"), "build",
                  "make_batch returned different batches for equally seeded generators"),
    "wl_loss": (GOOD.replace("F.cross_entropy,", "lambda o, t: (o - 1).abs(),"), "build",
                "loss_fn must return a scalar tensor (mean over the batch), got (4, 13)"),
    "wl_deps": ("import not_a_real_dependency_xyz\n", "build",
                "importing 'wl_deps' raised ModuleNotFoundError: No module named "
                "'not_a_real_dependency_xyz'"),
}


@pytest.mark.parametrize("command", ["profile", "verify"])
@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_workload_is_one_line_exit_2(name: str, command: str, tmp_path: Path, monkeypatch,
                                         capsys) -> None:
    body, fn, needle = BAD[name]
    mod = f"{name}_{command}"  # a fresh module per case (sys.modules caches imports)
    _write(tmp_path, mod, body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ws = ["--world-sizes", "1,2"] if command == "profile" else ["--world-size", "2"]
    out = ["--out", str(tmp_path / "runs")] if command == "profile" else []
    rc = main([command, "--model", f"{mod}:{fn}", *ws, *out])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"error: --model {mod}:{fn}: ") and err.count("\n") == 1, err
    assert needle.replace(name, mod) in err, err
    assert not (tmp_path / "runs").exists()  # refused before any run directory


@pytest.mark.parametrize("spec,needle", [
    ("mymodel", "--model must be one of mlp, transformer, einsum or MODULE:FUNCTION, got 'mymodel'"),
    ("a:b:c", "bad --model 'a:b:c'; use MODULE:FUNCTION"),
    ("wl_nowhere:build", "--model wl_nowhere:build: no module named 'wl_nowhere' in the current "
                         "directory ("),
])
def test_bad_spec_is_one_line_exit_2(spec: str, needle: str, tmp_path: Path, capsys,
                                     monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    rc = main(["profile", "--model", spec, "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert needle in err and (spec != "wl_nowhere:build" or "or on PYTHONPATH" in err), err
    assert not (tmp_path / "runs").exists()


def test_strong_scaling_batch_that_does_not_split(tmp_path: Path, monkeypatch, capsys) -> None:
    _write(tmp_path, "wl_strong", GOOD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["profile", "--model", "wl_strong:build", "--scaling", "strong", "--batch-size", "7",
               "--world-sizes", "1,2", "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "global batch 7 is not divisible by world size 2" in err
    assert err.count("\n") == 1 and not (tmp_path / "runs").exists()


def test_module_not_found_through_the_real_entry_point(tmp_path: Path) -> None:
    proc = _dpcore(tmp_path, "verify", "--model", "nosuchmod:build", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --model nosuchmod:build: no module named 'nosuchmod' in the current directory "
        f"({tmp_path}) or on PYTHONPATH"]


def test_example_is_a_workload() -> None:
    from dpcore.write.training.workload import load_workload

    wl = load_workload("examples.my_model:build", 0)
    names = dict(wl.model.named_parameters())
    assert any(not p.requires_grad for p in names.values())          # a frozen parameter
    assert wl.model.head.weight is wl.model.emb.weight                 # a tied weight
    x, _ = wl.make_batch(4, torch.Generator().manual_seed(0))
    assert isinstance(x, tuple) and len(x) == 2                        # tuple inputs


def test_import_dpcore_stays_cheap() -> None:
    code = ("import sys, dpcore; assert 'torch' not in sys.modules; "
            "W = dpcore.Workload; assert 'torch' in sys.modules; print(W.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "Workload", proc.stderr
