"""Writing run files: atomic writes, CSV text, run ids and timestamps (stdlib only).

Why in the contract wing: both wings write run directories (the engine while profiling, the
read wing's importer when it turns foreign traces into a run), and a reader must never see half
a file from either. Every file is written to a temporary name in the same folder and
``os.replace``-d into place, so a reader sees either the old complete file or the new one.
"""
from __future__ import annotations

import csv
import datetime as _dt
import io
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

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
