"""Low-overhead instrumentation: collective and message logs on the shared clock, phase timers.

Why our own instrumentation instead of relying on the trace: gloo spans in a CPU trace are
incomplete (async work runs on gloo threads that the profiler may not attribute), and timed
steps run *without* the profiler so that the numbers the charts use are not distorted. Every
collective a variant issues goes through :class:`Recorder`, so comm intervals exist with or
without a trace.

Cost model: one ``perf_counter_ns`` per event edge and a list append; rows are turned into
dicts only when the job ends. Where nothing is recorded (``verify``, users' own loops, the
``allreduce`` timing repeats) the callee gets :data:`NULL_RECORDER`, whose methods do nothing,
so no call site tests for a missing recorder; ``enabled`` lets the rare caller that would
change *how* it runs (DDP's comm hook) decide once.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from dpcore.contract.runformat import COLLECTIVE_COLUMNS, GRAD_COLUMNS, MESSAGE_COLUMNS, format_ns

_perf_ns = time.perf_counter_ns


class Recorder:
    """Per-rank, per-job log of collectives and point-to-point messages.

    ``offset_ns`` is this rank's clock offset to rank 0 (see :mod:`dpcore.write.runtime.clock`), so
    ``now()`` is on the clock that all ranks of the job share. ``step`` is set by the training
    loop; rows logged outside a step carry -1.
    """

    __slots__ = ("job_id", "rank", "offset_ns", "step", "_coll", "_messages", "_grads",
                 "_params")
    enabled = True  # False only for NullRecorder

    def __init__(self, job_id: str, rank: int, offset_ns: int = 0) -> None:
        self.job_id = job_id
        self.rank = rank
        self.offset_ns = int(offset_ns)
        self.step = -1
        # Each collective row is a mutable list so async completion can fill t_end in place:
        # [step, seq, op, algo, bytes, t_launch, t_start, t_end, bucket]
        self._coll: list[list[Any]] = []
        # Message rows are tuples appended as-is (two clock reads + one append per message).
        self._messages: list[tuple] = []
        # Gradient-ready rows: (step, param index, t_ready); names/bytes come from _params.
        self._grads: list[tuple[int, int, int]] = []
        self._params: list[tuple[str, int]] = []

    def now(self) -> int:
        """Current time in ns on the job's shared clock."""
        return _perf_ns() + self.offset_ns

    # -- collectives -------------------------------------------------------------------
    def launch(self, op: str, algo: str, nbytes: int, bucket: int = -1) -> int:
        """Log the launch of a collective; returns the row index for :meth:`done`/:meth:`track`."""
        self._coll.append([self.step, len(self._coll), op, algo, int(nbytes),
                           _perf_ns() + self.offset_ns, -1, -1, bucket])
        return len(self._coll) - 1

    def done(self, idx: int) -> None:
        """Mark a blocking collective finished now."""
        self._coll[idx][7] = _perf_ns() + self.offset_ns

    def track(self, idx: int, work: Any) -> None:
        """Set the end time when an async ``Work`` completes.

        The future's callback runs on the backend's thread right when the work finishes,
        which is the completion time we want (not when the main thread gets around to
        waiting on it). Every backend dpcore supports (gloo, NCCL; torch >= 2.4) gives
        collectives a future.
        """
        row = self._coll[idx]
        offset = self.offset_ns

        def _finished(fut: Any) -> None:
            if row[7] < 0:
                row[7] = _perf_ns() + offset

        work.get_future().add_done_callback(_finished)

    # -- messages ----------------------------------------------------------------------
    def message(self, algo: str, call: int, phase: str, ring_step: int, src: int, dst: int,
                chunk: int, nbytes: int, t_post: int, t_done: int, side: str) -> None:
        """Log one point-to-point message (times already read with :meth:`now`)."""
        self._messages.append((self.step, algo, call, phase, ring_step, src, dst, chunk,
                               int(nbytes), t_post, t_done, side))

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
        # the tuple is in the contract's column order (runformat.COLLECTIVE_COLUMNS)
        return [dict(zip(COLLECTIVE_COLUMNS, (self.job_id, self.rank, step, seq, op, algo, nbytes,
                                              t_launch, format_ns(t_start), t_end, bucket)))
                for step, seq, op, algo, nbytes, t_launch, t_start, t_end, bucket in
                (r[:9] for r in self._coll)]

    def message_rows(self) -> list[dict]:
        """Rows for messages.csv (docs/DESIGN.md columns)."""
        # the tuple is in the contract's column order (runformat.MESSAGE_COLUMNS)
        return [dict(zip(MESSAGE_COLUMNS, (self.job_id, algo, self.rank, step, call, phase, rs, src, dst,
                                           chunk, nbytes, tp, td, side)))
                for (step, algo, call, phase, rs, src, dst, chunk, nbytes, tp, td, side)
                in self._messages]

    def grad_rows(self) -> list[dict]:
        """Rows for grads.csv (runformat.GRAD_COLUMNS)."""
        params = self._params
        return [dict(zip(GRAD_COLUMNS, (self.job_id, self.rank, step, i, params[i][0],
                                        params[i][1], t)))
                for step, i, t in self._grads if i < len(params)]

    def clear(self) -> None:
        """Drop everything logged so far (e.g. after warm-up steps)."""
        self._coll.clear()
        self._messages.clear()
        self._grads.clear()


class NullRecorder(Recorder):
    """A :class:`Recorder` that records nothing: the default wherever recording is optional.

    Every method keeps :class:`Recorder`'s signature and does nothing (``launch`` returns -1,
    the rows are empty), except :meth:`now`, which still reads the clock so that code timing
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

    @property  # type: ignore[override]
    def step(self) -> int:
        """Always -1 (outside any step); assignments are dropped."""
        return -1

    @step.setter
    def step(self, value: int) -> None:
        pass

    def now(self) -> int:
        return _perf_ns()

    def launch(self, op: str, algo: str, nbytes: int, bucket: int = -1) -> int:
        return -1

    def done(self, idx: int) -> None:
        pass

    def track(self, idx: int, work: Any) -> None:
        pass

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

    def grad_rows(self) -> list[dict]:
        return []

    def clear(self) -> None:
        pass


#: The recorder every ``recorder=`` parameter defaults to.
NULL_RECORDER = NullRecorder()


class PhaseTimer:
    """Marks the phases of one training step: fwd, bwd, sync, opt.

    On CPU it reads ``perf_counter_ns`` (after the caller aligned ranks with a barrier). On GPU
    it records CUDA events and resolves them once at :meth:`finish`, so timing never inserts a
    device synchronisation inside the step (which would change what is measured).
    """

    PHASES = ("fwd", "bwd", "sync", "opt")

    def __init__(self, device: torch.device | None = None, offset_ns: int = 0) -> None:
        self.cuda = device is not None and device.type == "cuda"
        self.offset_ns = offset_ns
        self._marks: list[tuple[str, Any]] = []
        self.t_start_ns = 0

    def start(self) -> None:
        self._marks = []
        self.t_start_ns = _perf_ns() + self.offset_ns
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append(("start", ev))

    def mark(self, phase: str, at_ns: int | None = None) -> None:
        """End of ``phase`` (one of PHASES), i.e. start of the next one. ``at_ns`` (CPU only):
        a ``perf_counter_ns`` reading taken earlier, when the phase really ended."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append((phase, ev))
        else:
            self._marks.append((phase, at_ns if at_ns else _perf_ns()))

    def finish(self) -> dict[str, float]:
        """Phase durations in ms plus ``step_ms`` and ``t_start_ns``."""
        out = {f"{p}_ms": 0.0 for p in self.PHASES}
        if self.cuda:
            torch.cuda.synchronize()
            prev = self._marks[0][1]
            for phase, ev in self._marks[1:]:
                out[f"{phase}_ms"] += prev.elapsed_time(ev)
                prev = ev
            out["step_ms"] = self._marks[0][1].elapsed_time(self._marks[-1][1])
        else:
            prev = self.t_start_ns - self.offset_ns
            for phase, t in self._marks:
                out[f"{phase}_ms"] += (t - prev) / 1e6
                prev = t
            out["step_ms"] = (prev - (self.t_start_ns - self.offset_ns)) / 1e6
        out["t_start_ns"] = self.t_start_ns
        return out
