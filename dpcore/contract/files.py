"""Writing run files: atomic writes, CSV text, run ids and timestamps; and opening one for
reading so that no link leads the reader out of its run (:func:`open_inside`). Stdlib only.

Why in the contract wing: both wings write run directories (the engine while profiling, the
read wing's importer when it turns foreign traces into a run), and a reader must never see half
a file from either. Every file is written to a temporary name in the same folder and
``os.replace``-d into place, so a reader sees either the old complete file or the new one.
"""
from __future__ import annotations

import csv
import datetime as _dt
import errno
import io
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from dpcore.contract.tracefile import NotRegularFileError, open_regular

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read the process umask once (os.umask can only be read by setting it)


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, then rename over ``path``."""
    with atomic_file(path) as f:
        f.write(data)


@contextmanager
def atomic_file(path: Path | str) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s content into as it comes: a temporary file beside it,
    fsync-ed and renamed over ``path`` when the block ends, removed if it raises. So a file of
    millions of rows (collectives.csv of a 1,024-rank import) never exists whole in memory, and
    a reader still sees either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; a run is for everyone to read
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def csv_text(rows: list[dict[str, Any]], columns: list[str], header: bool = True) -> str:
    """Rows -> CSV text with a fixed column order (missing keys become empty cells); without
    the header line for a chunk that follows another."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    if header:
        w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def now_iso() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def new_run_id(name: str | None = None) -> str:
    """Sortable, collision-free id: time to the second, optional name, random suffix."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in (name or ""))[:40]
    return "-".join(p for p in (stamp, safe, secrets.token_hex(2)) if p)


class OutsideFolderError(NotRegularFileError):
    """A file that resolves (links followed) outside the folder it was read as part of; the
    message is one line naming it and the folder."""


def _within(path: Path, top: Path) -> bool:
    try:
        return path.resolve().is_relative_to(top)
    except (OSError, RuntimeError):  # RuntimeError: a link loop
        return False


def open_inside(path: str | Path, folder: str | Path, max_bytes: int) -> BinaryIO:
    """Open ``path``, a file of the run (or dump folder) ``folder``, for binary reading: only a
    regular file of at most ``max_bytes`` (:func:`~dpcore.contract.tracefile.open_regular`)
    whose real path, links resolved, lies inside ``folder`` (also resolved).

    Why: every file of a run is read as part of that run; a ``live.csv`` or ``steps.csv``
    that is a link to another user's file, or to a file outside the dashboard's profiles
    folder, must not be shown as the run's. Checked before the open (the path resolved) and
    after it (the descriptor's real path, where ``/proc/self/fd`` tells it), so a link swapped
    in between is caught too. FileNotFoundError when missing, :class:`OutsideFolderError`
    for a link that leaves, NotRegularFileError for a special or oversized file."""
    p = Path(path)
    top = Path(folder).resolve()
    if not _within(p, top):
        if not os.path.lexists(p):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(p))
        raise OutsideFolderError(f"{p} is a link that leads outside {Path(folder)}; not read")
    fh = open_regular(p, max_bytes)
    try:
        real: str | None = os.readlink(f"/proc/self/fd/{fh.fileno()}")
    except OSError:  # no /proc (not Linux): the check before the open stands
        real = None
    if real is not None and not Path(real).is_relative_to(top):
        fh.close()
        raise OutsideFolderError(f"{p} is a link that leads outside {Path(folder)}; not read")
    return fh
