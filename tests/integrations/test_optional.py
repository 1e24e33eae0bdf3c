"""The frameworks are optional: ``import dpcore`` (and its integrations package, and
``dpcore.trace_handler``) never loads them, and asking for a callback without its framework is
one ImportError line that says what to install."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_importing_dpcore_never_loads_a_framework() -> None:
    r = _run("import sys, dpcore, dpcore.integrations; dpcore.trace_handler\n"
             "print(sorted(m for m in ('lightning', 'transformers', 'pytorch_lightning') if m in sys.modules))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_a_missing_framework_is_one_line() -> None:
    # None in sys.modules: Python's own way to make `import lightning` fail as if not installed
    r = _run("import sys; sys.modules['lightning'] = None\n"
             "from dpcore.integrations import LightningCallback")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: dpcore.integrations.LightningCallback needs the 'lightning' package")
    assert "pip install lightning" in last
    assert "lightning_callback" not in r.stderr  # no chained traceback through dpcore's module


def test_a_missing_transformers_is_one_line() -> None:
    r = _run("import sys; sys.modules['transformers'] = None\n"
             "import dpcore.integrations as i; i.TransformersCallback")
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: dpcore.integrations.TransformersCallback needs the 'transformers' package")


def test_unknown_name() -> None:
    r = _run("import dpcore.integrations as i; i.Nope")
    assert "has no attribute 'Nope'" in r.stderr
