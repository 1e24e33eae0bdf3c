"""A run whose ranks are pinned to CPUs another dpcore run's ranks are pinned to says so
(issue 25, item 8): run.json's environment names the other run's pid and the shared CPUs, and
its jobs are oversubscribed. The other run is a real live process holding a claim; a claim
whose process is gone is ignored and removed. Real ``profile`` CLI runs."""
from __future__ import annotations

import json
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
    assert cpu_claims.shared_with([0, 1]) == {}
    assert not (folder / f"{dead}.json").exists()
