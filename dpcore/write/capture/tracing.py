"""torch.profiler capture of a few training steps, shared by ``profile`` and ``dpcore.record``.

Why one helper: both the profile worker and a user's recorded loop must produce traces the
read wing understands the same way: ``ProfilerStep#N`` numbered like steps.csv's ``step``,
``dpcore_clock_sync#k`` markers bracketed by shared-clock reads (so the merged trace and the
timeline can place the trace on the job's clock, see :mod:`dpcore.contract.clocksync`), the
file written atomically to ``traces/<job>/rank<r>.json.gz``, and Kineto's stderr chatter kept
out of the terminal. The two callers differ only in who drives the steps, so the capture is an
object with explicit ``start`` / ``step`` / ``stop`` calls rather than a ``with`` around a loop.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from dpcore.contract import runformat
from dpcore.contract.clocksync import marker_name

#: Markers emitted before each recorded step: several, so one descheduled read does not spoil
#: the trace-to-shared-clock shift (the reader takes the best bracket).
MARKERS_PER_STEP = 3


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send this process's fd 2 to ``path`` (Kineto prints start/stop chatter straight to
    stderr, which would shred the progress bars); restored afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
    if path.exists() and all(ln.startswith("USDT:") for ln in path.read_text(errors="replace")
                             .splitlines()):
        path.unlink()  # only Kineto's start/stop chatter: leave no noise file in the run


class TraceCapture:
    """Profile steps ``first .. last`` of one rank and export its Chrome trace.

    ``warmup_step``: a step before ``first`` that runs under the profiler without being
    recorded (Kineto's own warm-up, which removes start-up cost from the first recorded step);
    None to start recording at once. The caller runs its steps between :meth:`start` and
    :meth:`stop`, calls :meth:`markers` before each recorded step (outside its timing) and
    :meth:`step` after every step; the trace is exported when ``last`` ends (or at
    :meth:`stop`, with what was recorded, if the caller stops early). A trace that cannot be
    written leaves :attr:`error` set instead of raising: it must not cost the steps measured.

    ``settle``: called once on every rank in the :meth:`step` that ends ``last``, after that
    step's ``ProfilerStep#`` range has closed and before the profiler stops and exports (so its
    own events fall outside every recorded step); `runtime.launch.settle_collectives` for a job whose
    ranks all reach ``last``. An early :meth:`stop` (an error) does not call it: the other ranks
    may never get there.
    """

    def __init__(self, trace_dir: Path | str, rank: int, job_id: str, offset_ns: int, *,
                 first: int, last: int, warmup_step: int | None, cuda: bool = False,
                 settle: Callable[[], None] | None = None) -> None:
        self.dir = Path(trace_dir)
        self.rank, self.job_id, self.offset_ns = rank, job_id, int(offset_ns)
        self.first, self.last, self.warmup_step = first, last, warmup_step
        self.cuda = cuda
        self.settle = settle
        self.path = self.dir / runformat.rank_trace_name(rank)
        self.error = ""
        self.exported = False
        #: (t_a, t_b) shared-clock reads around each dpcore_clock_sync#k marker, in k order
        self.sync: list[tuple[int, int]] = []
        self._stack: contextlib.ExitStack | None = None
        self._prof: Any = None

    @property
    def running(self) -> bool:
        return self._stack is not None

    @property
    def trace_file(self) -> Path | None:
        """The exported trace, or None when none was written."""
        return self.path if self.exported and not self.error else None

    def _schedule(self, n: int) -> Any:
        A = torch.profiler.ProfilerAction
        # torch.profiler asks about step n once step n - 1 has ended, and stops if that one
        # was RECORD_AND_SAVE: the last moment with the profiler still running.
        if n == self.last + 1 and self.settle is not None:
            self.settle()
        if n == self.warmup_step:
            return A.WARMUP
        if self.first <= n < self.last:
            return A.RECORD
        return A.RECORD_AND_SAVE if n == self.last else A.NONE

    def _export(self, prof: Any) -> None:
        tmp = self.path.with_name(f".rank{self.rank}.{os.getpid()}.tmp.json.gz")
        try:
            prof.export_chrome_trace(str(tmp))
            os.replace(tmp, self.path)
            self.exported = True
        except Exception as exc:  # noqa: BLE001 - a full disk: OSError, or torch's RuntimeError
            self.error = f"trace export failed on rank {self.rank}: {exc}"
        finally:  # half a trace (a full disk) is never left beside the run's files
            tmp.unlink(missing_ok=True)

    def start(self) -> None:
        """Start the profiler at the warm-up step (or at ``first`` without one)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        begin = self.first if self.warmup_step is None else self.warmup_step
        # Shapes (each op's Input Dims / Input type) give a GEMM's FLOPs, so achieved TFLOP/s and MFU:
        # recorded on a GPU only, where MFU is measured. On a CPU job they buy nothing and cost the
        # traced steps 4-14 % more (a small op-bound MLP, interleaved medians: docs/gpus.md, "GPU time").
        prof = torch.profiler.profile(activities=acts, schedule=self._schedule,
                                      on_trace_ready=self._export, record_shapes=self.cuda)
        # Start numbering at `begin` so trace steps and steps.csv rows share one index.
        prof.step_num, prof.current_action = begin, self._schedule(begin)
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(stderr_to(self.dir / f"rank{self.rank}.profiler.log"))
            stack.enter_context(prof)
            prof.add_metadata_json("dpcore", f'{{"job_id": "{self.job_id}", "rank": {int(self.rank)}, '
                                             f'"offset_ns": {int(self.offset_ns)}}}')
        except BaseException:
            stack.close()
            raise
        self._stack, self._prof = stack, prof

    def markers(self, now: Callable[[], int]) -> None:
        """Emit this step's clock-sync markers, each between two reads of the shared clock."""
        for _ in range(MARKERS_PER_STEP):
            t_a = now()
            with torch.profiler.record_function(marker_name(len(self.sync))):
                t_b = now()
            self.sync.append((t_a, t_b))

    def step(self) -> None:
        """The current step ended (the profiler moves to the next one)."""
        self._prof.step()

    def stop(self) -> None:
        """Stop the profiler (exporting what was recorded if ``last`` was not reached)."""
        stack, self._stack, self._prof = self._stack, None, None
        if stack is not None:
            stack.close()
