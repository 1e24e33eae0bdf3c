"""Logging the collectives of a DDP comm hook dpcore did not write (fp16/bf16, PowerSGD, a user's).

Why a tap and not a wrapping hook: DDP hands a registered hook to its C++ reducer and refuses a
second registration, so once a user registered PowerSGD or fp16 compression, nothing can sit
between DDP and that hook; and DDP's own hooks launch their collectives from inside (PowerSGD
its second all-reduce from a future's callback). The hooks call the ``torch.distributed``
functions by module attribute (``dist.all_reduce(...)``), so while a tap is installed those
few functions are replaced by ones that log the call (bytes on the wire: the tensor actually
sent, half-size for fp16, P and Q for PowerSGD) and then call the original with the same
arguments: the hook computes exactly what it computes without the tap. Only calls on the
tapped process group are logged, and only while ``active()`` says so (``dpcore.record``: inside
a step); a call from another thread (PowerSGD's callback on the backend's thread) is logged
without a "communication call" of the training thread. ``remove()`` puts the originals back.
An end is stamped by the recorder (``done`` after a blocking call, ``finished`` in the future's
callback): on a CUDA job an event on the stream, since NCCL returns and completes the future at
enqueue (see :class:`~dpcore.write.capture.comm_log.EventClock`).
Used by ``dpcore.record`` (a user's hook kept) and ``torch_ddp`` (``profile --comm-hook``).

With a :class:`HookClock` (``torch_ddp``'s compressing jobs) the tap also times the hook's own
compute apart from its collectives: the time inside a tapped call and inside a ``wait()`` on its
work or future is the collective's, and each ``then`` callback the hook chains on a tapped
collective's future runs timed (PowerSGD's and fp16's decompression). That is why an async
call's work comes back wrapped (:class:`_TimedWork`): the callbacks and waits are on it.
"""
from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from dpcore.write.capture.comm_log import EventClock, Recorder

#: The collectives DDP's comm hooks launch (torch.distributed.algorithms.ddp_comm_hooks: the
#: default, fp16/bf16 compression, PowerSGD), and what dpcore calls each op.
TAPPED_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather",
              "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
              "broadcast": "broadcast"}


#: HookClock kinds: the hook's own call (compressing, up to its first collective's launch) and
#: the callbacks it chains on its collectives' futures (decompressing; for PowerSGD also the
#: orthogonalization and matmul between its all-reduces)
COMPRESS, DECOMPRESS = 0, 1


class HookClock:
    """Nanoseconds of a comm hook's own compute per step, without the collectives it waits on.

    Why subtract and not add: the hook's code is not ours, so its compute cannot be bracketed;
    its collectives can (the tap sees each call and each wait). A timed region's compute is its
    wall time less what it spent in collectives and in timed regions nested in it (a callback
    can run inline when its future is already done), kept per thread because the callbacks run
    on the backend's thread while the next bucket's hook runs on the training thread.

    ``events`` (a CUDA job: the recorder's :class:`EventClock`): the hook's compute is kernels
    its call only launches, and NCCL's calls and waits return at once, so host time would be
    launch overhead. Each region's edges and each wait's edges are then events on the current
    stream (a callback's: the stream its CUDA future runs it on), resolved in :meth:`ms`; a
    region's compute is its span less the union of its waits and nested regions within it."""

    def __init__(self, step: Callable[[], int], events: EventClock | None = None) -> None:
        self.step = step
        self.per_step: dict[int, list[int]] = {}  # step -> [compress ns, decompress ns]
        self._local = threading.local()
        self._lock = threading.Lock()
        self._events = events
        #: event mode: (step, kind, start event, end event, [(excluded start, end), ...])
        self._regions: list[tuple[int, int, Any, Any, list[tuple[Any, Any]]]] = []

    def _spent(self) -> int:
        return getattr(self._local, "spent", 0)

    def exclude(self, ns: int) -> None:
        """``ns`` of this thread's time belong to a collective (or a nested region), not to compute."""
        self._local.spent = self._spent() + ns

    def _stack(self) -> list[list[tuple[Any, Any]]]:
        """Event mode: the excluded intervals of each open region of this thread, innermost last."""
        st = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    @contextmanager
    def _timed_events(self, kind: int, events: EventClock) -> Iterator[None]:
        step, stack = self.step(), self._stack()
        excluded: list[tuple[Any, Any]] = []
        ev0 = events.mark()
        stack.append(excluded)
        try:
            yield
        finally:
            ev1 = events.mark()
            stack.pop()
            if stack:  # an enclosing region excludes all of this one
                stack[-1].append((ev0, ev1))
            with self._lock:
                self._regions.append((step, kind, ev0, ev1, excluded))

    @contextmanager
    def _waiting_events(self, events: EventClock) -> Iterator[None]:
        ev0 = events.mark()
        try:
            yield
        finally:
            stack = self._stack()
            if stack:
                stack[-1].append((ev0, events.mark()))

    @contextmanager
    def timed(self, kind: int) -> Iterator[None]:
        if self._events is not None:
            with self._timed_events(kind, self._events):
                yield
            return
        step, t0, spent0 = self.step(), time.perf_counter_ns(), self._spent()
        try:
            yield
        finally:
            total = time.perf_counter_ns() - t0
            own = total - (self._spent() - spent0)
            self._local.spent = spent0 + total  # an enclosing region excludes all of this one
            with self._lock:
                self.per_step.setdefault(step, [0, 0])[kind] += max(own, 0)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        if self._events is not None:
            with self._waiting_events(self._events):
                yield
            return
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            self.exclude(time.perf_counter_ns() - t0)

    def callback(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def timed_fn(fut: Any) -> Any:
            with self.timed(DECOMPRESS):
                return fn(fut)
        return timed_fn

    def _resolve(self) -> None:
        """Event mode: fold the recorded regions into ``per_step`` (waits for their events)."""
        with self._lock:
            regions, self._regions = self._regions, []
        if not regions or self._events is None:
            return
        evs = [ev for _, _, a, b, ex in regions for ev in (a, b, *(e for pair in ex for e in pair))]
        at = dict(zip(map(id, evs), self._events.resolve(evs)))
        for step, kind, a, b, ex in regions:
            lo, hi = at[id(a)], at[id(b)]
            cut = sorted((max(lo, at[id(x)]), min(hi, at[id(y)])) for x, y in ex)
            busy, end = 0, lo
            for s0, s1 in cut:  # the union of the excluded intervals inside [lo, hi]
                s0 = max(s0, end)
                if s1 > s0:
                    busy, end = busy + s1 - s0, s1
            with self._lock:
                self.per_step.setdefault(step, [0, 0])[kind] += max(hi - lo - busy, 0)

    def ms(self, steps: Any) -> list[tuple[int, float, float]]:
        """(step, compress ms, decompress ms) of each of ``steps`` (0.0 where the hook did not run)."""
        self._resolve()
        with self._lock:
            return [(s, *(v / 1e6 for v in self.per_step.get(s, [0, 0]))) for s in steps]


class _TimedFuture:
    """A tapped collective's future: ``then`` callbacks run timed, ``wait`` counts as the collective's."""

    def __init__(self, fut: Any, clock: HookClock) -> None:
        self.fut, self.clock = fut, clock

    def then(self, fn: Callable[[Any], Any]) -> _TimedFuture:
        return _TimedFuture(self.fut.then(self.clock.callback(fn)), self.clock)

    def wait(self) -> Any:
        with self.clock.waiting():
            return self.fut.wait()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fut, name)


class _TimedWork:
    """A tapped async collective's work: its future is a :class:`_TimedFuture`, its wait the collective's."""

    def __init__(self, work: Any, clock: HookClock) -> None:
        self.work, self.clock = work, clock

    def get_future(self) -> _TimedFuture:
        return _TimedFuture(self.work.get_future(), self.clock)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        with self.clock.waiting():
            return self.work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)


def real_future(fut: Any) -> Any:
    """The torch future under a :class:`_TimedFuture` (what DDP's reducer must get back)."""
    while isinstance(fut, _TimedFuture):
        fut = fut.fut
    return fut


class CollectiveTap:
    """See the module docstring. ``recorder()`` is read at each call (it may be swapped);
    ``clock``: time the hook's compute apart from its collectives (:class:`HookClock`)."""

    def __init__(self, group: Any, recorder: Callable[[], Recorder], active: Callable[[], bool],
                 clock: HookClock | None = None) -> None:
        self.group, self.recorder, self.active, self.clock = group, recorder, active, clock
        self._saved: dict[str, Any] = {}

    def _ours(self, group: Any) -> bool:
        if group is None or group is self.group:
            return True
        return group is dist.group.WORLD and self.group in (None, dist.group.WORLD)

    def install(self) -> CollectiveTap:
        main = threading.get_ident()
        for fn_name, op in TAPPED_OPS.items():
            orig = getattr(dist, fn_name, None)
            if orig is not None:
                self._saved[fn_name] = orig
                setattr(dist, fn_name, self._tapped(orig, op, main))
        return self

    def remove(self) -> None:
        for fn_name, orig in self._saved.items():
            setattr(dist, fn_name, orig)
        self._saved.clear()

    def _tapped(self, orig: Any, op: str, main_thread: int) -> Any:
        sig = inspect.signature(orig)

        def tapped(*args: Any, **kwargs: Any) -> Any:
            if not self.active():
                return orig(*args, **kwargs)
            bound = sig.bind_partial(*args, **kwargs).arguments
            if not self._ours(bound.get("group")):
                return orig(*args, **kwargs)
            tensor = next(iter(bound.values()))  # the first argument: the tensor sent
            if isinstance(tensor, list):  # all_gather(tensor_list, tensor)
                tensor = bound.get("tensor")
            nbytes = tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0
            rec = self.recorder()
            idx = rec.launch(op, "native", nbytes)
            if self.clock is None:
                work = orig(*args, **kwargs)
            else:  # the call's time is the collective's, not the hook's compute
                with self.clock.waiting():
                    work = orig(*args, **kwargs)
            if not bound.get("async_op", False):
                rec.done(idx)
                return work
            if threading.get_ident() == main_thread:
                rec.returned(idx)
            else:
                rec._close(idx)
            work.get_future().add_done_callback(lambda _f: rec.finished(idx))
            return work if self.clock is None else _TimedWork(work, self.clock)

        tapped.__wrapped__ = orig  # type: ignore[attr-defined]
        return tapped
