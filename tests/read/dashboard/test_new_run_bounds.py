"""The New-run form is bounded (issue 25, item 8): at most MAX_FORM_JOBS jobs per profile, and
one profile started from a dashboard at a time on this machine (a lock its process holds, so
two sessions never run profiles pinned to the same CPUs). Real subprocesses hold the lock."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dpcore.contract.config import VARIANTS, TrainConfig
from dpcore.contract.options import ProfileOptions
from dpcore.read.dashboard import launcher
from dpcore.write.commands.profile import plan_jobs


@pytest.mark.parametrize("variants,world_sizes,bucket,sweep", [
    (["single", "flat", "bucketed"], [1, 2], 25.0, []),
    (list(VARIANTS), [1, 2, 3, 4], 25.0, [1.0, 25.0, 100.0]),
    (["manual", "data_parallel", "torch_ddp", "zero1"], [2, 4], 5.0, [1.0, 2.0]),
])
def test_job_count_is_the_profiles_plan(variants, world_sizes, bucket, sweep) -> None:
    """Known answer: the count the form checks is the number of jobs profile plans."""
    opts = ProfileOptions(variants=tuple(variants), world_sizes=tuple(world_sizes), bucket_sweep=tuple(sweep),
                          train=TrainConfig(bucket_mb=bucket))
    assert launcher.job_count(variants, world_sizes, bucket, sweep) == len(plan_jobs(opts, None))


def _form(root: Path) -> AppTest:
    script = ("from pathlib import Path\nfrom dpcore.read.dashboard import launcher\n"
              f"launcher.new_run_form(Path({str(root)!r}), Path({str(root)!r}))\n")
    return AppTest.from_string(script, default_timeout=60).run()


def test_the_form_refuses_a_huge_sweep(tmp_path: Path, monkeypatch) -> None:
    started: list = []
    monkeypatch.setattr(launcher, "start", lambda cmd, cwd: started.append(cmd))
    at = _form(tmp_path)
    at.multiselect[0].set_value(list(VARIANTS))  # inside a form: values go with the submit
    at.multiselect[1].set_value([1, 2, 3, 4, 8, 16])
    at.text_input[0].input(",".join(str(b) for b in range(1, 30)))
    at.button[0].click().run()
    errors = " ".join(e.value for e in at.error)
    n = launcher.job_count(list(VARIANTS), [1, 2, 3, 4, 8, 16], 25.0, [float(b) for b in range(1, 30)])
    assert n > launcher.MAX_FORM_JOBS and f"{n} jobs; the form starts at most {launcher.MAX_FORM_JOBS}" in errors
    assert not started


def _waiting_child(go: Path) -> list[str]:
    return [sys.executable, "-c",
            f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n"]


def test_one_profile_at_a_time_on_this_machine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(launcher.LOCK_DIR_ENV, str(tmp_path))
    go = tmp_path / "go"
    first = launcher.start(_waiting_child(go), tmp_path)
    try:
        assert f"pid {first.proc.pid}" in launcher.machine_busy()
        with pytest.raises(launcher.MachineBusy, match=f"already running on this machine \\(pid {first.proc.pid}"):
            launcher.start(_waiting_child(go), tmp_path)
        # a second session's form: disabled, and it says why
        monkeypatch.setattr(launcher, "build_command", lambda *a, **k: _waiting_child(go))
        at = _form(tmp_path)
        assert at.button[0].disabled
        assert any("running on this machine" in i.value for i in at.info)
    finally:
        go.write_text("1")
        assert first.proc.wait(timeout=60) == 0
    # the lock ended with the child that held it: the next profile may start
    end = time.monotonic() + 10  # the kernel releases it as the child exits; this bounds a slow reap
    while launcher.machine_busy() and time.monotonic() < end:
        time.sleep(0.05)
    assert launcher.machine_busy() == ""
    second = launcher.start(_waiting_child(go), tmp_path)
    assert second.proc.wait(timeout=60) == 0
