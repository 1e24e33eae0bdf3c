"""Low-overhead instrumentation: collective, communication-call and message logs on the shared
clock, phase timers.

Why our own instrumentation instead of relying on the trace: gloo spans in a CPU trace are
incomplete (async work runs on gloo threads that the profiler may not attribute), and timed
steps run *without* the profiler so that the numbers the charts use are not distorted. Every
collective a variant issues goes through :class:`Recorder`, so comm intervals exist with or
without a trace.

Cost model: one ``perf_counter_ns`` per event edge and a list append; rows are turned into
dicts only when the job ends. The ``comm_call#`` trace ranges exist only while the profiler
runs, and a watcher thread only once a work without a future (gloo's reduce-scatter) appears. Where nothing
is recorded (``verify``, users' own loops, the
``allreduce`` timing repeats) the callee gets :data:`NULL_RECORDER`, whose methods do nothing,
so no call site tests for a missing recorder; ``enabled`` lets the rare caller that would
change *how* it runs (DDP's comm hook) decide once.
"""
from __future__ import annotations

import queue
import threading
import time
from numbers import Integral
from typing import Any

import torch
from torch.profiler import record_function

from dpcore.contract.runformat import CALL_COLUMNS, COLLECTIVE_COLUMNS, GRAD_COLUMNS, MESSAGE_COLUMNS, format_ns

_perf_ns = time.perf_counter_ns
#: Whether torch.profiler is recording on this thread (a cheap check: opening a range costs
#: ~10 µs even with no profiler running, so the ranges below exist only in traced steps).
_profiling = torch.autograd._profiler_enabled
#: Trace range names of communication calls: ``comm_call#<op>`` (a launch or a blocking
#: collective) and ``comm_call#wait``; the analysis cuts them out of the trace's compute.
CALL_RANGE = "comm_call#"
WAIT_RANGE = CALL_RANGE + "wait"


def row_interval(row: list[Any]) -> tuple[int, int, int]:
    """(t_launch, t_start, t_end) ns of a collective row (-1: not known / not ended yet). On a
    device job an edge stamped after the last :meth:`Recorder.resolve` is still an event, not ns:
    read as -1 (not ended yet), so the live channel waits for it instead of failing on it."""
    return tuple(v if isinstance(v, Integral) else -1 for v in (row[5], row[6], row[7]))  # type: ignore[return-value]


# -- where the times of a device job come from ---------------------------------------------
# On NCCL a collective's future is completed when the collective is *enqueued* (the future is
# CUDA-aware: ready for the stream, not for the host), and ``work.wait()`` only makes the
# current stream wait for it. A host clock read in a future's callback or after a wait is
# therefore the launch time, and every interval would read about 0 ms. A device job's times
# are instead taken on the device: an :class:`EventClock` records an event on the *current
# stream* at each edge (``mark``), and the events are turned into shared-clock nanoseconds
# after the step (``resolve``). An end event is recorded where the host code used to read the
# clock: after a wait (the current stream now waits for the collective, so the event
# completes when the collective did), or in the future's callback (a CUDA future runs its
# callbacks on a stream that was made to wait for the collective's completion events). A start
# event is recorded right before the launch call: the collective's stream waits for the
# current stream's earlier work, so the collective cannot begin before that event.
#
# Resolution, after the step: every pending event is synchronized, then an anchor event is
# recorded on an idle stream of its own between two host clock reads t0 and t1; the anchor's
# host time is taken as (t0 + t1) / 2 (error at most (t1 - t0) / 2, a few µs), and each event's
# host time is that minus ``event.elapsed_time(anchor)``. The anchor is taken after the step,
# so no device synchronization ever happens inside a step (it would change what is measured).
# CPU jobs keep the host clock: their collectives do complete when the callback runs or the
# wait returns, and their numbers stay exactly what they were.


class EventClock:
    """Times taken on a device stream: ``mark`` records an event on the current stream (no
    host clock read is an interval's end), ``resolve`` turns events into ``perf_counter_ns``
    values once they completed. Subclasses say how an event is made (:meth:`event`): a CUDA
    event here, a test backend's stream marker in the tests (the same resolution runs on it).
    """

    def event(self) -> Any:
        """A timing event recorded now on the current stream (``synchronize`` and
        ``elapsed_time(other)`` in ms, as ``torch.cuda.Event``)."""
        raise NotImplementedError

    #: how many marks were made (a mark counts once its event is recorded)
    _marks = 0
    #: the last anchor that later batches may reuse: (host ns, anchor event, marks before it)
    _last: tuple[int, Any, int] | None = None

    def mark(self) -> Any:
        ev = self.event()
        self._marks += 1
        return ev

    def anchor(self) -> Any:
        """The anchor event, recorded now where nothing is queued before it (so it executes
        between the two host reads around it)."""
        return self.event()

    def drain(self) -> bool:
        """Wait until the device ran everything queued so far, on every stream; True when it
        did. Then every event marked before the anchor that follows has executed before it, and
        a later batch of such events may be placed with the same anchor. The base class cannot
        drain (False: each batch gets its own anchor)."""
        return False

    def resolve(self, events: list[Any]) -> list[int]:
        """``perf_counter_ns`` of each event (waits for them; see the scheme above).

        Batches resolved with no mark made in between share one anchor (where the clock can
        :meth:`drain`): a step's phase marks (the phase timer) and its collectives' edges (the
        recorder), resolved one after the other on the job's one clock, are then placed by the
        same host reading, so the anchor's error (up to half the two host reads around it)
        cannot shift one against the other."""
        if not events:
            return []
        for ev in events:
            ev.synchronize()
        last = self._last
        if last is None or last[2] != self._marks:
            marks = self._marks  # read before the anchor: a mark counted here precedes it
            drained = self.drain()
            t0 = _perf_ns()
            anchor = self.anchor()
            anchor.synchronize()
            t1 = _perf_ns()
            last = ((t0 + t1) // 2, anchor, marks)
            self._last = last if drained else None
        host, anchor = last[0], last[1]
        return [host - round(ev.elapsed_time(anchor) * 1e6) for ev in events]


class CudaEventClock(EventClock):
    """:class:`EventClock` of a CUDA job: ``torch.cuda.Event(enable_timing=True)`` recorded
    on the current stream of ``device`` (default: the current device); the anchor on a stream
    of its own, which nothing else uses, so work still queued on the current stream cannot
    delay it."""

    def __init__(self, device: Any = None) -> None:
        self.device = torch.device(device) if device is not None else None
        self._idle: Any = None

    def event(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def anchor(self) -> Any:
        if self._idle is None:
            self._idle = torch.cuda.Stream(device=self.device)
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self._idle)
        return ev

    def drain(self) -> bool:
        torch.cuda.synchronize(self.device)
        return True


def clock_for(device: Any) -> EventClock | None:
    """The event clock a job on ``device`` times with: CUDA events on a CUDA device, None (the
    host clock) elsewhere."""
    if device is None or torch.device(device).type != "cuda":
        return None
    return CudaEventClock(device)


class Recorder:
    """Per-rank, per-job log of collectives and point-to-point messages.

    ``offset_ns`` is this rank's clock offset to rank 0 (see :mod:`dpcore.write.runtime.clock`), so
    ``now()`` is on the clock that all ranks of the job share. ``step`` is set by the training
    loop; rows logged outside a step carry -1.

    ``clock``: where a collective's and a message's edges are timed. None (CPU jobs): the host
    clock, read when the call returns, the callback runs or the wait returns. An
    :class:`EventClock` (CUDA jobs, :meth:`time_on`): an event on the current stream at each
    edge, resolved after the step (see the notes above :class:`EventClock`); the rows hold the
    pending events until then and read as shared-clock ns once :meth:`resolve` ran (every
    export and :meth:`rows_since` runs it first). ``t_launch_ns`` stays the host time of the
    call; ``t_start_ns`` is then the stream's time at the launch, ``t_end_ns`` the completion.
    ``comm_calls.csv`` (what the launching *thread* was doing) stays on the host clock.
    """

    __slots__ = ("job_id", "rank", "offset_ns", "step", "_coll", "_calls", "_open", "_watcher", "_messages",
                 "_grads", "_params", "_clock", "_pending")
    enabled = True  # False only for NullRecorder

    def __init__(self, job_id: str, rank: int, offset_ns: int = 0,
                 clock: EventClock | None = None) -> None:
        self.job_id = job_id
        self.rank = rank
        self.offset_ns = int(offset_ns)
        self.step = -1
        self._clock = clock
        # (row, column, event) of every edge waiting for its event to be resolved
        self._pending: list[tuple[list[Any], int, Any]] = []
        # Each collective row is a mutable list so async completion can fill t_end in place:
        # [step, seq, op, algo, bytes, t_launch, t_start, t_end, bucket]
        self._coll: list[list[Any]] = []
        # When this thread was inside a communication call: (step, seq, call, t_begin, t_end).
        self._calls: list[tuple[int, int, str, int, int]] = []
        # row index -> the open ``comm_call#<op>`` trace range of its launch (profiling only)
        self._open: dict[int, Any] = {}
        self._watcher: _EndWatcher | None = None  # started by the first work without a future
        # Message rows are tuples appended as-is (two clock reads + one append per message).
        self._messages: list[tuple] = []
        # Gradient-ready rows: (step, param index, t_ready); names/bytes come from _params.
        self._grads: list[tuple[int, int, int]] = []
        self._params: list[tuple[str, int]] = []

    def now(self) -> int:
        """Current time in ns on the job's shared clock (the host's: see :meth:`mark`)."""
        return _perf_ns() + self.offset_ns

    def time_on(self, device: Any) -> None:
        """Time the edges of a job that computes on ``device``: CUDA events on a CUDA device,
        the host clock elsewhere (:func:`clock_for`). Call it before the first collective. A
        clock given to the constructor is kept (a test's stand-in for CUDA events)."""
        if self._clock is None:
            self._clock = clock_for(device)

    @property
    def clock(self) -> EventClock | None:
        """The event clock edges are timed with (None: the host clock)."""
        return self._clock

    def phase_timer(self) -> PhaseTimer:
        """The job's :class:`PhaseTimer`, on this recorder's clock and offset (call it after
        :meth:`time_on`): the step's phases and its collectives' edges are then marks of one
        clock, resolved with one anchor, so a step window clips the collectives on one scale."""
        return PhaseTimer(offset_ns=self.offset_ns, clock=self._clock)

    def mark(self) -> Any:
        """An edge of a message, now: the shared-clock ns on the host clock, else an event on
        the current stream that :meth:`message` accepts and :meth:`resolve` turns into ns."""
        if self._clock is None:
            return _perf_ns() + self.offset_ns
        return self._clock.mark()

    def _stamp(self, row: list[Any], col: int) -> None:
        """Event clock: ``row[col]`` is an event recorded now, pending resolution."""
        ev = self._clock.mark()  # type: ignore[union-attr]
        row[col] = ev
        self._pending.append((row, col, ev))

    def resolve(self) -> None:
        """Turn every pending event into shared-clock ns (waits for them). A no-op on the host
        clock; called after a step, never inside one."""
        n = len(self._pending)
        if not n:
            return
        # slice and delete, not swap: an edge appended meanwhile (a callback on another thread)
        # stays pending instead of being dropped with the old list
        pending = self._pending[:n]
        del self._pending[:n]
        times = self._clock.resolve([ev for _, _, ev in pending])  # type: ignore[union-attr]
        for (row, col, _), t in zip(pending, times):
            row[col] = t + self.offset_ns

    # -- collectives -------------------------------------------------------------------
    # Besides when each collective ran (launch .. end), the recorder logs when the thread that
    # launched it was *inside a communication call* (comm_calls.csv): the launch call of an
    # async collective, a blocking collective from launch to return, a wait. The analysis cuts
    # those out of the step's compute phases: a thread blocked on communication is not computing
    # (DESIGN.md: compute = forward, backward and optimizer work). While the profiler runs, each
    # call is also a ``comm_call#<op>`` range (``comm_call#wait`` for a wait) in the trace, so
    # the trace's compute leaves out the same calls even where they sit inside an operator
    # (a blocking collective in a backward hook).
    def launch(self, op: str, algo: str, nbytes: int, bucket: int = -1) -> int:
        """Log the launch of a collective (call it right before the call that starts it);
        returns the row index for :meth:`done`, :meth:`track` or :meth:`returned`."""
        self._coll.append([self.step, len(self._coll), op, algo, int(nbytes),
                           _perf_ns() + self.offset_ns, -1, -1, bucket])
        idx = len(self._coll) - 1
        if self._clock is not None:
            self._stamp(self._coll[idx], 6)
        if _profiling():
            rf = record_function(f"{CALL_RANGE}{op}")
            rf.__enter__()
            self._open[idx] = rf
        return idx

    def _close(self, idx: int) -> None:
        rf = self._open.pop(idx, None)
        if rf is not None:
            rf.__exit__(None, None, None)

    # The call's logged end is read after its trace range closed (and its begin before the range
    # opened), so a call in comm_calls.csv covers its range in the trace, the profiler's own cost
    # of the range included: both methods then leave the same time out of compute.
    def done(self, idx: int) -> None:
        """A blocking collective returned now, on the thread that launched it: it ended now, and
        that thread was inside the call from the launch until now."""
        row = self._coll[idx]
        if self._clock is None:
            row[7] = _perf_ns() + self.offset_ns
        else:  # the call returned at enqueue: the stream, now waiting for it, says when it ended
            self._stamp(row, 7)
        self._close(idx)
        self._calls.append((row[0], row[1], "blocking", row[5], _perf_ns() + self.offset_ns))

    def returned(self, idx: int) -> None:
        """The call that launched an async collective returned now (its end is stamped later, by
        :meth:`finished` or the callback :meth:`track` adds)."""
        row = self._coll[idx]
        self._close(idx)
        self._calls.append((row[0], row[1], "launch", row[5], _perf_ns() + self.offset_ns))

    def finished(self, idx: int) -> None:
        """The collective completed now, seen from another thread (a future's callback on the
        backend's thread): its end only, no communication call of the launching thread."""
        self._end(self._coll[idx])

    def _end(self, row: list[Any]) -> None:
        """The collective of ``row`` ended now (unless its end is already set): the host
        clock, or an event on the current stream (a CUDA future's callback runs on a stream
        made to wait for the collective; a wait made the current stream wait for it)."""
        if self._clock is None:
            if row[7] < 0:
                row[7] = _perf_ns() + self.offset_ns
        elif isinstance(row[7], int) and row[7] < 0:
            self._stamp(row, 7)

    def track(self, idx: int, work: Any) -> Any:
        """The call that launched an async collective returned now with ``work``; returns the
        :class:`RecordedWork` to wait on in its place (it logs the caller's wait).

        The end is set by the future's callback, which runs on the backend's thread right when
        the work finishes: the completion time we want (not when the main thread gets around to
        waiting on it). Every backend dpcore supports (gloo, NCCL; torch >= 2.4) gives
        collectives a future; a work without one (older gloo's reduce-scatter) gets its end when
        it is waited on, an upper bound of when the backend finished it.
        """
        self.returned(idx)
        row, offset = self._coll[idx], self.offset_ns

        if self._clock is None:
            def _finished(fut: Any) -> None:
                if row[7] < 0:
                    row[7] = _perf_ns() + offset
        else:
            def _finished(fut: Any) -> None:
                self._end(row)

        try:
            work.get_future().add_done_callback(_finished)
        except RuntimeError:  # "Work::getFuture not implemented": a watcher thread waits for it
            if self._watcher is None:
                self._watcher = _EndWatcher(offset, None if self._clock is None else self._end)
            self._watcher.add(row, work)
        return RecordedWork(work, row, self._calls, offset,
                            None if self._clock is None else self._end)

    # -- messages ----------------------------------------------------------------------
    def message(self, algo: str, call: int, phase: str, ring_step: int, src: int, dst: int,
                chunk: int, nbytes: int, t_post: int, t_done: int, side: str) -> None:
        """Log one point-to-point message (times taken with :meth:`mark`: ns, or events of the
        event clock, resolved with the rest)."""
        if self._clock is None or (isinstance(t_post, int) and isinstance(t_done, int)):
            self._messages.append((self.step, algo, call, phase, ring_step, src, dst, chunk,
                                   int(nbytes), t_post, t_done, side))
            return
        row = [self.step, algo, call, phase, ring_step, src, dst, chunk, int(nbytes), t_post,
               t_done, side]
        for col in (9, 10):
            if not isinstance(row[col], int):
                self._pending.append((row, col, row[col]))
        self._messages.append(row)

    # -- gradients ---------------------------------------------------------------------
    def set_params(self, params: list[tuple[str, int]]) -> None:
        """Name and bytes of each trainable parameter, by the index :meth:`grad_ready` gets."""
        self._params = list(params)

    def grad_ready(self, param: int) -> None:
        """Log that backward finished accumulating parameter ``param``'s gradient now."""
        self._grads.append((self.step, param, _perf_ns() + self.offset_ns))

    # -- export ------------------------------------------------------------------------
    def collective_rows(self) -> list[dict]:
        """Rows for collectives.csv (docs/DESIGN.md columns)."""
        self.resolve()
        # the tuple is in the contract's column order (runformat.COLLECTIVE_COLUMNS)
        return [dict(zip(COLLECTIVE_COLUMNS, (self.job_id, self.rank, step, seq, op, algo, nbytes,
                                              t_launch, format_ns(t_start), t_end, bucket)))
                for step, seq, op, algo, nbytes, t_launch, t_start, t_end, bucket in
                (r[:9] for r in self._coll)]

    def message_rows(self) -> list[dict]:
        """Rows for messages.csv (docs/DESIGN.md columns)."""
        self.resolve()
        # the tuple is in the contract's column order (runformat.MESSAGE_COLUMNS)
        return [dict(zip(MESSAGE_COLUMNS, (self.job_id, algo, self.rank, step, call, phase, rs, src, dst,
                                           chunk, nbytes, tp, td, side)))
                for (step, algo, call, phase, rs, src, dst, chunk, nbytes, tp, td, side)
                in self._messages]

    def call_rows(self) -> list[dict]:
        """Rows for comm_calls.csv (runformat.CALL_COLUMNS)."""
        return [dict(zip(CALL_COLUMNS, (self.job_id, self.rank, step, seq, call, t0, t1)))
                for step, seq, call, t0, t1 in self._calls]

    def grad_rows(self) -> list[dict]:
        """Rows for grads.csv (runformat.GRAD_COLUMNS)."""
        params = self._params
        return [dict(zip(GRAD_COLUMNS, (self.job_id, self.rank, step, i, params[i][0],
                                        params[i][1], t)))
                for step, i, t in self._grads if i < len(params)]

    def collective_count(self) -> int:
        """How many collectives are logged (a mark for :meth:`rows_since`)."""
        return len(self._coll)

    def rows_since(self, mark: int) -> list[list[Any]]:
        """The collective rows logged after ``mark`` (one step's, for its live.csv row), as the
        live lists an async completion still stamps: read them as :func:`row_interval`. Events
        of the event clock are resolved first (the step is over)."""
        self.resolve()
        return self._coll[mark:]

    def clear(self) -> None:
        """Drop everything logged so far (e.g. after warm-up steps)."""
        self._coll.clear()
        self._calls.clear()
        self._messages.clear()
        self._grads.clear()
        self._pending.clear()


class _EndWatcher:
    """A daemon thread that stamps the end of async works without a future.

    Why: gloo's reduce-scatter returns a work with no future, and its ``is_completed()`` never
    turns true, so the only way to learn when it finished is to wait for it. Stamped at the
    caller's own wait, the end could come long after the backend finished (``fsdp`` waits for a
    reduce-scatter only when two newer ones are in flight), and the recorded interval would
    claim communication the trace does not show. This thread waits for each such work, in
    launch order (the order the backend runs them), and stamps the end when the wait returns;
    waiting does not change the work (the caller's own wait still returns it).
    """

    def __init__(self, offset_ns: int, end: Any = None) -> None:
        self._offset = offset_ns
        self._end = end  # the recorder's event-clock end, or None: the host clock
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="dpcore-end-watcher", daemon=True).start()

    def add(self, row: list[Any], work: Any) -> None:
        self._queue.put((row, work))

    def _run(self) -> None:
        while True:
            row, work = self._queue.get()
            try:
                work.wait()
            except Exception:  # noqa: BLE001 - the caller's own wait reports the failure
                continue
            if self._end is not None:
                self._end(row)
            elif row[7] < 0:
                row[7] = _perf_ns() + self._offset


#: ``torch.distributed.Work`` where this torch build has distributed support (every CPU/CUDA
#: wheel); a build without it never launches a collective, so ``object`` stands in.
_WorkBase: Any = getattr(torch.distributed, "Work", object)


class RecordedWork(_WorkBase):
    """An async collective's ``Work`` that logs the caller's ``wait()`` as a communication call.

    A subclass of ``torch.distributed.Work`` (FSDP2 checks ``isinstance``), so it goes wherever
    the real work would. A work without a future gets its end when the wait returns.
    """

    def __init__(self, work: Any, row: list[Any], calls: list[tuple[int, int, str, int, int]],
                 offset_ns: int, end: Any = None) -> None:
        super().__init__()
        self._work, self._row, self._calls, self._offset = work, row, calls, offset_ns
        self._end = end  # the recorder's event-clock end, or None: the host clock

    def wait(self, timeout: Any = None) -> bool:
        t0 = _perf_ns()
        rf = record_function(WAIT_RANGE) if _profiling() else None
        if rf is not None:
            rf.__enter__()
        ok = self._work.wait() if timeout is None else self._work.wait(timeout)
        row, off = self._row, self._offset
        if self._end is not None:  # after the wait the current stream waits for the work
            self._end(row)
        elif row[7] < 0:  # no future (or its callback has not run yet): it is over now
            row[7] = _perf_ns() + off
        if rf is not None:
            rf.__exit__(None, None, None)
        self._calls.append((row[0], row[1], "wait", t0 + off, _perf_ns() + off))
        return ok

    def get_future(self) -> Any:
        return self._work.get_future()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Any:
        return self._work.exception()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def result(self) -> Any:
        return self._work.result()

    def synchronize(self) -> None:
        self._work.synchronize()


class NullRecorder(Recorder):
    """A :class:`Recorder` that records nothing: the default wherever recording is optional.

    Every method keeps :class:`Recorder`'s signature and does nothing (``launch`` returns -1,
    ``track`` the work it was given, the rows are empty), except :meth:`now`, which still reads the clock so
    that code timing
    itself through a recorder keeps working. It holds no state (``step`` reads -1 and drops
    writes; there is no ``__dict__``), so the one shared :data:`NULL_RECORDER` is a constant,
    not a mutable singleton.
    """

    __slots__ = ()
    enabled = False
    job_id = ""
    rank = -1
    offset_ns = 0

    def __init__(self) -> None:
        """Nothing to set up: the class attributes are the whole state."""

    @property
    def step(self) -> int:
        """Always -1 (outside any step); assignments are dropped."""
        return -1

    @step.setter
    def step(self, value: int) -> None:
        pass

    def now(self) -> int:
        return _perf_ns()

    def time_on(self, device: Any) -> None:
        pass

    @property
    def clock(self) -> EventClock | None:
        return None

    def phase_timer(self) -> PhaseTimer:
        """A host-clock :class:`PhaseTimer` (this recorder has no clock of its own)."""
        return PhaseTimer(clock=None)

    def mark(self) -> Any:
        return _perf_ns()

    def resolve(self) -> None:
        pass

    def launch(self, op: str, algo: str, nbytes: int, bucket: int = -1) -> int:
        return -1

    def done(self, idx: int) -> None:
        pass

    def returned(self, idx: int) -> None:
        pass

    def finished(self, idx: int) -> None:
        pass

    def track(self, idx: int, work: Any) -> Any:
        return work

    def message(self, algo: str, call: int, phase: str, ring_step: int, src: int, dst: int,
                chunk: int, nbytes: int, t_post: int, t_done: int, side: str) -> None:
        pass

    def set_params(self, params: list[tuple[str, int]]) -> None:
        pass

    def grad_ready(self, param: int) -> None:
        pass

    def collective_rows(self) -> list[dict]:
        return []

    def message_rows(self) -> list[dict]:
        return []

    def call_rows(self) -> list[dict]:
        return []

    def grad_rows(self) -> list[dict]:
        return []

    def collective_count(self) -> int:
        return 0

    def rows_since(self, mark: int) -> list[list[Any]]:
        return []

    def clear(self) -> None:
        pass


#: The recorder every ``recorder=`` parameter defaults to.
NULL_RECORDER = NullRecorder()


class PhaseTimer:
    """Marks the phases of one training step: fwd, bwd, sync, opt.

    On CPU it reads ``perf_counter_ns`` (after the caller aligned ranks with a barrier). On GPU
    it records an event on the current stream at each mark (an :class:`EventClock`, CUDA events
    unless a ``clock`` is given) and resolves them once at :meth:`finish`, so timing never
    inserts a device synchronisation inside the step (which would change what is measured).
    There ``t_start_ns`` is the start event's time on the shared clock, the same scale as the
    recorder's collective and message edges, so a step window clips them consistently: a job
    makes its timer with :meth:`Recorder.phase_timer`, on the recorder's own clock, so both are
    placed by one anchor (:meth:`EventClock.resolve`).
    """

    PHASES = ("fwd", "bwd", "sync", "opt")

    def __init__(self, device: torch.device | None = None, offset_ns: int = 0,
                 clock: EventClock | None = None) -> None:
        self.clock = clock if clock is not None else clock_for(device)
        self.cuda = self.clock is not None
        self.offset_ns = offset_ns
        self._marks: list[tuple[str, Any]] = []
        self.t_start_ns = 0

    def start(self) -> None:
        self._marks = []
        self.t_start_ns = _perf_ns() + self.offset_ns
        if self.clock is not None:
            self._marks.append(("start", self.clock.mark()))

    def mark(self, phase: str, at: Any = None) -> None:
        """End of ``phase`` (one of PHASES), i.e. start of the next one. ``at``: when the phase
        really ended, taken earlier on this timer's clock (a ``perf_counter_ns`` reading on the
        host clock, an event of :attr:`clock` on an event clock; None: now), e.g.
        :meth:`dpcore.write.capture.backward_end.BackwardEnd.take`."""
        host = isinstance(at, int)
        if at is None or (host and at <= 0) or host != (self.clock is None):  # none, or another clock's
            at = self.clock.mark() if self.clock is not None else _perf_ns()
        self._marks.append((phase, at))

    def finish(self) -> dict[str, float]:
        """Phase durations in ms plus ``step_ms`` and ``t_start_ns``."""
        out = {f"{p}_ms": 0.0 for p in self.PHASES}
        if self.clock is not None:
            times = self.clock.resolve([ev for _, ev in self._marks])
            prev = times[0]
            for (phase, _), t in zip(self._marks[1:], times[1:]):
                out[f"{phase}_ms"] += (t - prev) / 1e6
                prev = t
            out["step_ms"] = (times[-1] - times[0]) / 1e6
            self.t_start_ns = times[0] + self.offset_ns
        else:
            prev = self.t_start_ns - self.offset_ns
            for phase, t in self._marks:
                out[f"{phase}_ms"] += (t - prev) / 1e6
                prev = t
            out["step_ms"] = (prev - (self.t_start_ns - self.offset_ns)) / 1e6
        out["t_start_ns"] = self.t_start_ns
        return out
