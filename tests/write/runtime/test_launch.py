"""The launcher on real gloo process groups: results, failures, hangs, orphans, clocks."""
from __future__ import annotations

import os
import time

import pytest

from dpcore.contract.errors import JobFailed, UsageError
from dpcore.write.runtime.launch import launch, resolve_backend
from dpcore.write.runtime.resources import physical_cores, threads_per_rank
from tests import workers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); check its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("n", [1, 2, 3])
def test_results_come_back_by_rank(n):
    out = launch(workers.sum_ranks, n, args=(2.0,), timeout_s=60)
    expected = 2.0 * n * (n + 1) / 2
    assert [o["rank"] for o in out] == list(range(n))
    assert all(o["value"] == expected and o["ws"] == n for o in out)
    assert all(o["threads"] == threads_per_rank(n) for o in out)
    assert len({o["pid"] for o in out}) == n


def test_failing_rank_is_named_and_job_ends_fast():
    with pytest.raises(JobFailed) as info:
        launch(workers.raise_on_rank1, 2, timeout_s=60)
    # It ended on the failure, not at the 60 s timeout: an error that arrives after the deadline
    # is reported as the timeout (rank -1), so rank 1 named with its exception is the proof (an
    # order, where a wall-clock bound would also count two ranks starting on a loaded machine).
    assert info.value.rank == 1
    assert "ValueError: boom from the test" in info.value.message


def test_hang_becomes_timeout_error_and_no_orphans(tmp_path):
    before = {p.pid for p in __import__("multiprocessing").active_children()}
    with pytest.raises(JobFailed) as info:  # it ends (never would fail at pytest's timeout) ...
        launch(workers.hang_rank0, 2, timeout_s=3)
    assert info.value.rank == -1 and "timed out after 3 s" in info.value.message  # ... at its timeout
    time.sleep(0.5)
    after = {p.pid for p in __import__("multiprocessing").active_children() if p.is_alive()}
    assert after <= before


def test_hang_is_the_launchers_timeout_even_when_the_launcher_is_late(monkeypatch):
    """The order that makes the hang-vs-error race impossible: the launcher's deadline starts
    before any rank, so a rank's own collective timeout (same length, started later) always
    lands after it. Here the launcher thread is held 2 s after starting the last rank, as a
    loaded machine may do; with the deadline counted from after the starts, rank 1's gloo
    timeout (3 s after its barrier began) arrived first and was reported as rank 1's error."""
    import dpcore.write.runtime.launch as launch_mod

    proc_cls = launch_mod._mp_context().Process
    real_start = proc_cls.start

    def late_start(self):
        real_start(self)
        if self.name.endswith("rank1"):
            time.sleep(2.0)  # the launcher descheduled after its last start

    monkeypatch.setattr(proc_cls, "start", late_start)
    with pytest.raises(JobFailed) as info:
        launch(workers.hang_rank0, 2, timeout_s=3)
    assert info.value.rank == -1, info.value.message
    assert "timed out after 3 s" in info.value.message


def test_rank_dying_without_exception_is_reported():
    with pytest.raises(JobFailed) as info:
        launch(workers.exit_hard, 2, timeout_s=30)
    assert info.value.rank == 1 and "exited with code 7" in info.value.message


def test_clock_offsets_on_one_host_are_zero_by_construction():
    # spawned ranks share this host's CLOCK_MONOTONIC: nothing to measure, no error
    assert launch(workers.clock_offset, 2, timeout_s=60) == [(0, 0), (0, 0)]


def test_progress_events_reach_the_parent():
    seen = []
    launch(workers.report_progress, 2, timeout_s=60, on_progress=seen.append)
    assert seen == [{"done": 1}, {"done": 2}, {"done": 3}]  # rank 0's only


def test_two_launches_at_once_do_not_collide():
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(launch, workers.sum_ranks, 2, args=(1.0,), timeout_s=60) for _ in range(2)]
        assert [f.result()[0]["value"] for f in futs] == [3.0, 3.0]


def test_two_forkserver_starts_at_once_leave_no_launcher_variable(monkeypatch):
    """Two threads starting the forkserver together: the launcher's variable is gone after both.
    Unlocked, the second saved the first's value as the one to restore and left it set, and a
    later ``python -m dpcore`` child of this process took itself for the forkserver (a fresh-clone
    CI run: verify's exit status 2 came back as 0, after this file's two launches at once)."""
    import threading
    from multiprocessing import forkserver

    from dpcore.contract.procs import LAUNCHER_ENV
    from dpcore.write.runtime import launch as launch_mod
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    inside = threading.Event()

    def slow_start() -> None:  # a forkserver that takes a while to start, as torch's preload does
        inside.set()
        time.sleep(0.3)

    monkeypatch.setattr(forkserver, "ensure_running", slow_start)
    monkeypatch.setattr(launch_mod, "_PRELOAD", list(launch_mod.BASE_PRELOAD))  # nothing new to set
    first = threading.Thread(target=launch_mod._mp_context)
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=launch_mod._mp_context)
    second.start()  # enters while the first start still holds the variable
    first.join(10)
    second.join(10)
    assert LAUNCHER_ENV not in os.environ


def test_a_command_whose_parent_looks_like_its_launcher_keeps_its_exit_status(tmp_path):
    """A ``python -m dpcore`` started while its parent named itself the launcher (the variable a
    forkserver start sets) is no forkserver: bad input still exits 2, not 0."""
    import subprocess
    import sys

    from dpcore.contract.procs import LAUNCHER_ENV
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {**os.environ, "PYTHONPATH": root, LAUNCHER_ENV: str(os.getpid())}
    proc = subprocess.run([sys.executable, "-m", "dpcore", "verify", "--model", "nosuchmod:build"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --model nosuchmod:build: no module named 'nosuchmod'")


def test_bad_backend_and_world_size():
    with pytest.raises(UsageError, match="valid choices: auto, gloo, nccl"):
        resolve_backend("mpi", 2)
    with pytest.raises(UsageError, match="nccl"):
        resolve_backend("nccl", 2)  # no GPUs here (skipped meaningfully on GPU hosts below)
    with pytest.raises(UsageError, match=">= 1"):
        launch(workers.sum_ranks, 0)


def test_threads_per_rank_divides_physical_cores():
    cores = physical_cores()
    assert threads_per_rank(1) == cores
    assert threads_per_rank(cores * 4) == 1


def test_interrupt_between_rank_starts_reraises_and_reaps(monkeypatch):
    """Ctrl-C/SIGTERM (KeyboardInterrupt) right after the first rank started, before the
    second: the moment issue 4 describes. launch must re-raise the interrupt (not an
    AssertionError), reap the started rank and never join the unstarted ones."""
    import multiprocessing

    import dpcore.write.runtime.launch as launch_mod

    proc_cls = launch_mod._mp_context().Process
    real_start, real_join = proc_cls.start, proc_cls.join
    starts, joined_unstarted = [], []

    def start(self):
        if starts:
            raise KeyboardInterrupt
        real_start(self)
        starts.append(self.pid)

    def join(self, timeout=None):
        if self.pid is None:
            joined_unstarted.append(self.name)
        real_join(self, timeout)

    monkeypatch.setattr(proc_cls, "start", start)
    monkeypatch.setattr(proc_cls, "join", join)
    with pytest.raises(KeyboardInterrupt):
        launch(workers.sum_ranks, 3, args=(1.0,), timeout_s=30)
    assert len(starts) == 1
    assert joined_unstarted == []  # never joined a rank that was never started
    assert not _alive(starts[0])  # the one started rank was reaped
    assert starts[0] not in {p.pid for p in multiprocessing.active_children()}


def test_killed_rank_is_blamed_with_its_signal_not_the_peer():
    with pytest.raises(JobFailed) as info:
        launch(workers.sigkill_rank1, 2, timeout_s=30)
    assert info.value.rank == 1, info.value.message
    assert "SIGKILL" in info.value.message
