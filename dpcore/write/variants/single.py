"""``single``: the whole global batch on one device, no communication.

The baseline every other variant must match (``verify``) and the T(1) of scaling charts.
Single-process variants share the wrapper surface of :class:`~dpcore.write.variants.base.DPWrapper`
(``.module``, ``no_sync``, ``finish_gradient_synchronization``, ``on_train_batch_start``) so the
Trainer drives every variant with the same code.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn as nn


class LocalWrapper(nn.Module):
    """Base of the one-process variants: a pass-through module with no-op sync methods."""

    name = "local"
    processes = 1
    loss_terms = 1  # the loss returned by forward_loss is a sum of this many means

    def __init__(self, module: nn.Module, **_: Any) -> None:
        super().__init__()
        self.module = module
        self.skip_reason: str | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def forward_loss(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Any) -> torch.Tensor:
        return loss_fn(self(x), y)

    def optim_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield

    def finish_gradient_synchronization(self) -> None:
        """Nothing to synchronise in one process."""

    def on_train_batch_start(self) -> None:
        """No per-batch state."""


class SingleDP(LocalWrapper):
    name = "single"
