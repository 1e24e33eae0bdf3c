"""How the native scan's library is built and cached (dpcore/read/traces/native/__init__.py),
with stand-in compilers (``$CC``): these run whether or not the machine has a C compiler.

A build that fails is remembered (a marker keyed like the library), so later processes do not
run the compiler again; a changed scan.c or another compiler tries again; a successful build
deletes the libraries of older scan.c's.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dpcore.read.traces import native

ROOT = Path(__file__).resolve().parents[3]
FAILING = """#!/bin/sh
echo run >> "{calls}"
echo "In file included from scan.c:1:" >&2
echo "scan.c:7:3: error: {what}" >&2
echo "scan.c:9:1: error: and more" >&2
exit 1
"""
BUILDING = """#!/bin/sh
echo run >> "{calls}"
while [ "$#" -gt 0 ]; do
  if [ "$1" = "-o" ]; then echo "not a library" > "$2"; fi
  shift
done
"""


def _compiler(path: Path, text: str, **fields: str) -> Path:
    path.write_text(text.format(**fields))
    path.chmod(0o755)
    return path


def _calls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A process's first load, with its own cache and temporary folders; returns the cache folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.delenv("DPCORE_NATIVE", raising=False)
    monkeypatch.setattr(native, "_state", {})
    return tmp_path / "cache" / "dpcore" / "native"


def _why_not_in_a_new_process() -> str:
    done = subprocess.run([sys.executable, "-c", "from dpcore.read.traces import native; print(native.why_not())"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_failed_build_is_remembered_across_processes(fresh: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    monkeypatch.setenv("CC", str(_compiler(tmp_path / "badcc", FAILING, calls=str(calls), what="boom")))
    assert native.load() is None
    assert _calls(calls) == 1  # one folder tried: the temporary one would fail the same way
    markers = list(fresh.glob("dpscan-*.failed"))
    assert len(markers) == 1 and not list(fresh.glob("dpscan-*.so"))
    assert markers[0].read_text() == f"{tmp_path / 'badcc'} failed: scan.c:7:3: error: boom\n"
    assert "error: boom" in str(native.why_not())
    # later processes (each analyze worker): straight to the numpy scan, the compiler not run
    why = _why_not_in_a_new_process()
    assert _calls(calls) == 1
    assert "scan.c:7:3: error: boom" in why and str(markers[0]) in why, why
    monkeypatch.setattr(native, "_state", {})
    assert native.load() is None and _calls(calls) == 1
    assert not list((tmp_path / "tmp").iterdir())  # nothing built or tried in the temporary folder

    # another compiler tries again (and is remembered in turn)
    calls2 = tmp_path / "calls2"
    monkeypatch.setenv("CC", str(_compiler(tmp_path / "othercc", FAILING, calls=str(calls2), what="other")))
    monkeypatch.setattr(native, "_state", {})
    assert native.load() is None and _calls(calls2) == 1 and _calls(calls) == 1
    assert "error: other" in markers[0].read_text()

    # a changed scan.c is a new key: built again, its failure remembered apart
    monkeypatch.setenv("CC", str(tmp_path / "badcc"))
    changed = tmp_path / "scan.c"
    changed.write_text(native.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(native, "SOURCE", changed)
    monkeypatch.setattr(native, "_state", {})
    assert native.load() is None and _calls(calls) == 2
    assert len(list(fresh.glob("dpscan-*.failed"))) == 2
    monkeypatch.setattr(native, "_state", {})
    assert native.load() is None and _calls(calls) == 2


def test_a_missing_compiler_is_not_remembered(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No compiler costs no build: nothing is remembered, so installing one takes effect."""
    monkeypatch.setenv("CC", "no-such-cc-here")
    assert native.load() is None
    assert "cannot run the C compiler 'no-such-cc-here'" in str(native.why_not())
    assert not list(fresh.glob("dpscan-*"))


def test_a_build_deletes_older_libraries_and_markers(fresh: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    fresh.mkdir(parents=True, mode=0o700)
    old = [fresh / "dpscan-0123456789abcdef.so", fresh / "dpscan-fedcba9876543210.so",
           fresh / "dpscan-0123456789abcdef.failed"]
    kept = [fresh / "dpscan-0011223344556677.ab12cd.tmp", fresh / "README", fresh / "other.so"]
    for path in old + kept:
        path.write_text("x")
    # a build that fails deletes nothing
    monkeypatch.setenv("CC", str(_compiler(tmp_path / "badcc", FAILING, calls=str(calls), what="boom")))
    assert native.load() is None and _calls(calls) == 1
    failed = [p for p in fresh.glob("dpscan-*.failed") if p not in old]
    assert len(failed) == 1 and all(p.exists() for p in old + kept)
    # one that builds (a stand-in that writes a file ctypes cannot load) deletes the others and the markers
    monkeypatch.setenv("CC", str(_compiler(tmp_path / "goodcc", BUILDING, calls=str(calls))))
    monkeypatch.setattr(native, "_state", {})
    assert native.load() is None and _calls(calls) == 2
    assert "cannot load the native scanner" in str(native.why_not())
    built = failed[0].with_suffix(".so")
    assert built.read_text() == "not a library\n"
    assert sorted(fresh.iterdir()) == sorted([built, *kept])


HANGING = """#!/bin/sh
echo run >> "{calls}"
sleep 30
"""


def test_a_timed_out_build_is_remembered_for_an_hour_only(fresh: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler that ran out of time may have been starved, not broken: its marker stops the
    next processes for TIMEOUT_REMEMBERED_S, then the build is tried again; a compiler *error*
    stays remembered however old its marker is."""
    calls = tmp_path / "calls"
    monkeypatch.setenv("CC", str(_compiler(tmp_path / "slowcc", HANGING, calls=str(calls))))
    monkeypatch.setattr(native, "BUILD_TIMEOUT_S", 0.5)
    assert native.load() is None and _calls(calls) == 1
    marker = next(fresh.glob("dpscan-*.failed"))
    assert marker.read_text() == f"{tmp_path / 'slowcc'} failed: no library after 0.5 s\n"
    monkeypatch.setattr(native, "_state", {})
    assert native.load() is None and _calls(calls) == 1  # remembered: not run again
    hour_ago = marker.stat().st_mtime - native.TIMEOUT_REMEMBERED_S - 60
    os.utime(marker, (hour_ago, hour_ago))
    monkeypatch.setattr(native, "_state", {})
    assert native.load() is None and _calls(calls) == 2  # expired: tried again, remembered anew
    assert marker.stat().st_mtime > hour_ago + 60
    # an error's marker, as old, still holds
    monkeypatch.setenv("CC", str(_compiler(tmp_path / "badcc", FAILING, calls=str(calls), what="boom")))
    monkeypatch.setattr(native, "_state", {})
    assert native.load() is None and _calls(calls) == 3
    os.utime(marker, (hour_ago, hour_ago))
    monkeypatch.setattr(native, "_state", {})
    assert native.load() is None and _calls(calls) == 3


def test_a_build_deletes_temporary_files_older_than_an_hour(fresh: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed build leaves its temporary file; the next successful build deletes it once it is
    older than any build can run, and leaves a young one (another process may be writing it)."""
    fresh.mkdir(parents=True, mode=0o700)
    stale, young = fresh / "dpscan-0011223344556677.aaaa.tmp", fresh / "dpscan-0011223344556677.bbbb.tmp"
    for path in (stale, young):
        path.write_text("half a library")
    old = stale.stat().st_mtime - native.STALE_TMP_S - 60
    os.utime(stale, (old, old))
    monkeypatch.setenv("CC", str(_compiler(tmp_path / "goodcc", BUILDING, calls=str(tmp_path / "calls"))))
    native.load()
    assert not stale.exists() and young.exists()
    assert len(list(fresh.glob("dpscan-*.so"))) == 1
