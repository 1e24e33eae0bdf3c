"""Suite-wide fixtures."""
from __future__ import annotations

import os
import sys

import pytest


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
