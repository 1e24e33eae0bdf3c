"""Fixtures of the trace-reading tests: both scans of a trace (native and numpy)."""
from __future__ import annotations

import pytest

from dpcore.read.traces import native


@pytest.fixture(params=["native", "numpy"])
def scan_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory) -> str:
    """Runs a test once with the native scan (skipped where it cannot be built) and once with
    the numpy scan alone; each with a cache of its own, so that neither reads the other's."""
    monkeypatch.setenv("DPCORE_CACHE_DIR", str(tmp_path_factory.mktemp(f"cache-{request.param}")))
    if request.param == "native":
        monkeypatch.setenv("DPCORE_NATIVE", "1")
        if native.load() is None:
            pytest.skip(f"native scan: {native.why_not()}")
    else:
        monkeypatch.setenv("DPCORE_NATIVE", "0")
    return str(request.param)
