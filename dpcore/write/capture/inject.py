"""``--inject-hang RANK:STEP[:sleep]``: make one rank hang a job on purpose, so users and tests
can see what the hang lab says about each kind of hang.

- ``skip``: RANK skips the first ``torch.distributed.all_reduce`` of STEP (a desync: its next
  collective, the next step's barrier, meets the others' all-reduce). With gloo, a desync whose
  next collective carries more data than the others expect aborts that rank instead (gloo
  checks sizes); with one gradient all-reduce per step (``flat``, ``naive`` on a one-tensor
  model, ``bucketed`` with one bucket) the ranks hang, which is what the watchdog catches.
- ``sleep``: RANK sleeps forever where that all-reduce would start (a missing rank).

Why patch ``dist.all_reduce`` for the one step: every variant's gradient all-reduce goes
through it (looked up at call time), so no variant carries injection code. Variants that
reduce gradients otherwise (``ring``, ``fsdp``, ...) are not affected: ``during`` tells the
caller whether the injection fired, and such a job completes with a note that says so
(:func:`missed_note`).
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class HangInjection:
    """Which rank hangs at which step, and how (``skip`` or ``sleep``)."""

    rank: int
    step: int
    mode: str = "skip"

    @contextlib.contextmanager
    def during(self, rank: int, step: int) -> Iterator[list[bool]]:
        """Patch ``dist.all_reduce`` on the chosen rank for the chosen step only. Yields a list
        that holds ``True`` once the injection fired (it stays empty on every other rank and
        step, and on the chosen one when the step never called ``dist.all_reduce``)."""
        fired: list[bool] = []
        if rank != self.rank or step != self.step:
            yield fired
            return
        real = dist.all_reduce

        def injected(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if fired:
                return real(tensor, *args, **kwargs)
            fired.append(True)
            if self.mode == "sleep":
                threading.Event().wait()  # forever: the watchdog ends this process
            if kwargs.get("async_op", len(args) >= 3 and args[2]):
                fut: torch.futures.Future = torch.futures.Future()
                fut.set_result([tensor])
                from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]  # no stub
                return _create_work_from_future(fut)
            return None

        dist.all_reduce = injected
        try:
            yield fired
        finally:
            dist.all_reduce = real


@dataclass(frozen=True)
class Injections:
    """What ``profile --inject-delay`` and ``--inject-hang`` ask of a job's ranks, handed to every
    rank as this one value: the delay's rank sleeps ``delay_ms`` in its forward every step (a
    straggler; the trainer does it, :meth:`delay_s`), the hang's rank hangs one all-reduce."""

    hang: HangInjection | None = None
    delay_rank: int = -1  # -1: nobody
    delay_ms: float = 0.0

    @classmethod
    def of(cls, delay: tuple[int, float] | None, hang: tuple[int, int, str] | None) -> Injections:
        """From the options' values (``ProfileOptions.inject_delay``, ``.inject_hang``)."""
        return cls(HangInjection(*hang) if hang else None, *(delay or (-1, 0.0)))

    def delay_s(self, rank: int) -> float:
        """Seconds ``rank`` sleeps in each forward (0 for every rank but the delayed one)."""
        return self.delay_ms / 1e3 if rank == self.delay_rank else 0.0


def missed_note(inject: HangInjection, variant: str) -> str:
    """The job note of a job whose injected rank ran the chosen step without calling
    ``dist.all_reduce``: the job completed, and the user asked for a hang."""
    return (f"--inject-hang {inject.rank}:{inject.step}:{inject.mode} did not fire: {variant} "
            f"reduces its gradients without torch.distributed.all_reduce, the call the injection "
            f"replaces; flat, naive, overlap and bucketed call it")
