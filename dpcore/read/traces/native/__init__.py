"""The native scan of the traceEvents array (scan.c), built on first use and loaded with ctypes.

Why native code: the numpy scan (:mod:`dpcore.read.traces.bytescan`) spends ~85 % of a rank's
first read walking the JSON, in a dozen vectorised passes of a few MB each; one pass of C over
the same bytes does that part ~10x faster, and no JSON library did it for less than the numpy
scan did (columns.py). scan.c writes, for each complete event, ts/dur, the integer args and the
ids of the text values among their distinct raw texts into preallocated numpy arrays;
bytescan's Scanner then decodes each distinct raw text exactly as it does its own, so both
paths end in the same Columns.

Why compiled here and not shipped: the README's set-up is ``pip install -r requirements.txt``,
run from the source tree. The first call compiles scan.c with the system C compiler (``cc``, or
``$CC``) into a per-user cache folder (``$XDG_CACHE_HOME/dpcore/native`` or
``~/.cache/dpcore/native``, else the temp folder), under a name keyed by the source's hash and
the machine, written to a temporary name and renamed, so ranks, workers and processes that race
to build it each load a whole file. A library is only loaded from a folder, and a file, that no
other user can write. Once per machine, like an install. A build that fails is remembered next
to where the library would be (``dpscan-<key>.failed``, the compiler's first error line), so
later processes (each ``analyze`` worker) go straight to the numpy scan instead of each running
the compiler again; a changed scan.c (a new key) or another ``$CC`` tries again, and deleting the
marker does; a build that ran out of time (a compiler starved on a loaded machine) is remembered
for an hour only. A successful build deletes the libraries of older scan.c's (and the markers,
and temporary files over an hour old that killed builds left) in its folder, so they do not
pile up. Without a compiler, or when the build fails, the numpy scan reads every file (same
values) silently; ``DPCORE_NATIVE=0`` turns the native scan off, ``DPCORE_NATIVE=1`` asks for it
(a process then says once on stderr why it could not have it), and :func:`why_not` says why it is
not in use.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["DONE", "FULL", "MORE", "ODD", "NativeScan", "load", "why_not"]

SOURCE = Path(__file__).with_name("scan.c")
MORE, DONE, FULL, ODD = 0, 1, 2, 3  # dp_scan's return values (scan.c)
N_TIME, N_INT, N_TEXT = 2, 5, 8
#: Rows of the output arrays: a window's 'X' events arrive in batches of at most this many, so
#: the arrays stay ~2 MB whatever the window holds.
ROWS = 1 << 14
_state: dict[str, object] = {}  # "lib" (a loaded library or None) and "why" (the reason for None)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dpcore" / "native"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def _first_error(text: str) -> str:
    """The compiler's first error line (else its first line): what a user fixes first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no message")


def _build(out: Path) -> str | None:
    """Compile scan.c into ``out`` (atomically); None on success, else why not. A compiler that
    runs but fails (or hangs) leaves that reason in ``out``'s marker (:func:`_marker`), so that
    the next processes (each ``analyze`` worker, each run) do not spend a build on it again."""
    cc = _compiler()
    fd, tmp = tempfile.mkstemp(prefix=out.stem + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([*cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lm"],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        if done.returncode != 0:
            return _remember(out, f"{shlex.join(cc)} failed: {_first_error(done.stderr or done.stdout)}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
        _prune(out)
        return None
    except subprocess.TimeoutExpired:
        return _remember(out, f"{shlex.join(cc)} failed: {TIMED_OUT} {BUILD_TIMEOUT_S:g} s")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run the C compiler {cc[0]!r}: {exc}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


#: Seconds a build may take (scan.c compiles in about a second; a loaded machine, many times that).
BUILD_TIMEOUT_S = 120.0
#: What a marker says of a build that ran out of time (:func:`_remembered` lets it expire).
TIMED_OUT = "no library after"
#: Seconds a timed-out build is remembered: a compiler that hung once may have been starved by a
#: loaded machine, so it is tried again after this, where a compiler error stays remembered.
TIMEOUT_REMEMBERED_S = 3600.0
#: A temporary file older than this (seconds) is a killed build's leftover, not one in progress
#: (a build is killed after BUILD_TIMEOUT_S): :func:`_prune` deletes it.
STALE_TMP_S = 3600.0


def _marker(lib: Path) -> Path:
    """Where a failed build of ``lib`` is remembered: keyed like the library, so a changed
    scan.c (a new key) is built again."""
    return lib.with_suffix(".failed")


def _remember(lib: Path, why: str) -> str:
    """Write ``why`` (one line) into ``lib``'s marker, if the folder lets us; returns ``why``."""
    try:
        _marker(lib).write_text(why.replace("\n", " ") + "\n")
    except OSError:
        pass
    return why


def _remembered(lib: Path) -> str | None:
    """The failure a marker holds for ``lib``, if it is this compiler's (``$CC`` set to another
    one tries again); None when there is none."""
    marker = _marker(lib)
    try:
        why = marker.read_text().strip()
        age = time.time() - marker.stat().st_mtime
    except (OSError, UnicodeDecodeError):
        return None
    if TIMED_OUT in why and age > TIMEOUT_REMEMBERED_S:
        return None  # a hang may have been a starved machine: build again (and remember anew)
    return why if why.startswith(f"{shlex.join(_compiler())} failed:") else None


def _prune(lib: Path) -> None:
    """Delete the other libraries (and every failure marker) in ``lib``'s folder: each change of
    scan.c leaves a library under its old key, which no dpcore of this source loads again.
    Errors are ignored (another user's file, a file gone already). A process may still have an
    old one loaded: on Linux and macOS unlinking a loaded library leaves its mapping intact.
    A temporary file is deleted only when older than :data:`STALE_TMP_S` (a build killed with
    its process left it); a younger one may be another process's build in progress."""
    now = time.time()
    for path in lib.parent.glob("dpscan-*"):
        try:
            if path == lib:
                continue
            if path.suffix in (".so", ".failed") or (
                    path.suffix == ".tmp" and now - path.stat().st_mtime > STALE_TMP_S):
                path.unlink()
        except OSError:
            pass


def _ours(path: Path) -> bool:
    """Whether ``path`` (a folder or the library) is this user's and no one else can write it: a
    library is loaded from there, and the temporary folder is shared with other users."""
    st = path.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _library_path() -> tuple[Path | None, str | None]:
    """The built library (building it if needed), or None and why."""
    key = hashlib.sha256(SOURCE.read_bytes() + f"{sys.platform}-{platform.machine()}".encode()).hexdigest()[:16]
    why = None
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / f"dpcore-{os.getuid()}"):
        lib = folder / f"dpscan-{key}.so"
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _ours(folder):
                why = f"{folder} is not only this user's to write"
                continue
            if lib.is_file():
                if _ours(lib):
                    return lib, None
                why = f"{lib} is not only this user's to write"
                continue
            failed = _remembered(lib)
            if failed is not None:
                return None, f"{failed} (remembered in {_marker(lib)}: delete it to build again)"
            why = _build(lib)
        except OSError as exc:  # the folder cannot be written: try the next one
            why = f"cannot write {folder}: {exc}"
            continue
        if why is None:
            return lib, None
        break  # no compiler, or one that fails on scan.c: it would fail in the next folder too
    return None, why


def load() -> ctypes.CDLL | None:
    """The native library, built and loaded once per process; None when it is turned off
    (``DPCORE_NATIVE=0``) or cannot be built (see :func:`why_not`)."""
    if os.environ.get("DPCORE_NATIVE", "1").strip() in ("0", "no", "off", "false"):
        return None
    if "lib" not in _state:
        lib, why = None, None
        try:
            path, why = _library_path()
            if path is not None:
                lib = ctypes.CDLL(str(path))
                lib.dp_scan.restype = ctypes.c_int
                lib.dp_scan.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_int, ctypes.c_int64, *[ctypes.c_void_p] * 4)
                lib.dp_new.restype, lib.dp_new.argtypes = ctypes.c_void_p, ()
                lib.dp_free.restype, lib.dp_free.argtypes = None, (ctypes.c_void_p,)
                lib.dp_count.restype, lib.dp_count.argtypes = ctypes.c_int64, (ctypes.c_void_p, ctypes.c_int)
                lib.dp_raw.restype = ctypes.c_void_p
                lib.dp_raw.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64))
        except (OSError, AttributeError, ValueError) as exc:  # AttributeError: no os.getuid, no dp_scan
            lib, why = None, f"cannot load the native scanner: {exc}"
        _state["lib"], _state["why"] = lib, why
        if lib is None and os.environ.get("DPCORE_NATIVE", "").strip() == "1":  # asked for: say why not, once
            print(f"dpcore: the native trace scan is not in use: {why}; the numpy scan reads the traces",
                  file=sys.stderr)
    found = _state["lib"]
    return found if isinstance(found, ctypes.CDLL) else None


def why_not() -> str | None:
    """Why the native scan is not in use (None when it is): one line for ``doctor``-like output."""
    if os.environ.get("DPCORE_NATIVE", "1").strip() in ("0", "no", "off", "false"):
        return "turned off by DPCORE_NATIVE=0"
    if load() is None:
        return f"not built ({_state.get('why')}): traces are read by the numpy scan (same values)"
    return None


class NativeScan:
    """One file's native scan: the state in C (the distinct raw texts of each text field) and
    the output arrays, reused between calls."""

    def __init__(self, lib: ctypes.CDLL, rows: int = ROWS) -> None:
        self.lib, self.rows = lib, rows
        self.times = np.empty((N_TIME, rows), np.float64)
        self.ints = np.empty((N_INT, rows), np.int64)
        self.texts = np.empty((N_TEXT, rows), np.int32)
        self.out = np.zeros(3, np.int64)
        self.state = lib.dp_new()
        if not self.state:
            raise MemoryError("native scan: no memory for its tables")

    def __del__(self) -> None:
        state, self.state = getattr(self, "state", None), None
        if state:
            self.lib.dp_free(state)

    def scan(self, buf: bytes, pos: int, first: bool) -> tuple[int, int, int, int]:
        """(status, next, entries, 'X' rows written) of one call over buf[pos:] (see scan.c)."""
        ptr = ctypes.c_void_p
        status = self.lib.dp_scan(self.state, buf, len(buf), pos, int(first), self.rows,
                                  ptr(self.times.ctypes.data), ptr(self.ints.ctypes.data),
                                  ptr(self.texts.ctypes.data), ptr(self.out.ctypes.data))
        return int(status), int(self.out[0]), int(self.out[1]), int(self.out[2])

    def raws(self, k: int, start: int) -> list[bytes]:
        """The distinct raw texts of text field k (in scan.c's order) from id ``start`` on."""
        size = ctypes.c_int64()
        out = []
        for i in range(start, self.lib.dp_count(self.state, k)):
            at = self.lib.dp_raw(self.state, k, i, ctypes.byref(size))
            out.append(ctypes.string_at(at, size.value) if at else b"")
        return out
