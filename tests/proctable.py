"""The process table, read from /proc: a command's descendants, watched while it runs, and
which of them are still alive afterwards (a zombie is not alive: it runs nothing)."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (children, their children, ...)."""
    kids, out, todo = _children(), set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def alive(pids: set[int]) -> set[int]:
    """The pids of ``pids`` that still run (exist and are not zombies)."""
    out = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(p)
    return out


def wait_gone(pids: set[int], timeout: float) -> tuple[set[int], float]:
    """Wait up to ``timeout`` s for ``pids`` to end: (those still alive, seconds waited)."""
    t0 = time.monotonic()
    left = alive(pids)
    while left and time.monotonic() - t0 < timeout:
        time.sleep(0.02)
        left = alive(left)
    return left, time.monotonic() - t0


class FamilyWatch:
    """Records every descendant of ``pid`` seen while it runs (sampled every 20 ms), so that
    helpers started and ended between two looks at the table are known too."""

    def __init__(self, pid: int) -> None:
        self.pid, self.seen = pid, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen |= descendants(self.pid)
            time.sleep(0.02)

    def stop(self) -> set[int]:
        self._stop.set()
        self._thread.join()
        return self.seen
