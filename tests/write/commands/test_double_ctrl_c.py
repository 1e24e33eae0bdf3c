"""A double Ctrl-C on ``python -m dpcore profile`` (issue 25 item 12): the run still ends
``interrupted`` with its finished jobs, no process of the run is left, and stderr holds no
traceback: before, the second SIGINT landed in torch's and multiprocessing's exit-time
finalizers ("Exception ignored in atexit callback ... KeyboardInterrupt") or killed the
interpreter mid-exit (exit status -2 instead of 130).

Real CLI subprocesses in their own session; the SIGINTs go to the whole process group, as a
terminal's Ctrl-C does (ranks, forkserver and resource tracker included)."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
NOISE = ("Traceback", "KeyError", "Exception ignored")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCORE_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _profile(out: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "dpcore", "profile", "--variants", "flat,overlap",
            "--world-sizes", "2", "--model", "mlp", "--width", "64", "--batch-size", "8",
            "--steps", "3", "--warmup", "1", "--no-trace", "--progress", "json", "--out", str(out)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=ROOT, start_new_session=True)


def _until(proc: subprocess.Popen, event: str, **match: object) -> None:
    for line in proc.stdout:
        ev = json.loads(line)
        if ev["event"] == event and all(ev.get(k) == v for k, v in match.items()):
            return
    raise AssertionError(f"no {event} event; stderr: {proc.stderr.read()[-2000:]}")


def _ctrl_c(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:  # the whole group has already gone
        pass


def _group_alive(pgid: int) -> list[str]:
    """Processes of the run's group that still live (zombies awaiting a reaper excluded)."""
    alive = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(stat)
    return alive


def _check_interrupted_run(proc: subprocess.Popen, out: Path, stderr: str) -> None:
    assert proc.returncode == 130, (proc.returncode, stderr[-3000:])
    assert not [n for n in NOISE if n in stderr], stderr[-3000:]
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "interrupted" and meta["finished"]
    assert {j["id"]: j["status"] for j in meta["jobs"]} == {"flat-ws2": "complete",
                                                           "overlap-ws2": "interrupted"}
    with open(run / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["job_id"], r["rank"]) for r in rows} == {("flat-ws2", "0"), ("flat-ws2", "1")}
    deadline = time.monotonic() + 60  # generous: forkserver and tracker exit on their own
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group_alive(proc.pid) == []


def test_ctrl_c_pressed_again_and_again_from_inside_a_job(tmp_path: Path) -> None:
    """First Ctrl-C as the second job starts (its ranks running), then again every 20 ms until
    the process is gone: the later presses land while the ranks are reaped, while run.json is
    closed and while the interpreter exits."""
    proc = _profile(tmp_path)
    _until(proc, "job_start", job_index=2)
    while proc.poll() is None:
        _ctrl_c(proc)
        time.sleep(0.02)
    _check_interrupted_run(proc, tmp_path, proc.stderr.read())


def test_ctrl_c_held_down_through_the_interpreter_exit(tmp_path: Path) -> None:
    """First Ctrl-C during a job, then Ctrl-C again and again from the run's end until the
    process is gone: every later one lands in the teardown (torch's atexit finalizers,
    multiprocessing's), none may print a traceback or change the exit status."""
    proc = _profile(tmp_path)
    _until(proc, "job_start", job_index=2)
    _ctrl_c(proc)
    _until(proc, "run_end")
    while proc.poll() is None:
        _ctrl_c(proc)
        time.sleep(0.01)
    _check_interrupted_run(proc, tmp_path, proc.stderr.read())
