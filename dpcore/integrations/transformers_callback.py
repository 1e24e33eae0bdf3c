"""``dpcore.integrations.TransformersCallback``: a Hugging Face ``Trainer``'s training as a run.

Usage (every rank; ``torchrun`` or ``accelerate launch`` starts them)::

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[dpcore.integrations.TransformersCallback("profiles")])
    trainer.train()

The same recording as :func:`dpcore.record` (:class:`~dpcore.integrations.driver.RecordingDriver`).
A step is one optimizer step (``on_step_begin`` .. ``on_step_end``; with gradient accumulation
it holds every micro-batch). The Trainer has no hook between forward and backward, so the
forward phase ends where the model's own forward returns (a forward hook on the model);
backward runs from there to ``on_pre_optimizer_step`` (gradient clipping included; on CPU the
part after the last gradient is ready counts as sync, as for any DDP loop); the optimizer phase
is ``on_pre_optimizer_step`` .. ``on_optimizer_step``; the scheduler and ``zero_grad`` count as
sync/other.

Why the recording starts at the first ``on_step_begin``: the Trainer wraps the model in
``DistributedDataParallel`` (through Accelerate) after ``on_train_begin``, and hands callbacks
only the unwrapped model. The DDP model is found as the object holding that model (:func:`find_ddp`: a
few steps of ``gc.get_referrers``, once per training), so its
bucket size and any comm hook registered on it are the Trainer's (a hook is kept:
:class:`~dpcore.write.commands.record_hooks.CollectiveTap`). Without a process group (one
process), the model itself is recorded.
"""
from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import transformers
from torch.nn.parallel import DistributedDataParallel
from transformers import TrainerCallback

from dpcore.integrations.driver import RecordingDriver


def find_ddp(model: Any) -> Any:
    """The ``DistributedDataParallel`` that wraps ``model``, else ``model`` itself.

    DDP holds the model in its ``_modules`` dict, which its instance ``__dict__`` holds: the
    owner is at most three referrer steps away, through dicts only (a few heap scans, once)."""
    frontier: list[Any] = [model]
    for _ in range(3):
        nxt = []
        for obj in frontier:
            for holder in gc.get_referrers(obj):
                if isinstance(holder, DistributedDataParallel) and holder.module is model:
                    return holder
                if isinstance(holder, dict) and holder is not frontier:
                    nxt.append(holder)
        frontier = nxt
    return model


def hf_precision(args: Any) -> str:
    """The Trainer's precision setting: ``bf16=True`` -> bf16, ``fp16=True`` -> fp16, else fp32."""
    return "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"


class TransformersCallback(TrainerCallback):
    """Record ``trainer.train()``'s optimizer steps into a run under ``out`` (see the module
    docstring); ``warmup`` and ``profile_steps`` mean what they mean for ``dpcore.record``."""

    def __init__(self, out: str | Path = "profiles", name: str | None = None, warmup: int = 2,
                 profile_steps: int = 3) -> None:
        self.driver = RecordingDriver(out, name, warmup, profile_steps)
        self._hook: Any = None

    @property
    def run_dir(self) -> Path | None:
        return self.driver.run_dir

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        d = self.driver
        if d.rec is None and d.run_dir is None and model is not None:
            d.start(find_ddp(model), {"framework": "transformers", "framework_version": transformers.__version__,
                                      "model": type(model).__name__,
                                      "gradient_accumulation_steps": args.gradient_accumulation_steps,
                                      "precision": hf_precision(args)})
            self._hook = model.register_forward_hook(self._forward_done)
        d.begin_step(args.per_device_train_batch_size * args.gradient_accumulation_steps)
        d.phase("forward")

    def _forward_done(self, _module: Any, _inputs: Any, _output: Any) -> None:
        if self.driver.current_phase == "forward":
            self.driver.phase("backward")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.phase("optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.close_phase()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.driver.finish()
