"""Fixtures of the trace-reading tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def scan_path(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A cache of the test's own, so that no test reads another's cached frames."""
    monkeypatch.setenv("DPCORE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    return "numpy"
