"""scripts/gpu_check.py, the acceptance test of a lent GPU, exercised on the CPU.

Its judgements are pure functions over a run folder (run.json, collectives.csv): they are
tested here on synthetic runs with known verdicts. Its ``--device cpu`` dry mode runs the same
checks on gloo (slow: it starts ranks): it must pass here, write at most 8 files, and print one
``FAIL:`` line per check that did not pass.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


gc = _load()


def _run(tmp: Path, jobs: list[dict[str, Any]], backend: str = "gloo", device: str = "cuda",
         status: str = "complete", dtype: str = "bf16") -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "run.json").write_text(json.dumps({
        "status": status, "config": {"dtype": dtype},
        "environment": {"backend": backend, "device": device}, "jobs": jobs}))
    return tmp


def _job(variant: str, ws: int, status: str = "complete", **extra: Any) -> dict[str, Any]:
    return {"id": f"{variant}-ws{ws}", "variant": variant, "world_size": ws, "status": status, **extra}


def test_a_clean_shared_gpu_run_passes(tmp_path: Path) -> None:
    jobs = [_job("fsdp", 2), _job("torch_fsdp", 2),
            _job("ring", 2, "skipped", skip_reason="ring needs send/recv"),
            _job("data_parallel", 2, "skipped", skip_reason="needs 2 or more GPUs")]
    run = _run(tmp_path, jobs)
    assert gc.run_failures(run, ["fsdp", "torch_fsdp", "ring", "data_parallel"], [2], gpus=1) == []


def test_each_wrong_thing_is_one_failure(tmp_path: Path) -> None:
    jobs = [_job("fsdp", 2, "skipped", skip_reason="fsdp needs all_gather_into_tensor"),
            _job("bucketed", 2, "failed", error="Traceback ...\nRuntimeError: boom"),
            _job("ring", 1, "skipped", skip_reason="?")]
    run = _run(tmp_path, jobs, status="failed", dtype="fp32")
    bad = gc.run_failures(run, ["fsdp", "bucketed", "torch_fsdp", "ring"], [1, 2], gpus=1, dtype="bf16")
    assert bad[0] == "run status 'failed'"
    assert bad[1] == "dtype 'fp32', not bf16"
    # fsdp may not be skipped on gloo with CUDA tensors any more; ring only at world size > 1
    assert "fsdp-ws2 skipped: fsdp needs all_gather_into_tensor" in bad
    assert "bucketed-ws2 failed: RuntimeError: boom" in bad
    assert "ring-ws1 skipped: ?" in bad
    assert "no torch_fsdp job at world size 1" in bad and "no torch_fsdp job at world size 2" in bad
    assert "no fsdp job at world size 1" in bad and "no ring job at world size 2" in bad
    assert "no bucketed job at world size 1" in bad
    assert len(bad) == 10
    assert gc.run_failures(tmp_path / "absent", ["fsdp"], [1], gpus=1) == \
        [f"no run.json in {tmp_path / 'absent'}"]


def test_one_process_variants_need_one_job_at_any_world_size(tmp_path: Path) -> None:
    """profile runs single at world size 1 and manual at the largest only."""
    run = _run(tmp_path, [_job("single", 1), _job("manual", 4), _job("fsdp", 2), _job("fsdp", 4)])
    assert gc.run_failures(run, ["single", "manual", "fsdp"], [2, 4], gpus=1) == []
    assert gc.run_failures(run, ["single", "data_parallel"], [2, 4], gpus=1) == ["no data_parallel job"]


def test_allowed_skips_follow_the_capability_table() -> None:
    assert gc.allowed_skip("ring", 2, "gloo", "cuda", 1)
    assert not gc.allowed_skip("ring", 2, "gloo", "cpu", 1)
    assert not gc.allowed_skip("ring", 2, "nccl", "cuda", 2)
    assert not gc.allowed_skip("fsdp", 2, "gloo", "cuda", 1)
    assert gc.allowed_skip("data_parallel", 1, "nccl", "cuda", 1)
    assert not gc.allowed_skip("data_parallel", 2, "gloo", "cuda", 2)


def _collectives(path: Path, rows: list[tuple[str, int, int, str, int]]) -> Path:
    lines = ["job_id,rank,step,seq,op,algo,bytes,t_launch_ns,t_start_ns,t_end_ns,bucket"]
    lines += [f"{job},{rank},{step},{i},{op},native,{nbytes},0,,1,0"
              for i, (job, rank, step, op, nbytes) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_all_gather_bytes_per_step_and_the_half_rule(tmp_path: Path) -> None:
    fp32 = _collectives(tmp_path / "a.csv", [
        ("fsdp-ws2", 0, 0, "all_gather", 100), ("fsdp-ws2", 0, 0, "all_gather", 300),
        ("fsdp-ws2", 0, 1, "all_gather", 400), ("fsdp-ws2", 1, 0, "all_gather", 999),
        ("fsdp-ws2", 0, 0, "reduce_scatter", 999), ("torch_fsdp-ws2", 0, 0, "all_gather", 64)])
    per = gc.allgather_bytes_per_step(fp32)
    assert per == {"fsdp-ws2": 400.0, "torch_fsdp-ws2": 64.0}  # rank 0's, mean over its steps
    assert gc.half_bytes_failures(per, {"fsdp-ws2": 200.0, "torch_fsdp-ws2": 32.0},
                                  ["fsdp-ws2", "torch_fsdp-ws2"]) == []
    bad = gc.half_bytes_failures(per, {"fsdp-ws2": 400.0}, ["fsdp-ws2", "torch_fsdp-ws2"])
    assert bad[0].startswith("fsdp-ws2: bf16 all-gathers") and "(ratio 1.000, want 0.5)" in bad[0]
    assert bad[1] == "torch_fsdp-ws2: no all-gathers (fp32 64.0, bf16 None)"


def test_unknown_check_is_one_line() -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--only", "nope"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("gpu_check: unknown check nope; valid: profile-gloo-shared,")
    assert len(p.stderr.splitlines()) == 1


@pytest.mark.slow
def test_dry_run_on_cpu_passes_and_writes_little(tmp_path: Path) -> None:
    """The same checks on gloo and the CPU; every dpcore command in it runs where streamlit and
    plotly cannot be imported, so these paths are shown not to import them."""
    out = tmp_path / "out"
    only = "host,gloo-collectives,fsdp-allgather-bytes,calibration-clock,trace-handler,torchrun-profile,backward-end"
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--only", only, "--out", str(out),
                        "--workers", "2", "--budget-s", "900"], capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "FAIL:" not in p.stdout
    assert "gpu_check on cpu: 7 of 7 checks passed" in p.stdout
    assert "backward-end on cpu: [bwd_ms, sync_ms] per step" in p.stdout
    assert "all-gathered MiB per step (rank 0): fsdp-ws2 fp32" in p.stdout
    files = sorted(f.name for f in out.iterdir())
    assert files == ["checks.json", "gpu_check.txt", "logs.tar.gz", "measured.jsonl", "runs.tar.gz"]
    assert json.loads((out / "checks.json").read_text())["failures"] == {n: [] for n in only.split(",")}
    lines = gc.read_lines(out / "measured.jsonl")
    assert sorted(x["check"] for x in lines if "check" in x) == sorted(only.split(","))
    assert gc.probe_outcomes(out / "measured.jsonl", "collectives") == {k: "ok" for k in gc.probe_keys("collectives")}


@pytest.mark.slow
def test_a_check_not_run_is_a_fail_line(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--only", "host,powersgd",
                        "--budget-s", "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    fails = [line for line in p.stdout.splitlines() if line.startswith("FAIL:")]
    assert fails == ["FAIL: host: not run: the 1 s budget was spent",
                     "FAIL: powersgd: not run: the 1 s budget was spent"]


# -- a command past its time, the probes' outcomes, where the files go -----------------------------

_SPAWNS_A_SLEEPER = ("import subprocess, sys, time\n"
                     "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                     "print('grandchild', p.pid, flush=True)\n"
                     "time.sleep(60)\n")


@pytest.mark.slow
def test_a_command_past_its_time_ends_with_everything_it_started() -> None:
    """A profile that runs past its time must not leave its ranks running on the GPU through
    the next checks: the whole session ends (subprocess.run's timeout killed the child only)."""
    from dpcore.contract.runformat import pid_alive

    t0 = time.monotonic()
    rc, out = gc.run_bounded([sys.executable, "-c", _SPAWNS_A_SLEEPER], 3.0)
    took = time.monotonic() - t0
    assert rc == 124 and out.rstrip().endswith("[gpu_check: killed after 3 s]"), out
    pid = int(out.split("grandchild", 1)[1].split()[0])
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid), f"the grandchild {pid} outlived its command"
    assert took < 3.0 + gc.TERM_GRACE_S + 5, took  # SIGTERM ends it; no wait for the 60 s sleep


@pytest.mark.slow
def test_a_command_ignoring_sigterm_is_killed_and_its_output_kept() -> None:
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('started', flush=True)\ntime.sleep(60)\n")
    rc, out = gc.run_bounded([sys.executable, "-c", code], 2.0)
    assert rc == 124 and out.startswith("started\n") and "killed after 2 s" in out, out
    assert gc.run_bounded([sys.executable, "-c", "print('hi')"], 30.0) == (0, "hi\n")


def test_a_probes_outcome_is_every_ranks() -> None:
    """A send that returned on rank 0 says nothing about what rank 1 received: the collective is
    ok only where every rank got the known answer (rank 0's alone made a CUDA send/recv that
    delivers garbage read as working, a false FAIL of the capability table)."""
    got = gc.merge_ranks({0: {"send_recv[float32]": "ok", "all_reduce[float32]": "ok"},
                          1: {"send_recv[float32]": "wrong values", "all_reduce[float32]": "ok"}})
    assert got == {"send_recv[float32]": "rank 1: wrong values", "all_reduce[float32]": "ok"}
    got = gc.merge_ranks({0: {"x": "RuntimeError: boom"}, 1: {"x": "wrong values"}})
    assert got == {"x": "rank 0: RuntimeError: boom"}
    assert gc.merge_ranks({1: {"x": "ok"}}) == {"x": "rank 0: no result"}
    assert gc.merge_ranks({}) == {}
    # a rank that crashed after x: y, which it never reported, and z, which nobody reached
    got = gc.merge_ranks({0: {"x": "ok", "y": "ok"}, 1: {"x": "ok"}}, world=2, keys=["x", "y", "z"])
    assert got == {"x": "ok", "y": "rank 1: no result", "z": "rank 0: no result"}


@pytest.mark.slow
def test_a_rank_crash_keeps_what_was_measured_before_it(tmp_path: Path) -> None:
    """Rank 1 of the collectives probe aborts as it reaches all_gather (the crash a CUDA tensor
    can give gloo): every outcome measured before it is in measured.jsonl under --out, as each
    rank learnt it, and in the check's verdict; the crashed collective fails, naming the
    crash. The old probe kept its outcomes in memory until the end, so a crash lost all of them."""
    out = tmp_path / "out"
    env = {**os.environ, gc.CRASH_ENV: "1:all_gather[float32]"}
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--only", "gloo-collectives",
                        "--out", str(out), "--budget-s", "300"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-2000:]
    lines = gc.read_lines(out / "measured.jsonl")
    before = ["broadcast[float32]", "all_reduce[float32]", "reduce[float32]"]
    for rank in (0, 1):
        mine = {x["key"]: x["outcome"] for x in lines if x.get("probe") == "collectives" and x["rank"] == rank}
        assert all(mine.get(k) == "ok" for k in before), (rank, mine)
    assert not any(x.get("rank") == 1 and x.get("key") == "all_gather[float32]" for x in lines)
    (verdict,) = [x for x in lines if x.get("check") == "gloo-collectives"]
    assert not verdict["ok"]
    why = "\n".join(verdict["failures"])
    # the crashed collective fails (rank 0 may have met the crash first, or been ended by it)
    assert "all_gather[float32]: rank " in why and "signal SIGABRT" in why, why
    assert not any(k in why for k in before), why  # measured before the crash: ok, not lost
    assert json.loads((out / "checks.json").read_text())["failures"]["gloo-collectives"] == verdict["failures"]


@pytest.mark.slow
def test_a_relative_out_is_where_the_shell_script_was_called(tmp_path: Path) -> None:
    """On a lent machine OUT is where results come back from; a relative one was resolved
    against the repository root the script cd'ed into."""
    env = {**os.environ, "OUT": "rel"}
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--only", "host",
                        "--budget-s", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "FAIL: host: not run: the 1 s budget was spent" in p.stdout, p.stdout + p.stderr
    assert sorted(f.name for f in (tmp_path / "rel").iterdir()) == [
        "checks.json", "gpu_check.txt", "logs.tar.gz", "measured.jsonl", "runs.tar.gz"]
    assert not (ROOT / "rel").exists()


@pytest.mark.slow
def test_an_unwritable_out_is_one_line_before_any_check(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--only", "host",
                        "--out", str(tmp_path / "file" / "out")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", p.stdout
    assert p.stderr.startswith("gpu_check: cannot write the results under --out ") and len(p.stderr.splitlines()) == 1


def _cal_job(variant: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {**_job(variant, 2), "whatif_calibration": {"data": [{"bucket_mb": 25.0, "steps": steps}]}}


def _cal_step(launch: list[float], end: list[float | None], b0: float = 100.0, b1: float = 130.0) -> dict[str, Any]:
    return {"rank": 1, "step": 1_000_000, "bwd_start_ms": b0, "bwd_end_ms": b1, "bytes": [4] * len(launch),
            "launch_ms": launch, "end_ms": end}


def test_calibration_on_one_scale(tmp_path: Path) -> None:
    """A launch lies after backward began and no later than its own end (within CAL_TOL_MS: two
    anchors); what a launch on the host clock looks like on a GPU job is caught."""
    ok = _run(tmp_path / "ok", [_cal_job("torch_ddp", [_cal_step([100.5, 110.0], [109.0, 131.0]),
                                                       _cal_step([99.5], [120.0])])])
    assert gc.calibration_failures(ok, ["torch_ddp"]) == []
    host = _run(tmp_path / "host", [_cal_job("torch_ddp", [_cal_step([97.0, 98.0], [109.0, 131.0])]),
                                    _cal_job("bucketed", [_cal_step([101.0], [None])])])
    assert gc.calibration_failures(host, ["torch_ddp", "bucketed"]) == [
        "torch_ddp-ws2: 2 of 2 calibration all-reduces off the scale of backward's edges, e.g. rank 1 step "
        "1000000 all-reduce 0: launched -3.000 ms after backward began, ended +12.000 ms after the launch "
        "(backward 30.000 ms)",
        "bucketed-ws2: 1 of 1 calibration all-reduces off the scale of backward's edges, e.g. rank 1 step "
        "1000000 all-reduce 0: no end"]
    late = _run(tmp_path / "late", [_cal_job("torch_ddp", [_cal_step([120.0], [110.0])])])
    (why,) = gc.calibration_failures(late, ["torch_ddp"])
    assert "launched +20.000 ms after backward began, ended -10.000 ms" in why
    none = _run(tmp_path / "none", [{**_job("torch_ddp", 2), "whatif_calibration": {"error": "RuntimeError: x"}}])
    assert gc.calibration_failures(none, ["torch_ddp", "bucketed"]) == [
        "torch_ddp-ws2: no calibration (RuntimeError: x)", "no complete bucketed job"]
