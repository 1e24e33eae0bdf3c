"""Memory per rank (memory.csv), the Memory view and the expected communication volume.

Why these tests: a memory number is only useful when it counts what a rank really holds, so
storages are checked against byte counts worked out by hand (a tied weight once, views of one
buffer once, Adam's two moments); a real 2-rank gloo profile must write the parameter bytes the
model has; and the Memory picture must show exactly the numbers of a hand-written run folder
holding the sharded variants (zero1, fsdp), whatever the write side of those variants does.
The plots are imported inside the tests that draw them: a GPU host (scripts/gpu_check.sh) has no
plotly, and its `pytest -m gpu` must still collect this module for the allocator test.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from dpcore.contract import runformat as rf
from dpcore.contract.config import TrainConfig
from dpcore.read.analysis import job_summary
from dpcore.read.analysis.memory import (
    comm_volume,
    expected_volume,
    job_memory,
    memory_table,
    summary_memory_columns,
    volume_totals,
)
from dpcore.read.rundir import load_run
from dpcore.write.capture.comm_log import PhaseTimer
from dpcore.write.capture.memory import CPU_METHOD, held_bytes, measure_step
from dpcore.write.dp.variants import REGISTRY
from dpcore.write.training.models import MLP
from dpcore.write.training.trainer import local_context, make_trainer
from tests.events_path import trace_step_metrics, traced_job_events

ROOT = Path(__file__).resolve().parents[3]
MIB = 1 << 20


# -- write side: storages counted once --------------------------------------------------------

def test_tied_weight_and_views_of_one_buffer_count_once() -> None:
    emb = nn.Embedding(10, 4)                    # 40 floats = 160 bytes
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight                     # tied: one storage, used twice
    bias = nn.Parameter(torch.zeros(3))          # 12 bytes
    flat = torch.zeros(100)                      # one 400-byte bucket buffer ...
    grads = [flat[:40].view(10, 4), flat[40:43], flat[43:]]  # ... seen through three views
    by_kind, _ = held_bytes({"params": [emb.weight, head.weight, bias], "grads": grads,
                             "optim": [], "other": [flat]})
    assert by_kind == {"params": 172, "grads": 400, "optim": 0, "other": 0}  # flat: already a grad


def test_a_storage_in_two_kinds_counts_in_the_first() -> None:
    w = torch.zeros(8)  # 32 bytes
    by_kind, _ = held_bytes({"params": [w], "grads": [w[:4]], "optim": [w], "other": [torch.zeros(2)]})
    assert by_kind == {"params": 32, "grads": 0, "optim": 0, "other": 8}


def test_adam_state_is_two_moments_per_parameter() -> None:
    model = REGISTRY["single"](nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 3)))
    opt = model.make_optimizer(torch.optim.Adam, lr=0.1)
    model(torch.randn(2, 5)).sum().backward()
    opt.step()
    params = list(model.module.parameters())
    p_bytes = sum(p.numel() * 4 for p in params)
    assert p_bytes == 4 * (5 * 7 + 7 + 7 * 3 + 3)
    by_kind, _ = held_bytes(model.memory_tensors(opt))
    assert by_kind["params"] == by_kind["grads"] == p_bytes
    # exp_avg + exp_avg_sq = 2 x the parameters, plus Adam's float32 scalar `step` per tensor
    assert by_kind["optim"] == 2 * p_bytes + 4 * len(params)


def test_cpu_peak_holds_params_grads_and_saved_activations() -> None:
    cfg = TrainConfig(model="mlp", width=16, batch_size=512, warmup=0)
    tr = make_trainer("single", local_context("cpu"), cfg)
    timer = PhaseTimer(torch.device("cpu"), 0)
    x, y = tr.batch(0)
    row = measure_step(tr, lambda: tr.step(x, y, timer), job_id="single-ws1", variant="single",
                       world_size=1, rank=0)
    p = sum(q.numel() * 4 for q in tr.module.parameters())
    assert row["param_bytes"] == row["grad_bytes"] == p and row["optim_bytes"] == 0
    assert row["peak_method"] == CPU_METHOD and tr.probe is None
    assert row["reserved_bytes"] is None  # no caching allocator on CPU: the cell stays empty
    assert row["peak_bytes"] >= row["param_bytes"] + row["grad_bytes"]
    # after forward the first Linear still holds its input (512 x 256 floats) for backward
    assert row["peak_bytes"] >= p + x.numel() * 4


def test_profile_writes_memory_csv_with_the_model_bytes(tmp_path: Path) -> None:
    width = 32
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCORE_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "dpcore", "profile", "--variants", "bucketed,torch_ddp",
                           "--world-sizes", "2",
                           "--model", "mlp", "--width", str(width), "--batch-size", "4", "--steps", "2",
                           "--warmup", "1", "--no-trace", "--progress", "none", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    with open(run_dir / "memory.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == rf.MEMORY_COLUMNS
        rows = list(reader)
    # 16 Linear layers: 256 -> 32, 14 x 32 -> 32, 32 -> 10, weights and biases in float32
    expected = 4 * ((256 * width + width) + 14 * (width * width + width) + (width * 10 + 10))
    assert expected == 4 * sum(p.numel() for p in MLP(width).parameters())
    assert sorted((r["job_id"], int(r["rank"])) for r in rows) == \
        [("bucketed-ws2-b25", 0), ("bucketed-ws2-b25", 1), ("torch_ddp-ws2-b25", 0), ("torch_ddp-ws2-b25", 1)]
    for r in rows:
        assert r["device"] == "cpu" and int(r["optim_bytes"]) == 0
        assert int(r["peak_bytes"]) >= 2 * expected and r["peak_method"] == CPU_METHOD and r["reserved_bytes"] == ""
        if r["variant"] == "bucketed":  # gradients are views into the bucket buffers: P once
            assert int(r["param_bytes"]) == int(r["grad_bytes"]) + int(r["other_bytes"]) == expected
        else:  # DDP keeps its reducer buckets beside the gradients: P twice
            assert int(r["param_bytes"]) == int(r["grad_bytes"]) == int(r["other_bytes"]) == expected
    run = load_run(run_dir)
    mem = summary_memory_columns(run.memory)
    assert mem["param_mib"].iloc[0] == pytest.approx(expected / MIB)


# -- expected communication volume ------------------------------------------------------------

def expected_bus_bytes(variant: str, world_size: int, param_bytes: float, replicated_bytes: float = 0.0,
                       param_return: str = "all_gather") -> float:
    """Σ bus bytes of :func:`expected_volume`: the one number per variant docs/metrics.md tabulates."""
    terms = expected_volume(variant, world_size, param_bytes, replicated_bytes, param_return)
    return float(sum(t["bus_bytes"] for t in terms))


def test_expected_volume_formulas() -> None:
    p, n = 1000.0, 4
    assert expected_bus_bytes("bucketed", n, p) == pytest.approx(2 * 3 / 4 * p)          # 1500
    assert expected_bus_bytes("torch_ddp", n, p) == pytest.approx(1500)
    assert expected_bus_bytes("zero1", n, p) == pytest.approx(3 * 3 / 4 * p)             # 2250
    assert expected_bus_bytes("torch_zero1", n, p) == pytest.approx(1500 + p)
    assert expected_bus_bytes("zero1", n, p, param_return="broadcast") == pytest.approx(1500 + p)
    assert expected_bus_bytes("torch_fsdp", n, p) == pytest.approx(2250)
    # fsdp, 100 bytes replicated: 3(N-1)/N * 900 + 2(N-1)/N * 100
    assert expected_bus_bytes("fsdp", n, p, 100) == pytest.approx(2025 + 150)
    fsdp = {t["op"]: t["bytes"] for t in expected_volume("fsdp", n, p, 100)}
    assert fsdp == {"all_gather": 1800, "reduce_scatter": 900, "all_reduce": 100}
    assert expected_volume("bucketed", 1, p) == [] and expected_volume("single", 4, p) == []


# -- read side: a hand-written run folder with sharded variants ------------------------------

# (job, variant, step ms, per-rank MiB: params, grads, optim, other, peak; collectives per step)
JOBS = [
    ("bucketed-ws2-b25", "bucketed", 10.0, (8, 8, 16, 0, 34), [("all_reduce", 8)]),
    ("zero1-ws2", "zero1", 12.0, (8, 8, 8, 0, 26), [("all_reduce", 8), ("all_gather", 8)]),
    # 7 MiB sharded (2-D) + 1 MiB replicated: each rank holds 3.5 + 1 MiB of parameters
    ("fsdp-ws2", "fsdp", 15.0, (4.5, 4.5, 9, 1, 21),
     [("all_gather", 3.5), ("all_gather", 3.5), ("all_gather", 3.5), ("all_gather", 3.5),
      ("reduce_scatter", 7), ("all_reduce", 1)]),
]


def _write(path: Path, table: str, rows: list[dict]) -> None:
    with open(path / rf.table_file(table), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=rf.TABLES[table])
        w.writeheader()
        w.writerows(rows)


def make_sharded_run(root: Path, name: str = "20300101-000000-sharded", memory: bool = True) -> Path:
    run = root / name
    run.mkdir(parents=True)
    steps, colls, mem, jobs = [], [], [], []
    t = 10**12
    for job, variant, ms, kinds, plan in JOBS:
        jobs.append({"id": job, "kind": "train", "variant": variant, "world_size": 2, "bucket_mb": 25.0,
                     "status": "complete"})
        for rank in range(2):
            for step in range(3):
                t0 = t + step * 100_000_000
                steps.append({"job_id": job, "variant": variant, "world_size": 2, "bucket_mb": 25.0, "rank": rank,
                              "step": step, "profiled": False, "t_start_ns": t0, "step_ms": ms, "fwd_ms": 2.0,
                              "bwd_ms": 4.0, "sync_ms": ms - 8.0, "opt_ms": 2.0, "comm_ms": 0.0, "comm_ops": 0,
                              "comm_bytes": 0, "samples": 8})
                for seq, (op, mib) in enumerate(plan):
                    a = t0 + 6_000_000 + seq * 100_000
                    colls.append({"job_id": job, "rank": rank, "step": step, "seq": seq, "op": op, "algo": "native",
                                  "bytes": int(mib * MIB), "t_launch_ns": a, "t_start_ns": "", "t_end_ns": a + 50_000,
                                  "bucket": -1})
            p, g, o, other, peak = (int(v * MIB) for v in kinds)
            mem.append({"job_id": job, "rank": rank, "variant": variant, "world_size": 2, "device": "cpu",
                        "param_bytes": p, "grad_bytes": g, "optim_bytes": o, "other_bytes": other,
                        "peak_bytes": peak + rank * MIB, "peak_method": CPU_METHOD})
        t += 10**9
    (run / rf.RUN_JSON).write_text(json.dumps({
        "run_id": name, "status": "complete", "created": "2030-01-01T00:00:00", "finished": "2030-01-01T00:01:00",
        "config": {"model": "mlp", "steps": 3, "bucket_mb": 25.0}, "environment": {"backend": "gloo"},
        "jobs": jobs}))
    _write(run, "steps", steps)
    _write(run, "collectives", colls)
    _write(run, "memory", mem if memory else [])
    return run


@pytest.fixture()
def sharded(tmp_path: Path):
    return load_run(make_sharded_run(tmp_path))


def test_memory_table_joins_the_summary_step_time(sharded) -> None:
    summary = job_summary(sharded, trace_step_metrics(traced_job_events(sharded)))
    table = memory_table(sharded.memory, summary)
    jobs = job_memory(table).set_index("job_id")
    summary = summary.set_index("job_id")
    for job, _, ms, (p, g, o, other, peak), _ in JOBS:
        assert jobs.at[job, "step_ms"] == summary.at[job, "step_ms"] == pytest.approx(ms)
        assert jobs.at[job, "held_bytes"] == pytest.approx((p + g + o + other) * MIB)
        assert jobs.at[job, "peak_bytes"] == pytest.approx((peak + 0.5) * MIB)  # ranks: peak, peak + 1
        assert jobs.at[job, "peak_bytes_max"] == pytest.approx((peak + 1) * MIB)


def test_memory_figures_show_the_numbers(sharded) -> None:
    from dpcore.read.plots.memory import memory_breakdown_figure, memory_tradeoff_figure

    table = memory_table(sharded.memory, job_summary(sharded, trace_step_metrics(traced_job_events(sharded))))
    trade = memory_tradeoff_figure(job_memory(table))
    points = {t.name: (list(t.x), list(t.y)) for t in trade.data}
    assert points["bucketed"] == ([10.0], [34.5]) and points["zero1"] == ([12.0], [26.5])
    assert points["fsdp"] == ([15.0], [21.5])
    assert trade.layout.yaxis.title.text.startswith("peak memory per rank (MiB)")
    bars = memory_breakdown_figure(table)
    by_name = {t.name: list(t.x) for t in bars.data}
    # one row per job (mean over its two ranks), in teaching order: bucketed, zero1, fsdp
    assert list(bars.data[0].y) == ["bucketed ×2", "zero1 ×2", "fsdp ×2"]
    assert by_name["parameters"] == [8, 8, 4.5]
    assert by_name["optimizer state"] == [16, 8, 9]
    assert by_name["peak (largest rank)"] == [35, 27, 22]
    assert bars.layout.barmode == "stack" and bars.data[0].orientation == "h"


def test_comm_volume_measured_next_to_expected(sharded) -> None:
    vol = comm_volume(sharded.collectives, sharded.jobs, sharded.memory, sharded.grads)
    v = vol.set_index(["job_id", "op"])
    assert v.at[("bucketed-ws2-b25", "all_reduce"), "bus_bytes_per_step"] == pytest.approx(8 * MIB)
    assert v.at[("zero1-ws2", "all_gather"), "bus_bytes_per_step"] == pytest.approx(4 * MIB)
    # fsdp: P = 8 MiB from the unsharded job, R = 2 * 4.5 - 8 = 1 MiB from its own rank's holding
    assert v.at[("fsdp-ws2", "all_gather"), "calls_per_step"] == 4
    assert v.at[("fsdp-ws2", "all_gather"), "expected_bytes_per_step"] == pytest.approx(14 * MIB)
    assert v.at[("fsdp-ws2", "all_reduce"), "replicated_bytes"] == pytest.approx(1 * MIB)
    totals = volume_totals(vol).set_index("job_id")
    assert totals.at["zero1-ws2", "expected_bus_bytes_per_step"] == pytest.approx(12 * MIB)
    assert totals.at["fsdp-ws2", "expected_bus_bytes_per_step"] == pytest.approx(11.5 * MIB)
    assert np.allclose(totals["ratio"], 1.0)
    from dpcore.read.plots.memory import volume_figure

    fig = volume_figure(vol)
    measured = {t.name: list(t.y) for t in fig.data if t.type == "bar"}
    assert measured["all-gather"] == [0, 4, 7] and measured["reduce-scatter"] == [0, 0, 3.5]
    expected = next(t for t in fig.data if t.name == "expected")
    assert list(expected.y) == pytest.approx([8, 12, 11.5])


def test_memory_view_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    from dpcore.read.dashboard.pages import spec

    make_sharded_run(tmp_path, "20300101-000000-sharded")
    make_sharded_run(tmp_path, "20200101-000000-old", memory=False)
    monkeypatch.setenv("DPCORE_PROFILES", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.run()
    at.switch_page(str(spec("Memory").path.relative_to(ROOT))).run()
    assert not at.exception and not at.error, [e.value for e in at.exception] + [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 3
    assert "3(N−1)/N·S" in " ".join(c.value for c in at.caption)  # the formula beside the numbers
    at.sidebar.selectbox(key="run_a").set_value("20200101-000000-old").run()
    assert not at.exception and not at.error
    assert any("no memory.csv rows" in i.value for i in at.info)


def test_readme_states_the_formulas_of_expected_volume() -> None:
    from dpcore.read.analysis.memory import VOLUME_FORMULAS

    readme = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8").split("## Memory and communication volume")[1]
    for variant, formula in VOLUME_FORMULAS.items():
        row = next((line for line in readme.splitlines() if line.startswith("| ") and f"`{variant}`" in line), "")
        assert formula in row, (variant, formula)


@pytest.mark.gpu  # skipped without a GPU (tests/conftest.py); selected by `pytest -m gpu` on one
def test_gpu_peak_comes_from_the_allocator() -> None:
    cfg = TrainConfig(model="mlp", width=64, batch_size=64, warmup=0)
    tr = make_trainer("single", local_context("cuda"), cfg)
    timer = PhaseTimer(torch.device("cuda", 0), 0)
    x, y = tr.batch(0)
    row = measure_step(tr, lambda: tr.step(x, y, timer), job_id="single-ws1", variant="single",
                       world_size=1, rank=0)
    assert row["peak_method"] == "cuda_allocator" and row["device"].startswith("cuda")
    assert row["peak_bytes"] >= row["param_bytes"] + row["grad_bytes"] > 0
    assert row["reserved_bytes"] >= row["peak_bytes"]  # the allocator reserves at least what it hands out


def test_breakdown_gives_each_job_of_a_bucket_sweep_its_own_bars() -> None:
    """Two bucketed jobs at the same world size (a sweep) must not stack on one bar: the bucket
    size joins the label, and each bar's height is that job's own bytes."""
    from dpcore.read.plots.memory import memory_breakdown_figure

    rows = [dict(job_id=f"bucketed-ws2-b{b:g}", variant="bucketed", world_size=2, bucket_mb=b, rank=0,
                 device="cpu", param_bytes=MIB, grad_bytes=MIB, optim_bytes=0, other_bytes=0,
                 held_bytes=2 * MIB, peak_bytes=3 * MIB, peak_method=CPU_METHOD, step_ms=1.0,
                 step_ms_p10=1.0, step_ms_p90=1.0) for b in (1.0, 25.0)]
    import pandas as pd

    fig = memory_breakdown_figure(pd.DataFrame(rows))
    params = next(t for t in fig.data if t.name == "parameters")
    assert list(params.y) == ["bucketed ×2 · 1 MiB", "bucketed ×2 · 25 MiB"]
    assert list(params.x) == [1.0, 1.0]
