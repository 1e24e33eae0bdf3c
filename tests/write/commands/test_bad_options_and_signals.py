"""Hostile input and hostile moments: every bad option is one line and exit 2 before anything
runs; an interrupt while ranks start ends the run `interrupted`; a dead launcher's run reads as
stale; a timed-out job leaves no rank*.profiler.log behind."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dpcore.contract import runformat as rf

ROOT = Path(__file__).resolve().parents[3]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCORE_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _dpcore(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcore", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(), cwd=ROOT)


#: (command line, text the one error line must hold: the option and its valid range)
BAD = [
    (["profile", "--timeout", "0"], "--timeout must be a number of seconds > 0"),
    (["profile", "--timeout", "-1"], "--timeout must be a number of seconds > 0"),
    (["profile", "--timeout", "nan"], "--timeout must be a number of seconds > 0"),
    (["profile", "--timeout", "inf"], "--timeout must be a number of seconds > 0"),
    (["profile", "--width", "-8"], "--width must be >= 1, got -8"),
    (["profile", "--width", "0"], "--width must be >= 1, got 0"),
    (["profile", "--lr", "nan"], "--lr must be a finite number >= 0, got nan"),
    (["profile", "--lr", "-1"], "--lr must be a finite number >= 0, got -1"),
    (["profile", "--steps", "-3"], "--steps must be >= 1"),
    (["profile", "--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["profile", "--profile-steps", "0"], "--profile-steps must be between 1 and --steps (10)"),
    (["profile", "--profile-steps", "-2"], "--profile-steps must be between 1 and --steps (10)"),
    (["profile", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["verify", "--batch-size", "-2"], "--batch-size must be >= 1, got -2"),
    (["verify", "--timeout", "0"], "--timeout must be a number of seconds > 0"),
    (["verify", "--width", "0"], "--width must be >= 1, got 0"),
    (["verify", "--lr", "nan"], "--lr must be a finite number >= 0, got nan"),
    (["verify", "--steps", "0"], "--steps must be >= 1"),
    (["allreduce", "--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["allreduce", "--repeats", "-5"], "--repeats must be >= 0 (0 = adaptive), got -5"),
    (["allreduce", "--timeout", "-1"], "--timeout must be a number of seconds > 0"),
    (["allreduce", "--timeout", "nan"], "--timeout must be a number of seconds > 0"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_option_is_one_line_exit_2_before_anything_runs(argv, needle, tmp_path):
    out = tmp_path / "profiles"
    out.mkdir()
    extra = ["--out", str(out)] if argv[0] != "verify" else []
    proc = _dpcore([*argv, *extra])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not list(out.iterdir())  # refused before any run directory was made


@pytest.mark.parametrize("command", ["profile", "allreduce"])
def test_out_that_is_a_file_is_one_line_exit_2(command, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    for out in (f, f / "sub"):
        proc = _dpcore([command, "--out", str(out)])
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert lines == [f"error: --out {out}: not a folder (a file is in the way); "
                         "choose a writable folder"], lines
        assert "measured jobs were kept" not in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_read_only_folder_is_one_line_exit_2(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = _dpcore(["profile", "--out", str(ro / "profiles")])
    finally:
        ro.chmod(0o755)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: --out {ro / 'profiles'}:")


def test_run_writer_turns_an_unwritable_out_into_a_usage_error(tmp_path):
    """Whoever calls RunWriter (record, a race after the CLI's check): one UsageError line,
    never an OSError that the CLI would report as 'measured jobs were kept'."""
    from dpcore.contract.errors import UsageError
    from dpcore.write.capture.run_writer import RunWriter

    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        RunWriter(f, command=[], config={}, environment={})


# --- issue 4: an interrupt while ranks start ------------------------------------------------

def test_interrupt_while_ranks_start_marks_the_run_interrupted(monkeypatch, tmp_path, capsys):
    """CLI level: Ctrl-C/SIGTERM lands after the first rank of the first job started. The run
    is `interrupted`, exit 130, the unfinished job `interrupted` (not `failed`)."""
    import dpcore.write.runtime.launch as launch_mod
    from dpcore.cli import main

    proc_cls = launch_mod._mp_context().Process
    real_start = proc_cls.start
    starts: list[int] = []

    def start(self):
        if starts:
            raise KeyboardInterrupt
        real_start(self)
        starts.append(self.pid)

    monkeypatch.setattr(proc_cls, "start", start)
    rc = main(["profile", "--variants", "flat", "--world-sizes", "2", "--width", "16",
               "--steps", "2", "--no-trace", "--progress", "none", "--out", str(tmp_path)])
    assert rc == 130, capsys.readouterr().err
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((run / rf.RUN_JSON).read_text())
    assert meta["status"] == "interrupted"
    assert [j["status"] for j in meta["jobs"]] == ["interrupted"]
    assert not Path(f"/proc/{starts[0]}").exists() or \
        Path(f"/proc/{starts[0]}/stat").read_text().split()[2] == "Z"


def test_interrupt_during_allreduce_keeps_the_finished_cell(monkeypatch, tmp_path, capsys):
    """`allreduce` shares profile's run life cycle: Ctrl-C/SIGTERM as the second cell's ranks
    start ends the run `interrupted` (exit 130), the first cell stays complete with its rows,
    the unfinished cell is `interrupted`, not `failed`."""
    import dpcore.write.runtime.launch as launch_mod
    from dpcore.cli import main

    proc_cls = launch_mod._mp_context().Process
    real_start = proc_cls.start
    starts: list[int] = []

    def start(self):
        if len(starts) == 2:  # the first cell's two ranks started; the second cell's do not
            raise KeyboardInterrupt
        real_start(self)
        starts.append(self.pid)

    monkeypatch.setattr(proc_cls, "start", start)
    rc = main(["allreduce", "--algos", "native,ring", "--world-sizes", "2", "--sizes", "1KB",
               "--repeats", "2", "--warmup", "0", "--progress", "none", "--out", str(tmp_path)])
    assert rc == 130, capsys.readouterr().err
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((run / rf.RUN_JSON).read_text())
    assert meta["status"] == "interrupted"
    assert {j["id"]: j["status"] for j in meta["jobs"]} == {"native-ws2": "complete",
                                                           "ring-ws2": "interrupted"}
    rows = (run / "allreduce.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("native-ws2,native,2,1024,2,")


def test_interrupt_while_jobs_are_planned_marks_the_run_interrupted(monkeypatch, tmp_path, capsys):
    """Ctrl-C after run.json exists but before the job loop (while jobs are planned) must not
    leave the run `running` with nobody writing it."""
    import dpcore.write.commands.profile as profile_mod
    from dpcore.cli import main

    def plan(world, opts, run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(profile_mod, "plan", plan)
    rc = main(["profile", "--variants", "flat", "--world-sizes", "2", "--width", "16",
               "--steps", "2", "--no-trace", "--progress", "none", "--out", str(tmp_path)])
    assert rc == 130, capsys.readouterr().err
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert json.loads((run / rf.RUN_JSON).read_text())["status"] == "interrupted"


# --- issue 7b: a run whose launcher died is stale -------------------------------------------

def test_run_json_names_its_owner(tmp_path):
    from dpcore.write.capture.run_writer import RunWriter

    w = RunWriter(tmp_path, command=[], config={}, environment={})
    meta = json.loads((w.run_dir / rf.RUN_JSON).read_text())
    assert meta["owner"] == {"pid": os.getpid(), "host": socket.gethostname()}
    assert not rf.is_stale(meta)  # we are alive


def _meta(status: str = "running", pid: int = 4242, host: str = "here") -> dict:
    return {"status": status, "owner": {"pid": pid, "host": host}}


def test_is_stale_only_for_a_running_run_of_a_dead_owner_on_this_host():
    dead, alive = (lambda pid: False), (lambda pid: True)
    assert rf.is_stale(_meta(), alive=dead, host="here")
    assert not rf.is_stale(_meta(), alive=alive, host="here")
    assert not rf.is_stale(_meta(host="elsewhere"), alive=dead, host="here")  # cannot know
    for status in ("complete", "failed", "interrupted"):
        assert not rf.is_stale(_meta(status), alive=dead, host="here")
    assert not rf.is_stale({"status": "running"}, alive=dead, host="here")  # older runs: no owner
    assert not rf.is_stale({"status": "running", "owner": {"pid": "x", "host": "here"}},
                           alive=dead, host="here")


def test_is_stale_with_a_really_dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    meta = _meta(pid=child.pid, host=socket.gethostname())
    assert rf.is_stale(meta)
    assert rf.pid_alive(os.getpid()) and not rf.pid_alive(child.pid)


# --- issue 7c: a timed-out job leaves no profiler logs --------------------------------------

def test_timed_out_job_leaves_no_profiler_logs(tmp_path):
    """The rank hangs inside the profiled steps (stderr redirected to rank0.profiler.log) and
    is killed at --timeout: the job is failed with a timeout and no log file is left."""
    proc = _dpcore(["profile", "--model", "tests.workers:hanging_workload", "--variants", "flat",
                    "--world-sizes", "1", "--steps", "2", "--warmup", "1", "--profile-steps", "1",
                    "--timeout", "8", "--progress", "none", "--out", str(tmp_path)], timeout=200)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((run / rf.RUN_JSON).read_text())
    (job,) = meta["jobs"]
    assert job["status"] == "failed" and "timed out" in job["error"]
    assert sorted(p.name for p in run.rglob("*.profiler.log")) == []
    assert sorted(p.name for p in run.rglob("*.tmp.json.gz")) == []
