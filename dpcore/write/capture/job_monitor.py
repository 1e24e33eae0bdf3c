"""Rank 0's side of the live view and the hang lab, for one job: collect live rows, watch for
a hang, and when one comes collect every rank's flight recorder and stacks.

Why here and not in the ranks' training loop: the process that writes the run (the launcher
for spawned ranks, rank 0 under torchrun or ``dpcore.record``) polls the job's store a few times
a second; a step is never timed with this work inside it.

live.csv gets whole lines only: each batch a rank sent is a run of complete lines, appended
with ONE ``write`` on a file opened ``O_APPEND``; the header is written once, by creating the
file atomically. A reader that still finds a last line without its newline (a crash mid-write)
drops it (:func:`dpcore.read.rundir.live.read_live`).

The watchdog (:class:`HangWatch`): once a step has ended, if no further step ends for
``hang_timeout_s`` (default :func:`default_hang_timeout`), it asks every rank for its
flight-recorder entries and stacks (:mod:`rank_channel`), writes ``hang/<job_id>/`` and returns
the one-line verdict (:func:`dpcore.contract.flightrec.verdict`) the job fails with.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from dpcore.contract import flightrec, runformat
from dpcore.contract.errors import JobFailed
from dpcore.contract.files import atomic_write_bytes, atomic_write_text, csv_text
from dpcore.write.capture.rank_channel import key

#: the watchdog's floor (s): below it a loaded machine's pause (a GC, another job's burst) could
#: pass for a hang
HANG_FLOOR_S = 20.0
#: the default timeout is this many median steps, when that is above the floor
HANG_STEPS = 50
#: how long the watchdog waits for the ranks' flight-recorder entries and stacks
COLLECT_S = 10.0
#: the verdict where no rank could dump a flight recorder (an older torch: has_flight_recorder)
NO_RECORDER = ("this torch has no flight recorder dump (torch._C._distributed_c10d._dump_fr_trace_json): "
               "the hung rank and collective cannot be named; the ranks' Python stacks are in the hang folder")


def default_hang_timeout(median_step_s: float | None, timeout_s: float) -> float:
    """``--hang-timeout``'s default: HANG_STEPS median steps, at least HANG_FLOOR_S, and below
    ``--timeout`` (at most 80 % of it) so the watchdog, not the timeout, ends a hung job."""
    want = max(HANG_FLOOR_S, HANG_STEPS * (median_step_s or 0.0))
    return min(want, 0.8 * timeout_s)


def append_lines(path: Path, text: str) -> None:
    """Append complete lines with one write (live.csv's header made first, atomically)."""
    if not path.exists():
        try:
            atomic_write_text(path, csv_text([], runformat.LIVE_COLUMNS))
        except OSError:
            return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


class LiveCollector:
    """Moves the ranks' live batches from the store to live.csv (see module docstring)."""

    def __init__(self, store: Any, job_id: str, world_size: int, path: Path | None) -> None:
        self.store, self.job_id, self.world_size, self.path = store, job_id, world_size, path
        self.seen = [0] * world_size

    def poll(self) -> int:
        """Append every batch that arrived; return how many lines were appended."""
        lines = 0
        for r in range(self.world_size):
            n = self.store.add(key(self.job_id, "live", r, "n"), 0)
            for k in range(self.seen[r], n):
                k_name = key(self.job_id, "live", r, k)
                text = self.store.get(k_name).decode("utf-8")
                self.store.delete_key(k_name)
                if text and self.path is not None:
                    append_lines(self.path, text)
                lines += text.count("\n")
            self.seen[r] = n
        return lines


class HangWatch:
    """The per-job watchdog (see module docstring). ``hang_timeout_s`` None: the default."""

    def __init__(self, store: Any, job_id: str, world_size: int, run_dir: Path | None,
                 hang_timeout_s: float | None, timeout_s: float) -> None:
        self.store, self.job_id, self.world_size = store, job_id, world_size
        self.run_dir, self.fixed, self.timeout_s = run_dir, hang_timeout_s, timeout_s
        self.last: float | None = None  # when a step last ended (monotonic); None: none yet
        self.gaps: list[float] = []

    def stepped(self, now: float, timed: bool = True) -> None:
        """A step ended. ``timed``: one step's end seen as it happened (rank 0's progress
        event), so the gap since the last one is a step time for the default limit; a batch of
        live rows only says the job is alive."""
        if timed and self.last is not None:
            self.gaps.append(now - self.last)
        self.last = now

    def limit(self) -> float:
        if self.fixed is not None:
            return self.fixed
        median = statistics.median(self.gaps) if self.gaps else None
        return default_hang_timeout(median, self.timeout_s)

    def check(self, now: float) -> JobFailed | None:
        """The job's failure when it has hung, after collecting what the ranks can tell."""
        if self.last is None or now - self.last < self.limit():
            return None
        waited = now - self.last
        v = self.collect()
        return JobFailed(v.lagging_ranks[0] if v.lagging_ranks else -1,
                         f"hang: no step ended for {waited:.0f} s (--hang-timeout "
                         f"{self.limit():g} s); {v.message}")

    def collect(self) -> flightrec.Verdict:
        """Ask every rank, wait up to COLLECT_S for the answers, write hang/<job_id>/."""
        self.store.set(key(self.job_id, "hang", "request"), b"1")
        want = {r: (key(self.job_id, "hang", r, "fr"), key(self.job_id, "hang", r, "stack"))
                for r in range(self.world_size)}
        got: dict[int, tuple[bytes, str]] = {}
        end = time.monotonic() + COLLECT_S
        while want and time.monotonic() < end:
            for r, keys in list(want.items()):
                if self.store.check(list(keys)):
                    got[r] = (self.store.get(keys[0]), self.store.get(keys[1]).decode("utf-8",
                                                                                      "replace"))
                    del want[r]
            if want:
                time.sleep(0.1)
        dumps: dict[int, dict] = {}
        stacks: dict[int, str] = {}
        for r, (fr, stack) in got.items():
            stacks[r] = stack
            try:
                dumps[r] = json.loads(fr) if fr else {"entries": []}
            except ValueError:
                dumps[r] = {"entries": []}
        v = flightrec.verdict(dumps, self.world_size)
        if got and not any(fr for fr, _ in got.values()):  # no rank could dump its recorder
            v = flightrec.Verdict("unknown", [], -1, "", 0, "", NO_RECORDER)
        if self.run_dir is not None:
            out = runformat.hang_dir(self.run_dir, self.job_id)
            out.mkdir(parents=True, exist_ok=True)
            for r, (fr, stack) in got.items():
                atomic_write_bytes(out / runformat.fr_dump_name(r), fr or b'{"entries": []}')
                atomic_write_text(out / runformat.stack_name(r), stack)
            body = {**v.to_dict(), "no_answer": sorted(want)}
            atomic_write_text(out / runformat.VERDICT_FILE, json.dumps(body, indent=1))
        return v


class JobMonitor:
    """Live rows and the watchdog of one job, polled by whoever writes the run.

    ``attach(store)`` when the job's store exists, then ``poll()`` a few times a second (it
    returns the job's :class:`JobFailed` when it hung), ``close()`` once the ranks are done."""

    def __init__(self, job_id: str, world_size: int, run_dir: Path | None, *,
                 hang_timeout_s: float | None = None, timeout_s: float = 300.0,
                 watch: bool = True, steps_total: int | None = None, store_key: str | None = None) -> None:
        self.job_id, self.world_size, self.run_dir = job_id, world_size, run_dir
        #: the live rows' namespace in the store (default the job's id): unique per recording where
        #: one store outlives several jobs of the same id (``dpcore.record`` on a user's default
        #: group; it runs no watchdog, whose keys stay the job's id in the launcher's per-job store)
        self.store_key = store_key or job_id
        self.steps_total = steps_total
        self.hang_timeout_s, self.timeout_s, self.watch = hang_timeout_s, timeout_s, watch
        self.live: LiveCollector | None = None
        self.hang: HangWatch | None = None

    def attach(self, store: Any) -> None:
        path = Path(self.run_dir) / runformat.LIVE_FILE if self.run_dir is not None else None
        self.live = LiveCollector(store, self.store_key, self.world_size, path)
        if self.watch and self.world_size > 1:  # one rank has no peer to hang on: --timeout
            self.hang = HangWatch(store, self.job_id, self.world_size, self.run_dir,
                                  self.hang_timeout_s, self.timeout_s)

    def stepped(self, event: dict | None = None) -> None:
        """A step ended on rank 0 (its progress event ``{"done": n}``; warm-up steps send one
        too). After the job's last step (``steps_total``) no collective is left to hang in, and
        what remains (a trace's export) may take longer than a step: the watchdog stands down."""
        if self.hang is None:
            return
        if self.steps_total and event and int(event.get("done", 0)) >= self.steps_total:
            self.hang = None
            return
        self.hang.stepped(time.monotonic())

    def poll(self) -> JobFailed | None:
        """Collect live rows, then check for a hang (the job's failure when it hung)."""
        if self.live is None:
            return None
        now = time.monotonic()
        try:
            rows = self.live.poll()
        except Exception:  # noqa: BLE001 - a store hiccup loses live rows, never the job
            rows = 0
        if self.hang is None:
            return None
        if rows:
            self.hang.stepped(now, timed=False)
        return self.hang.check(now)

    def close(self) -> None:
        """The last rows (the ranks flushed theirs before returning)."""
        if self.live is not None:
            try:
                self.live.poll()
            except Exception:  # noqa: BLE001
                pass
