"""Suite-wide fixtures."""
from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _keep_main_module():
    """Streamlit's AppTest installs the app script as ``sys.modules['__main__']``; process
    start methods (spawn, forkserver) re-import ``__main__`` in every child, so a later test's
    ranks would run app.py. Restore the real ``__main__`` after every test."""
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main
