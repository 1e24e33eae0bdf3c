"""The hang lab end to end: `profile --inject-hang` on real gloo ranks is caught by the watchdog,
named (rank and collective), leaves no process behind, and the run's other jobs complete;
live.csv grows while the run runs.

Why the timing here cannot flake: the injected rank sleeps forever (or skips an all-reduce, so
the ranks wait in different collectives forever), so the hang is structural; --hang-timeout 4 s
only decides how soon it is declared, and a loaded machine that pauses a healthy step for 4 s
cannot happen before the hang (the hang is injected at a fixed step and the job's steps before
it take milliseconds of work each; a pause would at worst fail the job as hung, which the
assertions on the named rank and collective would then catch)."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dpcore.write.capture.rank_channel import has_flight_recorder
from tests import proctable
from tests.write.commands.test_profile import ROOT, _env, _wait_gone

ARGS = ["--model", "mlp", "--width", "64", "--batch-size", "12", "--steps", "8", "--warmup", "1",
        "--no-trace", "--progress", "json", "--hang-timeout", "4", "--timeout", "120"]


def _watch(out: Path, seen: list[tuple[int, str]], stop: threading.Event) -> None:
    """Record (live.csv lines, run status) every 50 ms while the run runs."""
    while not stop.is_set():
        runs = [p for p in out.iterdir() if p.is_dir()] if out.exists() else []
        if runs and (runs[0] / "live.csv").exists() and (runs[0] / "run.json").exists():
            try:
                status = json.loads((runs[0] / "run.json").read_text())["status"]
                text = (runs[0] / "live.csv").read_text()
                assert not text or text.endswith("\n")  # whole lines only
                seen.append((text.count("\n"), status))
            except (ValueError, KeyError):
                pass
        time.sleep(0.05)


@pytest.mark.skipif(not has_flight_recorder(), reason="this torch has no flight recorder dump "
                    "(_dump_fr_trace_json, absent on torch 2.4): the hang is caught, not named")
@pytest.mark.parametrize("ws,inject,kind,lagging", [
    (2, "1:3:sleep", "missing", 1),
    (3, "2:3", "desync", 2),
    (2, "0:3", "desync", 0),       # a 2-rank tie: the rank whose collective order is new is named
    (3, "1:3:sleep", "missing", 1),
])
def test_injected_hang_is_caught_named_and_the_run_goes_on(tmp_path, ws, inject, kind, lagging):
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "dpcore", "profile", "--variants", "flat,single",
           "--world-sizes", f"1,{ws}", "--inject-hang", inject, *ARGS, "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=ROOT)
    seen: list[tuple[int, str]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(out, seen, stop), daemon=True)
    watcher.start()
    family: set[int] = set()
    for line in proc.stdout:
        ev = json.loads(line)
        if ev.get("event") == "step" and ev.get("job_id") == f"flat-ws{ws}" and ev["step"] >= 2:
            family |= proctable.descendants(proc.pid)  # the hung job's ranks (and forkserver)
    proc.wait(timeout=300)
    stop.set()
    watcher.join()
    assert proc.returncode == 1, proc.stderr.read()
    run = next(p for p in out.iterdir() if p.is_dir())
    meta = json.loads((run / "run.json").read_text())
    jobs = {j["id"]: j for j in meta["jobs"]}
    hung = jobs[f"flat-ws{ws}"]
    assert hung["status"] == "failed" and hung["failed_rank"] == lagging
    assert "hang:" in hung["error"] and "all_reduce" in hung["error"]
    assert jobs["flat-ws1"]["status"] == "complete"
    assert jobs["single-ws1"]["status"] == "complete"  # the job after the hung one ran
    verdict = json.loads((run / "hang" / f"flat-ws{ws}" / "verdict.json").read_text())
    assert verdict["kind"] == kind and verdict["lagging_ranks"] == [lagging]
    assert verdict["op"] == "all_reduce" and verdict["no_answer"] == []
    for r in range(ws):
        assert (run / "hang" / f"flat-ws{ws}" / f"rank{r}.fr.json").stat().st_size > 0
        assert "most recent call first" in (run / "hang" / f"flat-ws{ws}" /
                                            f"rank{r}.stack.txt").read_text()
    assert family and not _wait_gone(family)  # no rank outlived its job
    # live.csv grew while the run was running, and it stays: the hung job's steps before the
    # hang (0..2 on every rank) and every step of the jobs that completed
    running = [n for n, status in seen if status == "running"]
    assert len(set(running)) >= 2, seen[-5:]
    with open(run / "live.csv") as f:
        live = list(csv.DictReader(f))
    mine = [r for r in live if r["job_id"] == f"flat-ws{ws}"]
    want = {(r, s) for r in range(ws) for s in range(3)}
    if kind == "desync":  # the skipping rank finished step 3 and waits in step 4's barrier
        want.add((lagging, 3))
    assert {(int(r["rank"]), int(r["step"])) for r in mine} == want
    assert all(float(r["comm_ms"]) > 0 for r in mine)  # the gradient all-reduce, measured
    with open(run / "steps.csv") as f:
        steps = {(r["job_id"], r["rank"], r["step"]): r["step_ms"] for r in csv.DictReader(f)}
    done = [r for r in live if r["job_id"] != f"flat-ws{ws}"]
    assert len(done) == len(steps) == 16
    assert all(float(steps[(r["job_id"], r["rank"], r["step"])]) == float(r["step_ms"])
               for r in done)
    # `hang` on the run says the same
    rep = subprocess.run([sys.executable, "-m", "dpcore", "hang", str(run)], capture_output=True,
                         text=True, env=_env(), cwd=ROOT, timeout=60)
    assert rep.returncode == 0 and f"verdict ({kind})" in rep.stdout


def test_an_injected_hang_a_variant_never_reaches_is_a_note(tmp_path):
    """ring reduces its gradients with its own send/recv, never dist.all_reduce: the job
    completes, and the run says the hang it was asked for did not happen."""
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "dpcore", "profile", "--variants", "ring", "--world-sizes", "2",
           "--inject-hang", "1:3:sleep", *ARGS, "--progress", "none", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = next(p for p in out.iterdir() if p.is_dir())
    job = json.loads((run / "run.json").read_text())["jobs"][0]
    assert job["id"] == "ring-ws2" and job["status"] == "complete"
    assert len(job["notes"]) == 1 and job["notes"][0].startswith("--inject-hang 1:3:sleep did not fire: ring")
    assert "ring-ws2: note - --inject-hang 1:3:sleep did not fire" in proc.stdout
    rep = subprocess.run([sys.executable, "-m", "dpcore", "summarize", str(run)], capture_output=True,
                         text=True, env=_env(), cwd=ROOT, timeout=60)
    assert "note: ring-ws2: --inject-hang 1:3:sleep did not fire" in rep.stdout
