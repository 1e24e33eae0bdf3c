"""A rank's side of the live view and the hang lab: one daemon thread and one store client.

Why the job's store and a thread: rows must reach rank 0 across nodes without a shared file
system, and the timed steps must not pay for it. The main thread only appends a row to a list
(``put``, well under a microsecond); every :data:`SEND_PERIOD_S` the thread sends what queued as
whole CSV lines under one store key and bumps this rank's counter, so rank 0's collector
(:mod:`dpcore.write.capture.job_monitor`) sees a row within ~0.5 s of the step's end.

The same thread answers the hang watchdog: when the job's ``hang/request`` key appears it
writes this rank's flight-recorder entries (JSON, ``torch._C._distributed_c10d``) and its
Python stacks (``faulthandler``, all threads) into the store. It needs the GIL, which a rank
blocked in a gloo collective or in ``time.sleep`` has released.

Store keys (all under ``dpcore/<job_id>/``): ``live/<rank>/n`` (batches sent) and
``live/<rank>/<k>`` (batch k), ``hang/request``, ``hang/<rank>/fr``, ``hang/<rank>/stack``.
"""
from __future__ import annotations

import csv
import datetime as _dt
import faulthandler
import io
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from dpcore.contract import runformat
from dpcore.contract.intervals import comm_start, step_comm, union_length
from dpcore.write.capture.comm_log import row_interval

#: how often a rank sends its queued live rows and looks for a hang request
SEND_PERIOD_S = 0.5
#: how long a row waits for its step's async collectives to be stamped as ended
COMPLETION_WAIT_S = 1.0
#: flight-recorder entries each rank keeps (TORCH_FR_BUFFER_SIZE, set by the launcher)
FR_BUFFER = 2000


def key(job_id: str, *parts: object) -> str:
    """A store key of this job (the collector and the ranks build them here, once)."""
    return "/".join(("dpcore", job_id, *map(str, parts)))


def connect(addr: tuple[str, int] | None, timeout_s: float = 30.0) -> Any:
    """A client of the job's TCP store at ``addr`` (host, port), or None without one (or when
    it cannot be reached: the job then runs without live rows, never fails for them)."""
    if addr is None:
        return None
    try:
        return dist.TCPStore(addr[0], int(addr[1]), is_master=False, wait_for_workers=False,
                             timeout=_dt.timedelta(seconds=timeout_s))
    except Exception:  # noqa: BLE001 - live rows are an extra; the job's own store is torch's
        return None


def live_lines(rows: list[dict]) -> str:
    """live.csv lines (no header) for ``rows``, columns from the run format; None is empty."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for row in rows:
        w.writerow(["" if row.get(c) is None else row[c] for c in runformat.LIVE_COLUMNS])
    return buf.getvalue()


def live_row(steps_row: dict) -> dict:
    """A step's live.csv row from its steps.csv row (comm_ms is filled by the channel's thread;
    exposed comm is not known while the run runs)."""
    return {"job_id": steps_row["job_id"], "rank": steps_row["rank"], "step": steps_row["step"],
            "profiled": steps_row["profiled"],
            "t_end_ns": int(steps_row["t_start_ns"] + steps_row["step_ms"] * 1e6),
            "wall_time": round(time.time(), 3), "step_ms": steps_row["step_ms"],
            "comm_ms": None, "exposed_comm_ms": None}


def has_flight_recorder() -> bool:
    """Can this torch dump its flight recorder as JSON for every backend (``_dump_fr_trace_json``)?
    torch 2.4, the floor, has only NCCL's pickled dump: there a hang is caught and the ranks'
    stacks are kept, but no dump can name the rank or the collective."""
    import torch._C._distributed_c10d as c10d

    return hasattr(c10d, "_dump_fr_trace_json")


def fr_json() -> bytes:
    """This process's flight-recorder entries as JSON (b"" when the recorder is unavailable)."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]  # no stub
        return bytes(_dump_fr_trace_json(True, False))
    except Exception:  # noqa: BLE001 - an old torch or a build without the recorder
        return b""


def python_stacks() -> str:
    """Every thread's Python stack, as ``faulthandler`` writes it (it needs a real file)."""
    with tempfile.TemporaryFile(mode="w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read()


class RankChannel:
    """Sends this rank's live rows and answers a hang request (see module docstring).

    ``store`` None (no store: a world of one without a group) makes it a no-op sender."""

    def __init__(self, store: Any, job_id: str, rank: int, world_size: int,
                 period_s: float = SEND_PERIOD_S) -> None:
        self.store, self.job_id, self.rank, self.world_size = store, job_id, rank, world_size
        self.period_s = period_s
        self._rows: list[tuple[dict, list[list[Any]], float]] = []
        self._pending: list[tuple[dict, list[list[Any]], float]] = []
        self._sent = 0
        self._stop = threading.Event()
        self._answered = False
        #: CPU time this channel's thread used (ns): what it costs the rank, for the benchmark
        self.cpu_ns = 0
        self._thread: threading.Thread | None = None
        if store is not None:
            self._thread = threading.Thread(target=self._run, name="dpcore-rank-channel",
                                            daemon=True)
            self._thread.start()

    def put(self, row: dict, collectives: Sequence[list[Any]] = ()) -> None:
        """Queue one step's live row. ``collectives``: the step's collective rows
        (:meth:`Recorder.rows_since`), from which the thread computes ``comm_ms`` with the
        steps.csv rule once every one has ended (an async one is stamped by its callback).
        Main thread, no I/O."""
        self._rows.append((row, list(collectives), time.monotonic()))

    def _with_comm(self, row: dict, refs: list[list[Any]]) -> dict:
        colls = [row_interval(r) for r in refs]
        colls = [c for c in colls if c[2] is not None and c[2] >= 0]
        if row.get("comm_ms") in (None, "") and (colls or self.world_size > 1):
            start = comm_start([c[0] for c in colls], [c[1] if c[1] is not None else -1
                                                       for c in colls])
            clipped = step_comm(start, [c[2] for c in colls], row["t_end_ns"] - row["step_ms"] * 1e6,
                                row["step_ms"], self.world_size)
            row = {**row, "comm_ms": round(union_length(*clipped) / 1e6, 6)}
        return row

    def flush(self, final: bool = False) -> None:
        """Send the queued rows whose collectives all ended (or that waited
        :data:`COMPLETION_WAIT_S`; ``final``: all) as one batch of whole lines."""
        if self.store is None:
            return
        rows, self._rows = self._rows, []  # list swap: atomic under the GIL
        now, queue = time.monotonic(), self._pending + rows
        ready = [q for q in queue if final or now - q[2] > COMPLETION_WAIT_S
                 or all(row_interval(r)[2] >= 0 for r in q[1])]
        self._pending = [q for q in queue if not any(q is r for r in ready)]
        if not ready:
            return
        text = live_lines([self._with_comm(r, c) for r, c, _ in ready])
        self.store.set(key(self.job_id, "live", self.rank, self._sent), text)
        self._sent += 1
        self.store.add(key(self.job_id, "live", self.rank, "n"), 1)

    def _answer_hang(self) -> None:
        if self._answered or not self.store.check([key(self.job_id, "hang", "request")]):
            return
        self._answered = True
        self.store.set(key(self.job_id, "hang", self.rank, "stack"), python_stacks())
        self.store.set(key(self.job_id, "hang", self.rank, "fr"), fr_json())

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            t0 = time.thread_time_ns()
            try:
                self.flush()
                self._answer_hang()
            except Exception:  # noqa: BLE001 - the store went away: the job is ending
                return
            finally:
                self.cpu_ns += time.thread_time_ns() - t0

    def close(self) -> None:
        """Stop the thread and send the last rows (called when the rank's job ends)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        try:
            self.flush(final=True)
        except Exception:  # noqa: BLE001 - a lost live row never fails a job
            pass

