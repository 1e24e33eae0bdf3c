"""Which CPUs other dpcore runs on this machine have pinned their ranks to.

Why: every run pins its ranks from the first usable CPU on, so two runs at once (two terminals,
two dashboard users) put their ranks on the same cores; each then measures the other, and both
were recorded as not oversubscribed. A run that pins writes a claim (its pid and CPUs) into one
folder shared by the machine's runs (``$DPCORE_LOCK_DIR``, default the temporary folder) and
removes it when it ends; a run that starts reads the live claims of others, and records the
CPUs it shares (``environment.cpus_shared_with``) and its jobs as oversubscribed. A claim
whose process is gone (``kill -9``) is ignored and removed by the next reader.

The run that started first learns of the later one too: the later run leaves it a note
(:func:`tell`, a ``<pid>.seen-by-<pid>`` file beside the claims), which the first reads at its
next job's end (:func:`told`). So of two concurrent runs both flag the jobs that overlapped,
even when the later run starts and ends within one of the first run's jobs.
"""
from __future__ import annotations

import atexit
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

#: Environment variable naming the folder of claims (shared with the dashboard's profile lock).
CLAIM_DIR_ENV = "DPCORE_LOCK_DIR"


def claim_dir() -> Path:
    return Path(os.environ.get(CLAIM_DIR_ENV) or tempfile.gettempdir()) / "dpcore-cpu-claims"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def claim(cpus: Iterable[int]) -> Path | None:
    """Record that this process's ranks are pinned to ``cpus``; the claim is removed by
    :func:`release` or when this process exits. None when the folder cannot be written (then
    nobody learns of this run: a detection lost, never a run refused)."""
    path = claim_dir() / f"{os.getpid()}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"pid": os.getpid(), "cpus": sorted(set(cpus))}))
    except OSError:
        return None
    atexit.register(release, path)
    return path


def release(path: Path | None) -> None:
    """Remove a claim (and the notes left to its run) or one note."""
    if path is None:
        return
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
    if path.suffix == ".json" and path.stem.isdigit():
        for note in _notes_to(int(path.stem)):
            release(note)


def shared_with(cpus: Iterable[int]) -> dict[int, list[int]]:
    """{pid: the CPUs of ``cpus`` it has claimed} for every other live dpcore run."""
    mine, out = set(cpus), {}
    try:
        files = list(claim_dir().glob("*.json"))
        notes = list(claim_dir().glob("*.seen-by-*"))
    except OSError:
        return {}
    for note in notes:  # left to a run that ended before the note was written
        target = note.name.split(".", 1)[0]
        if target.isdigit() and not _alive(int(target)):
            release(note)
    for f in files:
        try:
            doc = json.loads(f.read_text())
            pid, theirs = int(doc["pid"]), {int(c) for c in doc["cpus"]}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid == os.getpid():
            continue
        if not _alive(pid):
            release(f)
            continue
        if mine & theirs:
            out[pid] = sorted(mine & theirs)
    return out


def _notes_to(pid: int) -> list[Path]:
    try:
        return list(claim_dir().glob(f"{pid}.seen-by-*"))
    except OSError:
        return []


def tell(shared: dict[int, list[int]]) -> None:
    """Leave each run of ``shared`` ({pid: CPUs}, from :func:`shared_with`) a note that this
    run's ranks are pinned to those CPUs too (best effort, as :func:`claim`)."""
    for pid, cpus in shared.items():
        path = claim_dir() / f"{pid}.seen-by-{os.getpid()}"
        try:
            path.write_text(json.dumps({"pid": os.getpid(), "cpus": sorted(cpus)}))
        except OSError:
            continue


def told() -> dict[int, list[int]]:
    """{pid: CPUs} of the runs that started beside this one and left it a note since the last
    call (:func:`tell`); the notes are removed as they are read."""
    out: dict[int, list[int]] = {}
    for note in _notes_to(os.getpid()):
        try:
            doc = json.loads(note.read_text())
            out[int(doc["pid"])] = sorted({int(c) for c in doc["cpus"]})
        except (OSError, ValueError, KeyError, TypeError):
            pass
        release(note)
    return out
