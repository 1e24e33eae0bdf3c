"""Suite-wide fixtures."""
from __future__ import annotations

import os
import shutil
import signal
import sys
import types
from pathlib import Path

import pytest

#: The committed sample runs (scripts/make_sample.sh; the GPU one from an H200 run): tests read
#: copies of them (the fixture :func:`samples`), never the checkout's profiles/ folder, where a
#: newcomer's own ``dpcore profile`` or ``dpcore import`` runs land beside them.
CHECKOUT_PROFILES = Path(__file__).resolve().parents[1] / "profiles"
SAMPLE_NAMES = ("sample-train", "sample-allreduce", "sample-hang", "sample-gpu")


def samples_in_checkout(*names: str) -> bool:
    """True when the checkout holds every named sample run (all of :data:`SAMPLE_NAMES` when none
    is named): a test module's skip condition (``skipif(not samples_in_checkout("sample-train"))``),
    so that a test module need not name the checkout's profiles folder; tests read the copies
    (:func:`samples`). tests/test_checkout_untouched.py fails on a test module that names it."""
    return all((CHECKOUT_PROFILES / name / "run.json").is_file() for name in names or SAMPLE_NAMES)


@pytest.fixture(autouse=True, scope="session")
def _own_dashboard_lock(tmp_path_factory: pytest.TempPathFactory):
    """The dashboard's profile lock is machine-wide (one lock file in the temporary folder);
    this suite's dashboards take their own, so that tests running beside other suites on one
    machine do not wait for each other's profiles."""
    os.environ.setdefault("DPCORE_LOCK_DIR", str(tmp_path_factory.mktemp("dashboard-lock")))
    yield


@pytest.fixture(autouse=True, scope="session")
def _cache_out_of_the_data(tmp_path_factory: pytest.TempPathFactory):
    """Every read's trace cache (dpcore.read.ranks.cache) goes to a temporary folder, never
    beside the folders tests read (../shared/traces, tests/data, the sample runs), also in the
    CLI subprocesses tests start; tests of the cache's own placement unset it."""
    old = os.environ.get("DPCORE_CACHE_DIR")
    os.environ["DPCORE_CACHE_DIR"] = str(tmp_path_factory.mktemp("dpcore-cache"))
    yield
    if old is None:
        os.environ.pop("DPCORE_CACHE_DIR", None)
    else:
        os.environ["DPCORE_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary profiles folder holding copies of the committed samples present in the checkout
    (and nothing else): what a fresh clone's dashboard lists, whatever runs the user has added to
    profiles/ since. Session-wide, read-only by convention (the dashboard writes no run files)."""
    root = tmp_path_factory.mktemp("samples")
    for name in SAMPLE_NAMES:
        if (CHECKOUT_PROFILES / name / "run.json").is_file():
            # the committed files only: a cache/ an earlier read left beside the sample stays behind
            shutil.copytree(CHECKOUT_PROFILES / name, root / name, ignore=shutil.ignore_patterns("cache"))
    return root


@pytest.fixture(scope="session")
def gpu_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary profiles folder of GPU runs only: copies of profiles/sample-gpu and, where
    ../shared/gpu/runs exists, of the H200 recordings there (tests/read/dashboard/gpu_runs.py)."""
    from tests.read.dashboard.gpu_runs import copy_gpu_runs

    return copy_gpu_runs(tmp_path_factory.mktemp("gpu-runs"))


def _skip_gpu_tests(items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip, with the reason, where torch sees no CUDA GPU (torch is
    imported only when such a test was collected)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu:
        item.add_marker(skip)


#: The real ``__main__`` (pytest's), taken when the suite starts: a module-scoped fixture that runs
#: AppTest does so before any function-scoped fixture of its first test could take it.
_REAL_MAIN = sys.modules.get("__main__")


@pytest.fixture(autouse=True)
def _keep_main_module():
    """Streamlit's AppTest installs the app script as ``sys.modules['__main__']``; process
    start methods (spawn, forkserver) re-import ``__main__`` in every child, so a later test's
    ranks would run app.py. Restore the real ``__main__`` after every test."""
    yield
    if _REAL_MAIN is not None:
        sys.modules["__main__"] = _REAL_MAIN


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Put SIGINT's and SIGTERM's handlers back after every test: a guard, so that a handler one
    test leaves cannot decide how a later test's Ctrl-C lands. ``dpcore.cli.main`` gives the
    caller's SIGTERM handler back itself (tests/test_cli_signal_handlers.py checks it)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        if handler is not None:
            signal.signal(s, handler)


#: Where a test module's helpers come from when its tests start processes or a browser: the CLI
#: or a job in a subprocess, spawned gloo ranks, dpcore's commands (they launch ranks),
#: Streamlit's AppTest (a script run per page), Chromium. Those tests take the suite's minutes.
_SLOW_SOURCES = ("subprocess", "multiprocessing", "torch.multiprocessing", "dpcore.cli", "dpcore.write.commands",
                 "dpcore.write.runtime.launch", "streamlit.testing", "playwright", "tests.app_pages",
                 "tests.browser_checks", "tests.integrations", "tests.read.dashboard", "tests.write", "tests.workers")


def _starts_processes(module: types.ModuleType) -> bool:
    """True when the module imported (at its top level) a module or a name from one of
    :data:`_SLOW_SOURCES`."""
    for value in vars(module).values():
        source = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if isinstance(source, str) and any(source == s or source.startswith(s + ".") for s in _SLOW_SOURCES):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test of a module that starts processes or a browser
    (:func:`_starts_processes`): ``python -m pytest -m "not slow"`` is the fast part (README).
    Then skip the ``gpu`` tests where there is no GPU (:func:`_skip_gpu_tests`)."""
    _skip_gpu_tests(items)
    slow: dict[str, bool] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        if module.__name__ not in slow:
            slow[module.__name__] = _starts_processes(module)
        if slow[module.__name__]:
            item.add_marker(pytest.mark.slow)
