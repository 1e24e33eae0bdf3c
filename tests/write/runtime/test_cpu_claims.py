"""A run whose ranks are pinned to CPUs another dpcore run's ranks are pinned to says so
(issue 25, item 8): run.json's environment names the other run's pid and the shared CPUs, and
its jobs are oversubscribed. The other run is a real live process holding a claim; a claim
whose process is gone is ignored and removed. Real ``profile`` CLI runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _profile(tmp_path: Path, run_id: str, lock_dir: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "dpcore", "profile", "--variants", "single", "--width", "16", "--steps", "2",
         "--warmup", "0", "--no-trace", "--progress", "none", "--run-id", run_id, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "DPCORE_LOCK_DIR": str(lock_dir)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((tmp_path / run_id / "run.json").read_text())


def test_cpus_pinned_by_another_run_are_detected(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom dpcore.write.runtime import cpu_claims\n"
         "import os\ncpu_claims.claim(os.sched_getaffinity(0)); print('claimed', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "DPCORE_LOCK_DIR": str(lock_dir)})
    try:
        assert other.stdout.readline().strip() == "claimed"
        meta = _profile(tmp_path, "beside", lock_dir)
    finally:
        other.stdin.close()
        other.wait(timeout=60)
    env = meta["environment"]
    if env["pinning"] != "per-rank":  # pragma: no cover - a container that forbids affinity
        return
    pinned = meta["jobs"][0]["cpus_per_rank"]["0"]  # the other run claimed every usable CPU
    assert pinned and env["cpus_shared_with"] == {str(other.pid): sorted(pinned)}
    assert env["oversubscribed"] is True and meta["jobs"][0]["oversubscribed"] is True
    # the other run has ended: its claim (removed at its exit) no longer counts
    alone = _profile(tmp_path, "alone", lock_dir)
    assert "cpus_shared_with" not in alone["environment"]
    assert alone["jobs"][0]["oversubscribed"] is False
    assert list((lock_dir / "dpcore-cpu-claims").glob("*.json")) == []  # ours removed at the end


def test_a_dead_runs_claim_is_ignored_and_removed(tmp_path: Path, monkeypatch) -> None:
    from dpcore.write.runtime import cpu_claims
    monkeypatch.setenv("DPCORE_LOCK_DIR", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    folder = cpu_claims.claim_dir()
    folder.mkdir(parents=True)
    (folder / f"{dead}.json").write_text(json.dumps({"pid": int(dead), "cpus": [0, 1]}))
    # a note a later run left to a run that had ended meanwhile, and one left to this process
    (folder / f"{dead}.seen-by-1").write_text(json.dumps({"pid": 1, "cpus": [0]}))
    (folder / f"{os.getpid()}.seen-by-1").write_text(json.dumps({"pid": 1, "cpus": [0]}))
    assert cpu_claims.shared_with([0, 1]) == {}
    assert not (folder / f"{dead}.json").exists() and not (folder / f"{dead}.seen-by-1").exists()
    assert cpu_claims.told() == {1: [0]} and list(folder.iterdir()) == []  # read once, then gone


def test_a_run_that_starts_and_ends_within_a_job_flags_that_job(tmp_path: Path, monkeypatch) -> None:
    """Run A's job runs while run B starts (B finds A's claim) and ends: A's job, and A's
    environment, say oversubscribed with B's pid; A's next job, run alone, does not. B is a
    real process opening a real LocalWorld; A's ranks are replaced by B's whole life."""
    from dpcore.write.capture.run_lifecycle import RunLife
    from dpcore.write.capture.run_writer import RunWriter
    from dpcore.write.runtime import world as world_mod

    monkeypatch.setenv("DPCORE_LOCK_DIR", str(tmp_path / "locks"))
    a = world_mod.LocalWorld("gloo", [1], ranks_on_host=1, device="cpu")
    if not a.pin:  # pragma: no cover - a container that forbids affinity: nothing is claimed
        return
    others: list[int] = []

    def b_runs_within_the_job(*args, **kwargs) -> list:
        b = subprocess.run(
            [sys.executable, "-c", "import os\nfrom dpcore.write.runtime.world import LocalWorld\n"
             "w = LocalWorld('gloo', [1], ranks_on_host=1, device='cpu')\nprint(os.getpid(), w.shared)"],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "DPCORE_LOCK_DIR": str(tmp_path / "locks")})
        pid, seen = b.stdout.split(" ", 1)
        assert str(os.getpid()) in seen, b.stderr  # B saw A
        others.append(int(pid))
        return [{}]

    monkeypatch.setattr(world_mod, "launch", b_runs_within_the_job)
    life = RunLife(a, lambda: RunWriter(tmp_path / "runs", command=["t"], config={},
                                        environment=a.environment(), run_id="a"))
    life.add_job({"id": "j1", "status": "pending", "oversubscribed": False})
    life.add_job({"id": "j2", "status": "pending", "oversubscribed": False})
    j1 = life.run_job("j1", 1, lambda: {"x": a.run(None, 1, ())})
    monkeypatch.setattr(world_mod, "launch", lambda *args, **kwargs: [{}])
    j2 = life.run_job("j2", 1, lambda: {"x": a.run(None, 1, ())})
    a.finish("complete")
    meta = json.loads((tmp_path / "runs" / "a" / "run.json").read_text())
    (pid,) = others
    assert j1["oversubscribed"] is True and "oversubscribed" not in j2
    jobs = {j["id"]: j for j in meta["jobs"]}
    assert jobs["j1"]["oversubscribed"] is True and jobs["j2"]["oversubscribed"] is False
    assert meta["environment"]["oversubscribed"] is True
    assert list(meta["environment"]["cpus_shared_with"]) == [str(pid)]
    assert list((tmp_path / "locks" / "dpcore-cpu-claims").iterdir()) == []  # claims and notes gone
