"""Which CPUs other dpcore runs on this machine have pinned their ranks to.

Why: every run pins its ranks from the first usable CPU on, so two runs at once (two terminals,
two dashboard users) put their ranks on the same cores; each then measures the other, and both
were recorded as not oversubscribed. A run that pins writes a claim (its pid and CPUs) into one
folder shared by the machine's runs (``$DPCORE_LOCK_DIR``, default the temporary folder) and
removes it when it ends; a run that starts reads the live claims of others, and records the
CPUs it shares (``environment.cpus_shared_with``) and its jobs as oversubscribed. A claim
whose process is gone (``kill -9``) is ignored and removed by the next reader.
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
    if path is not None:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def shared_with(cpus: Iterable[int]) -> dict[int, list[int]]:
    """{pid: the CPUs of ``cpus`` it has claimed} for every other live dpcore run."""
    mine, out = set(cpus), {}
    try:
        files = list(claim_dir().glob("*.json"))
    except OSError:
        return {}
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
