"""Every command the README shows runs: a newcomer copies them first.

Run in a copy of what the commands read (the samples, tests/data), so the checkout's profiles/
is never written.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


#: Lines of the README's bash blocks that this test does not run, and why. Anything else must run.
NOT_RUN = {
    "pip install": "installs packages (CI's .ci/run does this on a fresh machine)",
    "streamlit run app.py": "serves the dashboard until stopped (tests/read/dashboard drive it)",
    "python -m pytest": "the test suite itself",
    "--nproc-per-node 8": "needs a node with 8 GPUs (docs/gpus.md says what was proven how)",
}


def readme_commands() -> list[str]:
    """Each command line of the README's ```bash blocks, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_the_readme_shows_the_commands_a_newcomer_needs() -> None:
    cmds = readme_commands()
    assert any(c.startswith("python -m dpcore profile") for c in cmds)
    assert any("streamlit run app.py" in c for c in cmds)
    assert any(c.startswith("torchrun") for c in cmds)
    runnable = [c for c in cmds if not any(k in c for k in NOT_RUN)]
    assert len(runnable) >= 8, runnable


@pytest.mark.slow
def test_every_readme_command_runs(tmp_path: Path, samples: Path) -> None:
    """Run in a copy of the parts of the checkout the commands read (the committed samples,
    tests/data), so that the checkout's profiles/ is never written, and the runs a user added to
    it change nothing here."""
    work = tmp_path / "checkout"
    shutil.copytree(samples, work / "profiles")
    shutil.copytree(ROOT / "tests" / "data", work / "tests" / "data")
    env = dict(os.environ, PYTHONPATH=str(ROOT), DPCORE_PROFILES=str(work / "profiles"),
               DPCORE_CACHE_DIR=str(tmp_path / "cache"))
    torchrun = shutil.which("torchrun") or ""
    failed = []
    for cmd in readme_commands():
        if any(k in cmd for k in NOT_RUN):
            continue
        argv = shlex.split(cmd)
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "torchrun":
            if not torchrun:
                continue
            argv[0] = torchrun
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            failed.append(f"{cmd}: exit {done.returncode}: {(done.stderr or done.stdout)[-400:]}")
    assert failed == []
    # a run id is time, name and a random suffix (dpcore.contract.files.new_run_id)
    made = [p.name for p in (work / "profiles").iterdir() if re.fullmatch(r"\d{8}-\d{6}-first-[0-9a-f]{4}", p.name)]
    assert len(made) == 1, f"profile --name first wrote no run: {sorted(p.name for p in (work / 'profiles').iterdir())}"
