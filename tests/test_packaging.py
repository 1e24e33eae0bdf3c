"""``pip install .`` gives a working ``dpcore`` command, equal to ``python -m dpcore``.

Why a test: the rest of the suite runs dpcore from the checkout (``python -m dpcore`` in the
repository root), where every sub-package is on ``sys.path`` whether or not the build would ship
it. Only an installed copy, imported from outside the repository, shows a sub-package the
package discovery missed, a console script that loses an exit code, or ``pyproject.toml``'s
dependencies drifting away from the README's ``requirements*.txt`` set-up.

The install is offline: a fresh venv that sees the site-packages of the interpreter running the
tests (so torch, pandas and streamlit are not downloaded again), and ``pip install --no-deps
--no-build-isolation --no-index`` of a copy of the repository (the build writes ``build/`` and
``*.egg-info`` into the folder it builds, so never into the checkout).

Why a ``.pth`` file and not ``--system-site-packages``: run from a venv, the tests' interpreter
is that venv's, but ``--system-site-packages`` gives a nested venv the *base* interpreter's
packages (an old setuptools without ``bdist_wheel``), not the ones requirements-dev.txt put
into the venv. The ``.pth`` names exactly the tests' own site directories, in a venv or not.
"""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import samples_in_checkout

try:
    import tomllib
except ImportError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"verify", "profile", "allreduce", "analyze", "summarize", "stragglers", "whatif", "import"}
# What the copy leaves out: version control, caches, earlier builds, runs (large, not package data).
COPY_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache", ".venv", "build", "dist",
                                     "*.egg-info", "profiles", ".gl")

pytestmark = pytest.mark.timeout(900)


def _requirements(path: Path) -> list[str]:
    """Requirement lines of a requirements file: comments, blank lines and ``-r`` includes dropped."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.append(line)
    return out


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_pyproject_dependencies_are_the_requirements_files() -> None:
    project = _pyproject()["project"]
    assert sorted(project["dependencies"]) == sorted(_requirements(ROOT / "requirements.txt"))
    assert "torch>=2.4" in project["dependencies"]
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in dev.splitlines()
    assert sorted(project["optional-dependencies"]["dev"]) == sorted(_requirements(ROOT / "requirements-dev.txt"))
    assert {"integrations", "scale"} <= set(project["optional-dependencies"])
    assert project["scripts"] == {"dpcore": "dpcore.cli:run_cli"}
    assert project["requires-python"] == ">=3.10"


def _clean_env() -> dict[str, str]:
    """The caller's environment without anything that would point Python at the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV") and not k.startswith("DPCORE_")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout)


def _site_dirs() -> list[str]:
    """The site directories of the interpreter running the tests (its venv's when it runs in
    one), user site included when it is on."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return dirs


def _see_our_site_packages(python: Path, cwd: Path) -> None:
    """Make the venv of ``python`` see :func:`_site_dirs` after its own site-packages."""
    where = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=cwd)
    assert where.returncode == 0, where.stderr
    purelib = Path(where.stdout.strip())
    purelib.mkdir(parents=True, exist_ok=True)
    (purelib / "dpcore-test-outer-site.pth").write_text("".join(f"{d}\n" for d in _site_dirs()))


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fresh venv with the package installed from a copy of the repository; its paths."""
    tmp = tmp_path_factory.mktemp("packaging")
    env_dir, src = tmp / "venv", tmp / "src"
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    # --without-pip: the tests' own pip and setuptools (visible through the .pth below) do the
    # install; ensurepip would add an older setuptools that cannot build wheels by itself.
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=tmp)
    if made.returncode != 0 or not python.exists():
        pytest.skip(f"cannot create a venv here: {(made.stderr or made.stdout).strip().splitlines()[-1:]}")
    _see_our_site_packages(python, tmp)
    if _run([str(python), "-m", "pip", "--version"], cwd=tmp).returncode != 0:
        pip = _run([str(python), "-m", "ensurepip"], cwd=tmp)
        if pip.returncode != 0:
            pytest.skip(f"cannot create a venv with pip here: {pip.stderr.strip().splitlines()[-1:]}")
    shutil.copytree(ROOT, src, ignore=COPY_IGNORE)
    inst = _run([str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", str(src)],
                cwd=tmp, timeout=600)
    assert inst.returncode == 0, (f"pip install failed (needs setuptools>=70.1, requirements-dev.txt):\n"
                                  f"{inst.stdout[-3000:]}\n{inst.stderr[-3000:]}")
    return {"python": python, "dpcore": bindir / "dpcore", "venv": env_dir, "src": src, "cwd": tmp}


def _both(venv: dict[str, Path], *args: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """(the venv's ``dpcore ARGS`` run outside the repository, ``python -m dpcore ARGS`` in it)."""
    return _run([str(venv["dpcore"]), *args], cwd=venv["cwd"]), _run([sys.executable, "-m", "dpcore", *args], cwd=ROOT)


def test_console_script_help_lists_every_command(venv: dict[str, Path]) -> None:
    script, module = _both(venv, "--help")
    assert script.returncode == module.returncode == 0, script.stderr
    # each names itself as it was invoked; below the usage lines the text is the same
    assert script.stdout.startswith("usage: dpcore ") and module.stdout.startswith("usage: python -m dpcore ")
    assert script.stdout.split("\n\n", 1)[1] == module.stdout.split("\n\n", 1)[1]
    from dpcore.cli import build_parser
    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None))
    assert set(sub.choices) >= COMMANDS
    listed = script.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert listed == list(sub.choices)
    for name in sub.choices:
        assert f"\n    {name} " in script.stdout, name


@pytest.mark.skipif(not samples_in_checkout("sample-train"), reason="the committed sample run is missing")
def test_console_script_prints_what_the_module_prints(venv: dict[str, Path], samples: Path, tmp_path: Path) -> None:
    # its own copy: the commands run without $DPCORE_CACHE_DIR (_clean_env), so the trace cache
    # is written beside the run, never into the suite's shared copy of the samples
    run = shutil.copytree(samples / "sample-train", tmp_path / "sample-train")
    script, module = _both(venv, "summarize", str(run), "--csv")
    assert script.returncode == module.returncode == 0, script.stderr
    assert script.stdout == module.stdout
    lines = script.stdout.splitlines()
    assert lines[0].startswith("job_id,variant,world_size,bucket_mb,step_ms,")
    assert len(lines) > 5 and any(line.startswith("bucketed-ws2-") for line in lines)


@pytest.mark.parametrize("args", [[], ["bogus"], ["summarize", "/nonexistent/dpcore-run", "--csv"],
                                  ["profile", "--variants", "nope"]],
                         ids=["none", "bogus", "missing-run", "bad-variant"])
def test_console_script_exit_codes(venv: dict[str, Path], args: list[str]) -> None:
    script, module = _both(venv, *args)
    assert script.returncode == module.returncode == 2
    assert script.stderr == module.stderr
    assert script.stderr.startswith("error: ") and script.stderr.count("\n") == 1, script.stderr
    assert script.stdout == ""


def test_installed_package_has_every_sub_package(venv: dict[str, Path]) -> None:
    code = (
        "import importlib.metadata as m, json, dpcore, dpcore.read.dashboard, dpcore.write.dp.variants\n"
        "ep = [e.value for e in m.entry_points(group='console_scripts') if e.name == 'dpcore']\n"
        "print(json.dumps({'file': dpcore.__file__, 'dashboard': dpcore.read.dashboard.__file__,\n"
        "                  'variants': sorted(dpcore.write.dp.variants.VARIANTS),\n"
        "                  'version': m.version('dpcore'), 'module_version': dpcore.__version__, 'ep': ep,\n"
        "                  'files': [str(f) for f in m.files('dpcore')]}))\n")
    proc = _run([str(venv["python"]), "-c", code], cwd=venv["cwd"])
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    venv_dir = venv["venv"].resolve()
    for key in ("file", "dashboard"):  # the venv's copy, not the checkout or the copy it was built from
        assert Path(got[key]).resolve().is_relative_to(venv_dir), got[key]
    from dpcore.contract.config import VARIANTS  # the checkout's names (no torch in this process)
    assert got["variants"] == sorted(VARIANTS)
    assert got["version"] == got["module_version"]
    assert got["ep"] == ["dpcore.cli:run_cli"]
    installed = {f for f in got["files"] if f.startswith("dpcore/") and f.endswith(".py")}
    source = {p.relative_to(venv["src"]).as_posix() for p in (venv["src"] / "dpcore").rglob("*.py")}
    assert installed == source
    assert {"dpcore/contract/__init__.py", "dpcore/write/dp/variants/__init__.py",
            "dpcore/read/dashboard/__init__.py", "dpcore/cli.py"} <= installed
    assert not [f for f in got["files"] if f.endswith((".c", ".so"))]  # nothing compiled, at install or later
    # Nothing but the package, its metadata and the script: no tests/, benchmarks/, profiles/ ...
    tops = {f.split("/", 1)[0] for f in got["files"] if not f.startswith("..")}
    assert tops == {"dpcore", f"dpcore-{got['version']}.dist-info"}, tops
    assert [f for f in got["files"] if f.startswith("..")] and all(f.endswith("/dpcore") for f in got["files"]
                                                                     if f.startswith("..")), got["files"]


def test_the_venv_builds_with_the_tests_own_setuptools(venv: dict[str, Path]) -> None:
    """The nested venv imports setuptools and pip from where the tests' interpreter does (its
    venv's, when the suite runs in one), not from the base interpreter, whose setuptools may be
    too old to build (no ``bdist_wheel``)."""
    code = "import setuptools, pip; print(setuptools.__file__); print(pip.__file__)"
    nested = _run([str(venv["python"]), "-c", code], cwd=venv["cwd"])
    # in a child, not here: pytest's own process may already hold the standard library's distutils
    ours = _run([sys.executable, "-c", code], cwd=venv["cwd"])
    assert nested.returncode == ours.returncode == 0, (nested.stderr, ours.stderr)
    assert nested.stdout.splitlines() == ours.stdout.splitlines()
    assert len(ours.stdout.splitlines()) == 2
