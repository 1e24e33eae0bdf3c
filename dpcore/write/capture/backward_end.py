"""When backward's *computation* ended, for loops whose gradient sync waits inside ``backward()``.

Why: DDP's reducer waits for its buckets' all-reduces in an autograd *final callback*
(``Reducer::mark_variable_ready`` queues ``finalize_backward`` when the last bucket is ready), so
``loss.backward()`` returns only after that wait. A mark taken after it returns puts
communication into "backward": on the host clock because the host waited, and on a CUDA job's
event clock because NCCL's wait makes the current stream wait for the collective, so an event
recorded after ``backward()`` completes only once the all-reduces did.

The end of the computation is marked instead:

* host clock (CPU jobs): ``perf_counter_ns`` in every parameter's post-accumulate-grad hook,
  the last one's reading kept (the last gradient's accumulation ends backward's computation);
* event clock (CUDA jobs): one event on the current stream in an autograd final callback that
  the first gradient hook of each backward queues. The engine runs final callbacks in the order
  they were queued, after the graph task finished, with the caller's current stream set and
  made to wait for every leaf stream (``GraphTask::exec_post_processing`` in
  torch/csrc/autograd/engine.cpp): the event completes once every backward kernel did. DDP's
  own callback is queued later (from a node post hook of the last bucket's last gradient: node
  post hooks run after a tensor's post-accumulate-grad hooks), so the event is recorded before
  DDP enqueues the wait on the stream. One event per backward, not one per parameter.

Not for FSDP2 on CUDA: it queues its own final callback at the *start* of backward (the root's
pre-backward), ahead of any gradient hook, so a callback queued here would run after its waits;
callers keep the mark after ``backward()`` there.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch
from torch.autograd import Variable

from dpcore.write.capture.comm_log import EventClock

_perf_ns = time.perf_counter_ns


class BackwardEnd:
    """The end of backward's computation (module docstring), read with :meth:`take`.

    ``clock``: the job's event clock (the recorder's), or None for the host clock. Attach it to
    the parameters with :meth:`attach` (or call it as a post-accumulate-grad hook)."""

    __slots__ = ("clock", "_value", "_queued")

    def __init__(self, clock: EventClock | None) -> None:
        self.clock = clock
        self._value: Any = None
        self._queued = False

    def __call__(self, _param: torch.Tensor) -> None:
        """A post-accumulate-grad hook: a gradient is ready now."""
        if self.clock is None:
            self._value = _perf_ns()
        elif not self._queued:
            self._queued = True
            Variable._execution_engine.queue_callback(self._final)

    def _final(self) -> None:
        """The autograd final callback: every backward kernel is on the stream before this mark."""
        self._queued = False
        self._value = self.clock.mark()  # type: ignore[union-attr]

    def attach(self, params: Iterable[torch.nn.Parameter]) -> list[Any]:
        """Register the hook on every parameter that trains; the handles (``.remove()`` undoes)."""
        return [p.register_post_accumulate_grad_hook(self) for p in params if p.requires_grad]

    def take(self, since_ns: int = 0) -> Any:
        """The last backward's end and forget it: ``perf_counter_ns`` (host clock; None when no
        gradient was ready after ``since_ns``) or the event (event clock; None when no backward
        ran a hook since the last take). Call it before each backward too (no stale end, and a
        backward that raised before its final callback leaves nothing queued behind)."""
        value, self._value = self._value, None
        self._queued = False  # a backward that raised never ran its callback: queue afresh
        if self.clock is None and (value is None or value <= since_ns):
            return None
        return value
