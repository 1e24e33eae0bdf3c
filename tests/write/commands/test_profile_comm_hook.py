"""``profile --comm-hook none,fp16,bf16,powersgd``: one ``torch_ddp`` job per DDP comm hook,
through the real CLI on 2 gloo ranks. Known answers: fp16 puts exactly half the plain job's
bytes on the wire; PowerSGD (rank 1) sends 3 collectives per step (the 1-D gradients
uncompressed, then P, then Q) whose bytes are (n + m) per (n, m) weight plus the biases; bf16 is
refused by gloo in torch 2.13, so its job is skipped with the reason; memory.csv counts DDP's
bucket buffers in every job alike, and PowerSGD's error feedback and P/Q besides. The hooks'
own compute is > 0 for fp16 and PowerSGD and 0 for the plain job; the loss after K steps equals
the plain job's for the plain job itself and differs (a little) for fp16."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpcore.read.rundir import load_run

ROOT = Path(__file__).resolve().parents[3]
WIDTH = 64  # mlp: 16 Linear layers of this width (a few ms per step)


def _profile(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCORE_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "dpcore", "profile", "--variants", "torch_ddp",
                           "--model", "mlp", "--width", str(WIDTH), "--out", str(out),
                           "--progress", "none", *args],
                          capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("profiles")
    p = _profile(out, "--world-sizes", "1,2", "--comm-hook", "none,fp16,bf16,powersgd", "--steps", "3",
                 "--warmup", "3", "--no-trace")  # memory.csv samples warm-up step 2: PowerSGD compresses
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return load_run(run_dir)


def test_one_job_per_hook(run) -> None:
    jobs = {j["id"]: j for j in run.meta["jobs"]}
    assert list(jobs) == ["torch_ddp-ws1-b25", "torch_ddp-ws2-b25", "torch_ddp-ws2-b25-fp16",
                          "torch_ddp-ws2-b25-bf16", "torch_ddp-ws2-b25-powersgd"]
    assert [jobs[j].get("comm_hook") for j in jobs] == [None, None, "fp16", "bf16", "powersgd"]
    assert run.meta["config"]["comm_hook"] == "none"  # the plain jobs' hook, as run.json always said
    bf16 = jobs["torch_ddp-ws2-b25-bf16"]
    assert bf16["status"] == "skipped" and "gloo" in bf16["skip_reason"]
    assert all(j["status"] == "complete" for i, j in jobs.items() if i != "torch_ddp-ws2-b25-bf16")


def _per_step(run, job: str):
    c = run.collectives[run.collectives["job_id"] == job]
    return c.groupby(["rank", "step"])["bytes"].agg(["sum", "count"])


def _weights_and_biases() -> tuple[list[tuple[int, int]], int]:
    import torch

    from dpcore.contract.config import TrainConfig
    from dpcore.write.training.models import build_module
    model = build_module(TrainConfig(model="mlp", width=WIDTH), device=torch.device("cpu"))
    return ([tuple(p.shape) for p in model.parameters() if p.dim() == 2],
            sum(p.numel() for p in model.parameters() if p.dim() == 1))


def test_bytes_on_the_wire(run) -> None:
    plain, fp16, psgd = (_per_step(run, j) for j in ("torch_ddp-ws2-b25", "torch_ddp-ws2-b25-fp16",
                                                      "torch_ddp-ws2-b25-powersgd"))
    weights, biases = _weights_and_biases()
    grads = 4 * (sum(n * m for n, m in weights) + biases)
    assert set(plain["sum"]) == {grads} and len(plain) == 2 * 3  # 2 ranks x 3 timed steps
    assert set(fp16["sum"]) == {grads // 2}
    assert set(psgd["sum"]) == {4 * (sum(n + m for n, m in weights) + biases)}
    assert set(psgd["count"]) == {3}


def test_memory_counts_the_buckets_alike_and_powersgd_state(run) -> None:
    m = run.memory.set_index("job_id")["other_bytes"]
    assert m["torch_ddp-ws2-b25-fp16"].tolist() == m["torch_ddp-ws2-b25"].tolist()
    # PowerSGD keeps its error feedback (one copy of the bucket: every gradient) and P and Q
    weights, biases = _weights_and_biases()
    extra = 4 * (sum(n * m for n, m in weights) + biases) + 4 * sum(n + m for n, m in weights)
    psgd, plain = m["torch_ddp-ws2-b25-powersgd"].tolist(), m["torch_ddp-ws2-b25"].tolist()
    assert [a - b for a, b in zip(psgd, plain)] == [extra, extra]


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    for args, text in ((["--comm-hook", "zip"], "unknown comm hook zip; valid choices: none, fp16, bf16, powersgd"),
                       (["--comm-hook", "fp16", "--variants", "bucketed"], "include torch_ddp")):
        p = subprocess.run([sys.executable, "-m", "dpcore", "profile", *args, "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and text in p.stderr, p.stderr


def test_compression_numbers_and_buckets_page(run, capsys, monkeypatch) -> None:
    """The Compression panel's numbers (the analysis the Buckets page draws) are the known
    answers above, and the page draws them without a problem."""
    from dpcore.read import analysis as A
    from tests.integrations.helpers import opens_everywhere

    df = A.compression(run.jobs, A.job_summary(run, None), run.collectives).set_index("hook")
    assert list(df.index) == ["none", "fp16", "bf16", "powersgd"]
    assert df.loc["fp16", "saved_pct"] == 50.0 and df.loc["fp16", "collectives"] == 1
    assert df.loc["powersgd", "saved_pct"] > 90 and df.loc["powersgd", "collectives"] == 3
    assert df.loc["bf16", "status"] == "skipped" and "gloo" in df.loc["bf16", "reason"]
    ddp = A.job_summary(run, None).set_index("job_id")["step_ms"]
    assert df.loc["fp16", "added_ms"] == ddp["torch_ddp-ws2-b25-fp16"] - ddp["torch_ddp-ws2-b25"]
    # Buckets: no bucket sweep (one line says so, no empty chart), then the Compression chart
    opens_everywhere(run.path, capsys, monkeypatch, pages=("Overview", "Buckets"), charts={"Buckets": 1})


def test_powersgd_with_several_buckets_on_gloo_is_skipped_with_the_reason(tmp_path: Path) -> None:
    """mlp-64's gradients (~0.26 MiB) in 0.05 MiB buckets: several buckets, which can hang PowerSGD on
    gloo; the job is skipped with the reason (and the bucket size to give), the others run."""
    p = _profile(tmp_path, "--world-sizes", "2", "--comm-hook", "powersgd", "--bucket-mb", "0.05",
                 "--steps", "2", "--warmup", "1", "--no-trace", "--calibration-steps", "0")
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    jobs = {j["id"]: j for j in load_run(run_dir).meta["jobs"]}
    psgd = jobs["torch_ddp-ws2-b0.05-powersgd"]
    assert psgd["status"] == "skipped" and "several DDP buckets" in psgd["skip_reason"]
    assert "--bucket-mb >=" in psgd["skip_reason"]
    assert jobs["torch_ddp-ws2-b0.05"]["status"] == "complete"


def test_hook_compute_time_is_recorded_per_job(run) -> None:
    """run.json: the compressing hooks spend compute of their own (fp16's casts, PowerSGD's
    matmuls and orthogonalization) apart from their all-reduces; the plain job's hook only
    averages and sends (0); the 1-rank job has no DDP comm hook at all (no entry)."""
    jobs = {j["id"]: j for j in run.meta["jobs"]}
    plain = jobs["torch_ddp-ws2-b25"]
    assert plain["hook_compress_ms"] == 0.0 and plain["hook_decompress_ms"] == 0.0
    for hook in ("fp16", "powersgd"):
        j = jobs[f"torch_ddp-ws2-b25-{hook}"]
        assert j["hook_compress_ms"] > 0 and j["hook_decompress_ms"] > 0, j
    assert "hook_compress_ms" not in jobs["torch_ddp-ws1-b25"]
    assert "hook_compress_ms" not in jobs["torch_ddp-ws2-b25-bf16"]  # skipped: never ran


def test_loss_after_k_steps_against_the_plain_job(run) -> None:
    """Same seed and data in every job: the plain job's difference from itself is exactly 0,
    fp16's rounding moves the loss a little but not nothing, PowerSGD's stays small. K = 3
    warm-up + 3 timed steps - 1 optimizer steps before the last timed step's forward."""
    from dpcore.read import analysis as A

    jobs = {j["id"]: j for j in run.meta["jobs"]}
    assert {jobs[j]["loss_after_steps"] for j in jobs if j != "torch_ddp-ws2-b25-bf16"} == {5}
    df = A.compression(run.jobs, A.job_summary(run, None), run.collectives).set_index("hook")
    assert df.loc["none", "loss_diff"] == 0.0 and df.loc["none", "compress_ms"] == 0.0
    assert df.loc["none", "loss"] == jobs["torch_ddp-ws2-b25"]["loss"]
    assert 0 < abs(df.loc["fp16", "loss_diff"]) < 1e-3
    assert abs(df.loc["powersgd", "loss_diff"]) < 1e-3
    assert df.loc["fp16", "compress_ms"] == jobs["torch_ddp-ws2-b25-fp16"]["hook_compress_ms"]


def test_summarize_prints_the_compression_lines(run) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCORE_")}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run([sys.executable, "-m", "dpcore", "summarize", str(run.path)], capture_output=True,
                       text=True, timeout=120, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = {ln.split()[1]: ln for ln in p.stdout.splitlines() if ln.startswith("  ") and "torch_ddp-ws2" in ln}
    assert "(50.0% saved), 1 collectives/step" in lines["torch_ddp-ws2-b25-fp16:"]
    assert "hook compute 0.000 + 0.000 ms" in lines["torch_ddp-ws2-b25:"]
    assert "(diff +0)" in lines["torch_ddp-ws2-b25:"] and "loss after 5 steps" in lines["torch_ddp-ws2-b25:"]
    assert "skipped - " in lines["torch_ddp-ws2-b25-bf16:"]


def test_hook_clock_takes_the_collectives_out(monkeypatch) -> None:
    """HookClock's arithmetic on a clock the test moves by hand: a hook call of 60 ns that spends
    40 ns in a collective's wait and runs a 5 ns callback inline computes 15 ns; the callback
    counts as decompressing; a region in another step is kept apart."""
    from dpcore.write.capture import collective_tap as ct

    now = [0]
    monkeypatch.setattr(ct.time, "perf_counter_ns", lambda: now[0])
    step = [0]
    clock = ct.HookClock(lambda: step[0])
    with clock.timed(ct.COMPRESS):
        now[0] = 10
        with clock.waiting():
            now[0] = 50
        clock.callback(lambda f: now.__setitem__(0, now[0] + 5))(None)
        now[0] = 60
    step[0] = 1
    with clock.timed(ct.DECOMPRESS):
        now[0] = 67
    assert clock.per_step == {0: [15, 5], 1: [0, 7]}
    assert clock.ms([0, 1, 2]) == [(0, 15e-6, 5e-6), (1, 0.0, 7e-6), (2, 0.0, 0.0)]
