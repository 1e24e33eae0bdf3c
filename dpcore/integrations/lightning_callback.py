"""``dpcore.integrations.LightningCallback``: a Lightning ``Trainer``'s training as a dpcore run.

Usage (every rank runs it: Lightning launches the ranks)::

    trainer = lightning.Trainer(strategy=DDPStrategy(process_group_backend="gloo"), accelerator="cpu",
                                devices=2, callbacks=[dpcore.integrations.LightningCallback("profiles")])
    trainer.fit(model, loader)

Why a callback over :func:`dpcore.record`: the same recording (same warm-up, traced and timed
steps, the same rows and run directory), driven by the Trainer's own hooks instead of ``with``
blocks the user would have to write into Lightning's loop. A step is one training batch
(``on_train_batch_start`` .. ``on_train_batch_end``); its phases are where Lightning marks
them: forward until ``on_before_backward``, backward until ``on_after_backward``, optimizer
from ``on_before_optimizer_step`` to the batch's end (what lies between, gradient clipping
and Lightning's bookkeeping, counts as sync/other). The model recorded is the strategy's
``DistributedDataParallel``, so its bucket size is the one the strategy built it with, and a comm
hook on that model is kept (:class:`~dpcore.write.commands.record_hooks.CollectiveTap`): one
registered through ``DDPStrategy(ddp_comm_hook=...)`` (Lightning does so on CUDA only) or, on
CPU, by the user in ``LightningModule.on_fit_start`` (``self.trainer.strategy.model``). run.json's config says which
framework, its version and the strategy.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning
from lightning.pytorch.callbacks import Callback

from dpcore.write.commands.record import Recording, record


class LightningCallback(Callback):
    """Record ``trainer.fit``'s training batches into a run under ``out`` (see the module
    docstring); ``warmup`` and ``profile_steps`` mean what they mean for ``dpcore.record``.
    ``run_dir`` is the run's folder once training started."""

    def __init__(self, out: str | Path = "profiles", name: str | None = None, warmup: int = 2,
                 profile_steps: int = 3) -> None:
        self.out, self.name, self.warmup, self.profile_steps = out, name, warmup, profile_steps
        self.rec: Recording | None = None
        self.run_dir: Path | None = None
        self._phase: Any = None

    # -- the run --------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        model = trainer.strategy.model  # DistributedDataParallel under DDPStrategy
        self.rec = record(self.out, name=self.name, model=model, warmup=self.warmup,
                          profile_steps=self.profile_steps).__enter__()
        self.run_dir = self.rec.run_dir
        writer = self.rec._life.writer  # rank 0's: what the framework says goes into run.json
        if writer is not None:
            writer.meta["config"].update(framework="lightning", framework_version=lightning.__version__,
                                         strategy=type(trainer.strategy).__name__,
                                         model=type(pl_module).__name__)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(exception)

    def _finish(self, exc: BaseException | None) -> None:
        rec, self.rec = self.rec, None
        if rec is None:
            return
        self._close_phase()
        if rec._in_step:
            rec._step_obj.__exit__(type(exc) if exc else None, exc, None)
        rec.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)

    # -- steps and phases -------------------------------------------------------------------
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.rec is not None:
            self.rec.step(samples=_batch_len(batch)).__enter__()
            self._open_phase("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._open_phase("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._close_phase()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._open_phase("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        rec = self.rec
        if rec is not None and rec._in_step:
            self._close_phase()
            rec._step_obj.__exit__(None, None, None)

    def _open_phase(self, name: str) -> None:
        rec = self.rec
        if rec is None or not rec._in_step:
            return
        self._close_phase()
        self._phase = rec.phase(name)
        self._phase.__enter__()

    def _close_phase(self) -> None:
        if self._phase is not None:
            phase, self._phase = self._phase, None
            phase.__exit__(None, None, None)


def _batch_len(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (None if it has none)."""
    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else None
