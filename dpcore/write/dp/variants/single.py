"""``single``: the whole global batch on one device, no communication.

The baseline every other variant must match (``verify``) and the T(1) of scaling charts.
:class:`LocalWrapper` is the base of the one-process variants (single, manual, data_parallel):
they answer the same :class:`~dpcore.write.dp.variants.base.Wrapper` calls as the multi-process
ones, so the trainer drives every variant with the same code.
"""
from __future__ import annotations

from typing import Any

import torch.nn as nn

from dpcore.write.dp.variants.base import Wrapper


class LocalWrapper(Wrapper):
    """A pass-through module: one process, nothing to synchronise.

    ``replicas`` is the logical world size N; the one-process variants that use it (manual,
    data_parallel) read it, ``single`` ignores it.
    """

    processes = 1

    def __init__(self, module: nn.Module, *, replicas: int = 1) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Nothing to synchronise in one process."""


class SingleDP(LocalWrapper):
    name = "single"
