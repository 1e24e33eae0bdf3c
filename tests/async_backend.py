"""``dpcore_async``: a CPU process-group backend with NCCL's completion semantics, for tests.

Why: NCCL completes a collective's future when the collective is *enqueued* (a CUDA-aware
future: its value is ready for the stream, not for the host), and ``work.wait()`` only makes
the current stream wait. Host code that stamps "the collective ended" in a future's callback or
after a wait therefore reads the launch time on a GPU. This machine has no GPU, so this backend
reproduces those semantics on CPU tensors, where a test can see them:

* a call returns at once; its work runs later, in call order, on the group's *stream*: one
  worker thread per group that takes each op in turn, waits for the real math (an inner gloo
  group started at the call, so every rank issues gloo's ops in program order and no ordering
  of sends and receives can deadlock), then sleeps ``delay_s`` (``DPCORE_ASYNC_DELAY_MS``):
  an op ends at least ``delay_s`` after the previous op of its stream ended, as kernels on one
  CUDA stream do;
* ``work.get_future()`` is already completed when the call returns (NCCL's future);
* ``work.is_completed()`` turns true when the stream finished the op; ``work.wait()`` blocks
  until then (``DPCORE_ASYNC_WAIT=blocking``, the default: host code reading the result after
  a wait sees it, as it would after NCCL's wait plus a stream sync) or returns at once
  (``DPCORE_ASYNC_WAIT=stream``: NCCL's default wait, which only orders the stream; the tensor
  may still be written after it returns);
* :meth:`AsyncTestProcessGroup.record_event` is "record a CUDA event on the current stream":
  a marker queued behind every op issued so far, stamped (``perf_counter_ns``) when the stream
  reaches it. With ``DPCORE_ASYNC_STREAMS=2`` the group has a second stream, the *current* one
  (the compute stream of a CUDA rank), and markers go there: they do not wait for the group's ops,
  except where a ``wait()`` made the current stream wait for one (NCCL's ``synchronizeStream``:
  in ``stream`` wait mode a wait queues "wait for this op" on the current stream). A mark taken
  *before* a wait then reads the launch, one taken after it the completion. An op does not
  start on the group's stream before the current stream reached the point where it was issued
  (NCCL's other ``syncStream``: the NCCL stream waits for an event recorded on the current
  stream at launch), so a mark taken before a call never reads later than the op's start, even
  when the current stream's thread waits for the GIL. (A future's callback
  cannot be told apart here, so with 2 streams a mark in a callback does not wait for the op;
  on CUDA it does, see the recorder's notes.) :class:`StreamEvent` has the ``torch.cuda.Event``
  calls the recorder's event clock uses (``record`` happens at creation, ``synchronize``,
  ``elapsed_time``, ``query``).

Configuration is read from the environment when a group is created, so it reaches spawned
ranks: :func:`configure` sets it. Register with :func:`register` (idempotent), then
``dist.init_process_group(BACKEND, ...)``. :class:`StreamEventClock` is the recorder's event
clock on such a group (the stand-in for CUDA events).
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from dpcore.write.capture.comm_log import EventClock
from tests.spawned import leave

BACKEND = "dpcore_async"
ENV_DELAY_MS = "DPCORE_ASYNC_DELAY_MS"
ENV_WAIT = "DPCORE_ASYNC_WAIT"
ENV_STREAMS = "DPCORE_ASYNC_STREAMS"
WAIT_MODES = ("blocking", "stream")


def configure(delay_ms: float = 0.0, wait: str = "blocking", streams: int = 1) -> None:
    """Set the delay per op, the wait mode and the number of streams (1: markers behind the ops;
    2: markers on a current stream of their own) for groups created from now on (this process
    and the ranks it spawns afterwards)."""
    if wait not in WAIT_MODES:
        raise ValueError(f"unknown wait mode {wait!r}; valid choices: {', '.join(WAIT_MODES)}")
    if streams not in (1, 2):
        raise ValueError(f"streams must be 1 or 2, got {streams!r}")
    os.environ[ENV_DELAY_MS] = str(float(delay_ms))
    os.environ[ENV_WAIT] = wait
    os.environ[ENV_STREAMS] = str(streams)


class StreamEvent:
    """A marker on a group's stream: ``time_ns`` is set when the stream reached it."""

    def __init__(self) -> None:
        self.time_ns = -1
        self._done = threading.Event()

    def _stamp(self) -> None:
        self.time_ns = time.perf_counter_ns()
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        if not self._done.wait(60):
            raise RuntimeError("dpcore_async: a stream event did not complete in 60 s")

    def elapsed_time(self, end: StreamEvent) -> float:
        """Milliseconds from this event to ``end`` (both must have completed), as CUDA's."""
        if not (self.query() and end.query()):
            raise RuntimeError("elapsed_time of an event that has not completed")
        return (end.time_ns - self.time_ns) / 1e6


class _Op:
    """One op on the stream: the inner gloo work (None: a marker only), its end."""

    __slots__ = ("inner", "done", "t_end_ns", "error", "event", "after")

    def __init__(self, inner: Any, event: StreamEvent | None = None,
                 after: StreamEvent | None = None) -> None:
        self.inner = inner
        #: a marker on the current stream this op waits for before it starts (streams=2)
        self.after = after
        self.done = threading.Event()
        self.t_end_ns = -1
        self.error: BaseException | None = None
        self.event = event


class AsyncWork(dist.Work):
    """The work of one op: future completed at enqueue, completion as the stream sees it."""

    def __init__(self, op: _Op, result: Any, wait_blocks: bool,
                 order_current: Callable[[_Op], None] | None = None) -> None:
        super().__init__()
        self._op, self._wait_blocks, self._order = op, wait_blocks, order_current
        self._fut: torch.futures.Future = torch.futures.Future()
        self._fut.set_result(result)  # as NCCL: completed when the op is enqueued

    def wait(self, timeout: Any = None) -> bool:
        if self._wait_blocks:
            if not self._op.done.wait(60):
                raise RuntimeError("dpcore_async: an op did not complete in 60 s")
            if self._op.error is not None:
                raise RuntimeError(f"dpcore_async: the inner op failed: {self._op.error}")
        elif self._order is not None:  # the current stream waits for the op, the host does not
            self._order(self._op)
        return True

    def is_completed(self) -> bool:
        return self._op.done.is_set()

    def is_success(self) -> bool:
        return self._op.done.is_set() and self._op.error is None

    def get_future(self) -> torch.futures.Future:
        return self._fut

    @property
    def end_ns(self) -> int:
        """``perf_counter_ns`` when the stream finished this op (-1: not yet)."""
        return self._op.t_end_ns


class AsyncTestProcessGroup(dist.ProcessGroup):
    """See the module docstring. ``delay_s``: the time each op takes on the stream after its
    math is done; ``wait_blocks``: whether ``wait()`` blocks until the op completed."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta,
                 delay_s: float = 0.0, wait_blocks: bool = True, streams: int = 1) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.delay_s, self.wait_blocks = float(delay_s), bool(wait_blocks)
        self.streams = int(streams)
        self._inner = dist.ProcessGroupGloo(dist.PrefixStore("dpcore_async_inner", store), rank,
                                            size, timeout)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        #: every op's work, in issue order (tests read their real ends from here)
        self.works: list[AsyncWork] = []
        threading.Thread(target=self._stream, name="dpcore-async-stream", daemon=True).start()
        #: the current stream (streams=2): markers, and "wait for this op" items
        self._current: queue.SimpleQueue = queue.SimpleQueue()
        if self.streams == 2:
            threading.Thread(target=self._current_stream, name="dpcore-async-current",
                             daemon=True).start()

    # -- the stream ----------------------------------------------------------------------
    def _stream(self) -> None:
        while True:
            op: _Op = self._queue.get()
            if op.after is not None and not op.after._done.wait(60):  # its launch, on the current stream
                op.error = RuntimeError("dpcore_async: the current stream did not reach an op's launch in 60 s")
            if op.inner is not None:
                try:
                    op.inner.wait()
                except BaseException as exc:  # noqa: BLE001 - reported by the op's wait
                    op.error = exc
                if self.delay_s > 0:
                    time.sleep(self.delay_s)
            op.t_end_ns = time.perf_counter_ns()
            if op.event is not None:
                op.event._stamp()
            op.done.set()

    def _current_stream(self) -> None:
        while True:
            item = self._current.get()
            if isinstance(item, StreamEvent):
                item._stamp()
            else:  # an op this stream was made to wait for
                item.done.wait()

    def _enqueue(self, start: Callable[[], Any], result: Any) -> AsyncWork:
        after = None
        if self.streams == 2:
            after = StreamEvent()
            self._current.put(after)
        op = _Op(start(), after=after)
        self._queue.put(op)
        work = AsyncWork(op, result, self.wait_blocks,
                         self._current.put if self.streams == 2 else None)
        self.works.append(work)
        return work

    def record_event(self) -> StreamEvent:
        """A :class:`StreamEvent` recorded now on the current stream (streams=1: the group's
        stream, behind every op issued so far)."""
        ev = StreamEvent()
        if self.streams == 2:
            self._current.put(ev)
        else:
            self._queue.put(_Op(None, ev))
        return ev

    def synchronize(self) -> None:
        """Block until the group's stream (and the current stream) finished everything issued."""
        ev = StreamEvent()
        self._queue.put(_Op(None, ev))
        ev.synchronize()
        if self.streams == 2:
            self.record_event().synchronize()

    # -- the ops ---------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - the C++ trampoline's name
        return BACKEND

    def getRank(self) -> int:  # noqa: N802
        return self._rank

    def getSize(self) -> int:  # noqa: N802
        return self._size

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> AsyncWork:
        o = dist.AllreduceOptions()
        if opts is not None:
            o.reduceOp = opts.reduceOp
        return self._enqueue(lambda: self._inner.allreduce(tensors, o), tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> AsyncWork:
        o = dist.BroadcastOptions()
        if opts is not None:
            o.rootRank, o.rootTensor = opts.rootRank, opts.rootTensor
        return self._enqueue(lambda: self._inner.broadcast(tensors, o), tensors)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> AsyncWork:
        return self._enqueue(lambda: self._inner.allgather(output_tensors, input_tensors),
                             output_tensors)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                        opts: Any = None) -> AsyncWork:
        return self._enqueue(lambda: self._inner._allgather_base(output, input), [output])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> AsyncWork:
        return self._enqueue(lambda: self._inner.send(tensors, dst, tag), tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> AsyncWork:
        return self._enqueue(lambda: self._inner.recv(tensors, src, tag), tensors)

    def barrier(self, opts: Any = None) -> AsyncWork:
        return self._enqueue(lambda: self._inner.barrier(), [])


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> AsyncTestProcessGroup:
    wait = os.environ.get(ENV_WAIT, "blocking")
    if wait not in WAIT_MODES:
        raise ValueError(f"{ENV_WAIT}={wait!r}; valid choices: {', '.join(WAIT_MODES)}")
    streams = os.environ.get(ENV_STREAMS, "1")
    if streams not in ("1", "2"):
        raise ValueError(f"{ENV_STREAMS}={streams!r}; valid choices: 1, 2")
    return AsyncTestProcessGroup(store, rank, size, timeout,
                                 delay_s=float(os.environ.get(ENV_DELAY_MS, "0")) / 1e3,
                                 wait_blocks=wait == "blocking", streams=int(streams))


def register() -> None:
    """Register :data:`BACKEND` with ``torch.distributed`` (once per process)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


class StreamEventClock(EventClock):
    """The recorder's event clock on a ``dpcore_async`` group: each mark is a
    :class:`StreamEvent` on the group's stream (what ``CudaEventClock`` records on the current
    CUDA stream); resolution is :class:`EventClock`'s own, unchanged."""

    def __init__(self, group: Any = None) -> None:
        self.pg = group_of(group)

    def event(self) -> StreamEvent:
        return self.pg.record_event()

    def drain(self) -> bool:
        """Wait until the group's stream (and the current stream) ran everything issued, as
        ``torch.cuda.synchronize`` does for :class:`CudaEventClock`."""
        self.pg.synchronize()
        return True


def group_of(group: Any = None) -> AsyncTestProcessGroup:
    """The :class:`AsyncTestProcessGroup` behind ``group`` (default: the world)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, AsyncTestProcessGroup):
        raise TypeError(f"not a {BACKEND} group: {type(pg).__name__}")
    return pg


def run_rank(rank: int, n: int, tmp: str, delay_ms: float, wait: str,
             body: Callable[[int, int], dict[str, Any]]) -> NoReturn:
    """One rank of a test job on this backend: join a ``dpcore_async`` group of ``n`` ranks (each
    op done ``delay_ms`` after its call, waits as ``wait``), run ``body(rank, n)`` and write what it
    returns (or the traceback) to ``tmp/rank<r>.json`` for :func:`job_reports`.

    Why it ends with :func:`tests.spawned.leave`: once the report (or the traceback) is on disk,
    interpreter teardown can only lose the rank to gloo's threads aborting it after its work is
    done (tests/spawned.py says how)."""
    report: dict[str, Any] = {}
    try:
        register()
        configure(delay_ms, wait)
        dist.init_process_group(BACKEND, init_method=f"file://{tmp}/store", rank=rank, world_size=n)
        report = body(rank, n)
    except Exception:  # noqa: BLE001 - reported to the test
        report["error"] = traceback.format_exc()
    (Path(tmp) / f"rank{rank}.json").write_text(json.dumps(report))
    leave()


def job_reports(worker: Callable[[int, int, str], None], n: int, folder: Path) -> list[dict[str, Any]]:
    """Spawn ``worker`` (a module-level function that calls :func:`run_rank`) on ``n`` ranks and
    return their reports, failing the test with the traceback of a rank that raised."""
    from tests.write.dp.test_comm_algorithms import comm_spawn
    out = comm_spawn(worker, n, folder)
    for r, rep in enumerate(out):
        assert "error" not in rep, f"rank {r}:\n{rep['error']}"
    return out
