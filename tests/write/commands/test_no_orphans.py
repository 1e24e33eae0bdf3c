"""No process outlives a command: read from the process table (/proc) the moment the command's
process has ended, after it returned and after ``kill -9``.

Every descendant the command had while it ran (ranks, the multiprocessing forkserver and
resource tracker, trace-parsing workers) is recorded every 20 ms. After a normal return the
command has waited for each of them, so none may be alive at that moment: no grace period.
After ``kill -9`` nothing in the killed process runs; each helper watches it and ends by
itself, and the test measures how long the last one took."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import proctable
from tests.synthetic import write_gpu_trace_dir

ROOT = Path(__file__).resolve().parents[3]
MODEL = ["--model", "mlp", "--width", "64", "--batch-size", "8"]
#: after kill -9, how long the helpers may take to notice and end (before: the forkserver 1.9 s,
#: trace workers never, 120 s+). Their end is event-driven (a pidfd); this bound only covers a
#: loaded machine's scheduling of a few os._exit calls.
KILLED_END_S = 10.0


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCORE_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _dpcore(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dpcore", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)


def _run_and_check(*args: str, helpers: int) -> None:
    proc = _dpcore(*args)
    watch = proctable.FamilyWatch(proc.pid)
    _, err = proc.communicate(timeout=400)
    family = watch.stop()
    assert proc.returncode == 0, err[-2000:]
    left = proctable.alive(family)  # at once: the command waited for its helpers
    assert not left, (args[0], left, family)
    assert len(family) >= helpers, (args[0], family)  # the watch did see the helpers


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    """Two rank traces big enough that parsing them takes each worker a few seconds."""
    d = tmp_path_factory.mktemp("traces")
    write_gpu_trace_dir(d, world_size=2, steps=4, kernels_per_step=10000)
    return d


def test_profile_leaves_no_process(tmp_path) -> None:
    # forkserver + resource tracker + 2 ranks
    _run_and_check("profile", "--variants", "flat", "--world-sizes", "2", *MODEL, "--steps", "3",
                   "--warmup", "1", "--profile-steps", "1", "--progress", "none", "--out", str(tmp_path),
                   helpers=4)


def test_verify_leaves_no_process() -> None:
    _run_and_check("verify", *MODEL, "--steps", "2", "--world-size", "2", "--variants", "flat", helpers=4)


def test_allreduce_leaves_no_process(tmp_path) -> None:
    _run_and_check("allreduce", "--algos", "native", "--world-sizes", "2", "--sizes", "1KB",
                   "--repeats", "2", "--warmup", "1", "--progress", "none", "--out", str(tmp_path), helpers=4)


def test_import_leaves_no_process(traces, tmp_path) -> None:
    _run_and_check("import", str(traces), "--workers", "2", "--no-cache", "--out", str(tmp_path), helpers=2)


def _kill_9_when(proc: subprocess.Popen, enough: int) -> tuple[set[int], float]:
    """kill -9 ``proc`` once it has ``enough`` descendants; (its family, seconds until the last
    of them ended)."""
    deadline = time.monotonic() + 300
    family: set[int] = set()
    while len(proctable.alive(family)) < enough:
        assert proc.poll() is None, f"ended before it had {enough} helpers: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline
        family |= proctable.descendants(proc.pid)
        time.sleep(0.05)
    time.sleep(0.5)  # let the helpers get going
    family |= proctable.descendants(proc.pid)
    proc.kill()
    proc.wait(timeout=30)
    left, waited = proctable.wait_gone(family, KILLED_END_S)
    assert not left, (left, family)
    return family, waited


def test_kill_9_of_profile_leaves_no_process(tmp_path) -> None:
    proc = _dpcore("profile", "--variants", "flat", "--world-sizes", "2", *MODEL, "--steps", "100000",
                   "--warmup", "1", "--no-trace", "--progress", "none", "--out", str(tmp_path))
    family, waited = _kill_9_when(proc, enough=4)  # forkserver, tracker, 2 ranks
    print(f"profile: {len(family)} helpers ended {waited:.2f} s after kill -9")


def test_kill_9_of_analyze_leaves_no_worker(traces) -> None:
    proc = _dpcore("analyze", str(traces), "--workers", "2", "--no-cache")
    family, waited = _kill_9_when(proc, enough=2)  # two parsing workers
    print(f"analyze: {len(family)} workers ended {waited:.2f} s after kill -9")
