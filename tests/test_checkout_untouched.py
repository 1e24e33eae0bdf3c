"""No test module names the checkout's profiles/ folder: tests read copies of the committed samples.

Why: a newcomer follows the README, whose ``python -m dpcore profile`` and ``import`` write new
runs into profiles/ (and reading a run may write its cache/ beside it). A test that reads
``ROOT / "profiles" / ...`` then reads whatever is there (a glob sees the user's runs, a cache test
writes into the sample) and may write into the checkout. tests/conftest.py's ``samples`` fixture
is the one place that copies the committed samples (and ``samples_in_checkout`` the one place that
checks they are present, for skip conditions); tests/read/dashboard/gpu_runs.py copies the GPU
runs for the ``gpu_runs`` fixture. Every other test module must go through those.

A scan of the sources, no process: fast enough for the "not slow" part of the suite.
"""
from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: The forms that name the checkout's profiles folder (or a sample in it): a path joined onto the
#: repository's root (``ROOT / "profiles"``, ``Path(__file__).parents[3] / "profiles"``,
#: ``Path(APP).parent / "profiles"``), a path relative to the working folder (``Path("profiles")``,
#: ``"profiles/sample-train"``), and conftest's own constant. A temporary folder's profiles
#: (``tmp_path / "profiles"``) is none of these.
CHECKOUT_FORMS = (
    re.compile(r"""(?:\b(?:ROOT|REPO|REPO_ROOT|CHECKOUT)|\bparents\[\d+\]|\.parent|\bAPP_DIR)\s*/\s*["']profiles["']"""),
    re.compile(r"""\bPath\(\s*["']profiles["']\s*\)"""),
    re.compile(r"""["']profiles/sample-"""),
    re.compile(r"""\bCHECKOUT_PROFILES\b"""),
)

#: The modules allowed to name it: the fixtures that copy the samples out of it, and this guard.
ALLOWED = {"conftest.py", "read/dashboard/gpu_runs.py", "test_checkout_untouched.py"}

#: Test modules owned by other work at the time this guard was written, still reading the checkout's
#: samples; each must be converted to the ``samples`` fixture and then removed from here (a listed
#: module that no longer names the folder fails :func:`test_the_pending_list_is_not_stale`).
PENDING: dict[str, str] = {}


def offending_lines(text: str) -> list[str]:
    """The lines of a module's source that name the checkout's profiles folder."""
    return [line.strip() for line in text.splitlines() if any(f.search(line) for f in CHECKOUT_FORMS)]


def _modules() -> dict[str, str]:
    """Every Python source under tests/ except the golden data: its path relative to tests/."""
    return {p.relative_to(TESTS).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(TESTS.rglob("*.py")) if "data" not in p.relative_to(TESTS).parts[:1]}


def test_the_forms_are_recognised() -> None:
    """Known answers: the forms the suite used before it read copies are caught, a temporary
    folder's profiles/ and prose are not (so the guard can fail, and fails on nothing else)."""
    caught = ['SAMPLE = ROOT / "profiles" / "sample-train"',
              'sample = Path(__file__).resolve().parents[3] / "profiles" / "sample-allreduce"',
              'CHECKOUT = Path(APP).parent / "profiles"  # only to skip',
              'PROFILES = Path(__file__).resolve().parents[3] / "profiles"',
              'root = Path("profiles").resolve()',
              'main(["summarize", "profiles/sample-train"])',
              'from tests.conftest import CHECKOUT_PROFILES']
    passed = ['out = tmp_path / "profiles"', 'profiles = tmp_path_factory.mktemp("profiles")',
              'run = make_run(tmp_path / "profiles")', 'shutil.copytree(samples, work / "profiles")',
              '"""The committed sample runs (profiles/sample-*) in the app."""',
              'skipif(not samples_in_checkout("sample-train"), reason="sample runs not present")']
    assert offending_lines("\n".join(caught)) == caught
    assert offending_lines("\n".join(passed)) == []


def test_no_test_module_names_the_checkouts_profiles_folder() -> None:
    found = {path: lines for path, text in _modules().items()
             if path not in ALLOWED and path not in PENDING and (lines := offending_lines(text))}
    assert found == {}, ("read copies of the samples (the `samples` fixture in tests/conftest.py; "
                         f"skip with samples_in_checkout()), not the checkout's profiles/: {found}")


def test_the_pending_list_is_not_stale() -> None:
    modules = _modules()
    stale = sorted(p for p in PENDING if p not in modules or not offending_lines(modules[p]))
    assert stale == [], f"converted (or gone): remove from PENDING: {stale}"


def test_the_allowed_fixtures_are_where_the_copies_are_made() -> None:
    """conftest.py copies the samples and gpu_runs.py the GPU runs: if either moved, the
    allow-list would let another module through."""
    modules = _modules()
    assert "def samples(" in modules["conftest.py"] and "shutil.copytree(CHECKOUT_PROFILES" in modules["conftest.py"]
    assert "def copy_gpu_runs(" in modules["read/dashboard/gpu_runs.py"]
