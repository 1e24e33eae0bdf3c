"""What every framework callback shares: a :func:`dpcore.record` recording driven by the
framework's hooks instead of ``with`` blocks (begin and end a step, open a phase, finish).

Why one driver: the recording's rules (warm-up, traced and timed steps, the rows, the run life
cycle) must be the ones ``dpcore.record`` has, whatever framework calls them, and each callback
should only translate its framework's hook names into these few calls.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dpcore.write.commands.record import Recording, record


class RecordingDriver:
    """A recording opened late (when the framework has built its DDP model) and fed by hooks."""

    def __init__(self, out: str | Path, name: str | None, warmup: int, profile_steps: int) -> None:
        if warmup < 0 or profile_steps < 1:
            raise ValueError(f"warmup must be >= 0 and profile_steps >= 1, got {warmup} and {profile_steps}")
        self.out, self.name, self.warmup, self.profile_steps = out, name, warmup, profile_steps
        self.rec: Recording | None = None
        self.run_dir: Path | None = None
        self._phase: Any = None

    def start(self, model: Any, config: dict[str, Any]) -> None:
        """Open the recording on every rank (a collective: every rank calls it at the same
        point); ``config`` goes into run.json's config (framework, version, ...)."""
        self.rec = record(self.out, name=self.name, model=model, warmup=self.warmup,
                          profile_steps=self.profile_steps).__enter__()
        self.run_dir = self.rec.run_dir
        writer = self.rec._life.writer  # rank 0's
        if writer is not None:
            writer.meta["config"].update(config)

    @property
    def in_step(self) -> bool:
        return self.rec is not None and self.rec._in_step

    def begin_step(self, samples: int | None) -> None:
        if self.rec is not None and not self.rec._in_step:
            self.rec.step(samples=samples).__enter__()

    def end_step(self) -> None:
        if self.in_step:
            self.close_phase()
            assert self.rec is not None
            self.rec._step_obj.__exit__(None, None, None)

    def phase(self, name: str) -> None:
        """Open phase ``name`` (forward, backward, optimizer), closing the open one first."""
        if not self.in_step:
            return
        self.close_phase()
        assert self.rec is not None
        self._phase = self.rec.phase(name)
        self._phase.__enter__()

    def close_phase(self) -> None:
        if self._phase is not None:
            phase, self._phase = self._phase, None
            phase.__exit__(None, None, None)

    @property
    def current_phase(self) -> str | None:
        return self._phase.name if self._phase is not None else None

    def finish(self, exc: BaseException | None = None) -> None:
        """End the recording: the run is written (``failed`` with the error if ``exc``)."""
        rec, self.rec = self.rec, None
        if rec is None:
            return
        self.close_phase()
        if rec._in_step:
            rec._step_obj.__exit__(type(exc) if exc else None, exc, None)
        rec.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)


def batch_len(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (None if it has none)."""
    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else None
