"""``dpcore.integrations.LightningCallback``: a Lightning ``Trainer``'s training as a dpcore run.

Usage (every rank runs it: Lightning launches the ranks)::

    trainer = lightning.Trainer(strategy=DDPStrategy(process_group_backend="gloo"), accelerator="cpu",
                                devices=2, callbacks=[dpcore.integrations.LightningCallback("profiles")])
    trainer.fit(model, loader)

Why a callback over :func:`dpcore.record`: the same recording (same warm-up, traced and timed
steps, the same rows and run directory; :class:`~dpcore.integrations.driver.RecordingDriver`),
driven by the Trainer's own hooks instead of ``with`` blocks the user would have to write into
Lightning's loop. A step is one training batch (``on_train_batch_start`` ..
``on_train_batch_end``); its phases are where Lightning marks them: forward until
``on_before_backward``, backward until ``on_after_backward``, optimizer from
``on_before_optimizer_step`` to the batch's end (what lies between, gradient clipping and
Lightning's bookkeeping, counts as sync/other). The model recorded is the strategy's
``DistributedDataParallel``, so its bucket size is the one the strategy built it with, and a comm
hook on that model is kept (:class:`~dpcore.write.commands.record_hooks.CollectiveTap`): one
registered through ``DDPStrategy(ddp_comm_hook=...)`` (Lightning does so on CUDA only) or, on
CPU, by the user in ``LightningModule.on_fit_start`` (``self.trainer.strategy.model``).
run.json's config says which framework, its version, the strategy and its precision setting.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning
from lightning.pytorch.callbacks import Callback

from dpcore.integrations.driver import RecordingDriver, batch_len


class LightningCallback(Callback):
    """Record ``trainer.fit``'s training batches into a run under ``out`` (see the module
    docstring); ``warmup`` and ``profile_steps`` mean what they mean for ``dpcore.record``.
    ``run_dir`` is the run's folder once training started."""

    def __init__(self, out: str | Path = "profiles", name: str | None = None, warmup: int = 2,
                 profile_steps: int = 3) -> None:
        self.driver = RecordingDriver(out, name, warmup, profile_steps)

    @property
    def run_dir(self) -> Path | None:
        return self.driver.run_dir

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.driver.start(trainer.strategy.model,  # DistributedDataParallel under DDPStrategy
                          {"framework": "lightning", "framework_version": lightning.__version__,
                           "strategy": type(trainer.strategy).__name__, "model": type(pl_module).__name__,
                           # the framework's own setting ("bf16-mixed"); config dtype says what
                           # the forward really ran in (autocast, read by the recording)
                           "precision": str(trainer.precision)})

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.driver.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.driver.finish(exception)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.driver.begin_step(batch_len(batch))
        self.driver.phase("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.driver.phase("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.driver.close_phase()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.driver.phase("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.driver.end_step()
