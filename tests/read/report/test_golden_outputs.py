"""Every read command prints what it printed when tests/data/golden was recorded (scripts/golden_outputs.py).

Why: the read path is refactored under these commands (one path through the per-rank tables,
modules split and renamed); their output, text and CSV, on the committed samples must stay
byte-identical (read from copies: tests/conftest.py's ``samples``). The ../shared runs and traces
are compared by hash only (tests/data/golden/shared), so nothing of them is copied into the
repository.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "tests" / "data" / "golden"
SCRIPT = REPO / "scripts" / "golden_outputs.py"
SHARED = REPO.parent / "shared"


def _record(out: Path, *extra: str) -> None:
    """Run the recorder; a failure of the script itself is reported with its own last words
    (one CI-like run here failed this test once without saying whether the script or a
    comparison failed)."""
    p = subprocess.run([sys.executable, str(SCRIPT), str(out), *extra], cwd=REPO, capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, f"golden_outputs.py exited {p.returncode}: {p.stderr[-2000:]}"


def _differences(want: Path, got: Path, pattern: str) -> list[str]:
    names = {p.name for p in want.glob(pattern)} | {p.name for p in got.glob(pattern)}
    return sorted(n for n in names if not (want / n).is_file() or not (got / n).is_file()
                  or (want / n).read_bytes() != (got / n).read_bytes())


def test_samples_print_what_they_printed(tmp_path: Path, samples: Path) -> None:
    """On copies of the samples (the paths they print read as <REPO>/profiles/...): runs a user
    added to profiles/ are no part of the recording, and nothing is written beside the samples."""
    _record(tmp_path, "--profiles", str(samples))
    assert len(list(GOLDEN.glob("*.txt"))) >= 20
    assert _differences(GOLDEN, tmp_path, "*.txt") == []


def test_shared_runs_print_what_they_printed(tmp_path: Path) -> None:
    if not (SHARED / "gpu" / "runs").is_dir():
        pytest.skip(f"{SHARED} is absent (a fresh clone): the shared runs' outputs are compared where it exists")
    _record(tmp_path, "--shared", "--hash")
    assert len(list((GOLDEN / "shared").glob("*.sha256"))) >= 10
    assert _differences(GOLDEN / "shared", tmp_path, "*.sha256") == []
