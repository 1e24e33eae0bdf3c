"""Fixtures of the per-rank cache's tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from dpcore.read.ranks import pool


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The traces actually read (parsed), in this process (workers=1); the cache where a user's
    would be (conftest sends it to a temporary folder; the user's cache directory is one too)."""
    monkeypatch.delenv("DPCORE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    seen: list[str] = []
    real = pool._reduce

    def counting(path: str, only: bool, tables: tuple[str, ...]):
        seen.append(Path(path).name)
        return real(path, only, tables)
    monkeypatch.setattr(pool, "_reduce", counting)
    return seen
