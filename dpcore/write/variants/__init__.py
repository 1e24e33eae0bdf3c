"""DP variants: one module per variant, one interface, one registry.

``VARIANTS`` / ``MULTIPROCESS`` are DESIGN.md's names. ``PROCESSES[name]`` is the number of
processes a job of that variant runs: ``1`` (single, manual, data_parallel: launch the job
with world size 1 and pass the logical replica count N to
``dpcore.write.train.make_trainer(..., replicas=N)``) or ``"N"`` (one process per rank).
"""
from __future__ import annotations

from typing import Any

import torch.nn as nn

from dpcore.contract.config import MULTIPROCESS, SINGLE_PROCESS, VARIANTS
from dpcore.contract.errors import UsageError, choices_error
from dpcore.write.variants.bucketed import BucketedDP, assign_buckets
from dpcore.write.variants.central import CentralDP
from dpcore.write.variants.data_parallel import DataParallelDP
from dpcore.write.variants.flat import FlatDP
from dpcore.write.variants.manual import ManualDP
from dpcore.write.variants.naive import NaiveDP
from dpcore.write.variants.overlap import OverlapDP
from dpcore.write.variants.ring import RingDP
from dpcore.write.variants.single import SingleDP
from dpcore.write.variants.torch_ddp import TorchDDP

REGISTRY: dict[str, type[nn.Module]] = {
    "single": SingleDP, "manual": ManualDP, "naive": NaiveDP, "flat": FlatDP,
    "central": CentralDP, "ring": RingDP, "overlap": OverlapDP, "bucketed": BucketedDP,
    "torch_ddp": TorchDDP, "data_parallel": DataParallelDP,
}
assert tuple(REGISTRY) == VARIANTS, "registry and DESIGN names must match"
PROCESSES: dict[str, int | str] = {v: REGISTRY[v].processes for v in VARIANTS}


def launch_world_size(variant: str, world_size: int) -> int:
    """How many processes to launch for ``variant`` at logical world size ``world_size``."""
    if variant not in REGISTRY:
        raise choices_error("variant", variant, VARIANTS)
    return 1 if PROCESSES[variant] == 1 else world_size


def wrap(variant: str, module: nn.Module, *, bucket_mb: float = 25.0, group: Any = None,
         recorder: Any = None) -> nn.Module:
    """Wrap ``module`` (already on this rank's device) in a multi-process DP variant.

    Needs an initialised process group. Every parameter and buffer is broadcast from rank 0
    here, so replicas start equal whatever their initialisation.
    """
    if variant not in REGISTRY:
        raise choices_error("variant", variant, VARIANTS)
    if variant not in MULTIPROCESS:
        raise UsageError(f"variant {variant!r} runs in one process and is not a wrapper for a "
                         f"process group; multi-process variants: {', '.join(MULTIPROCESS)}")
    return REGISTRY[variant](module, bucket_mb=bucket_mb, group=group, recorder=recorder)


__all__ = ["VARIANTS", "MULTIPROCESS", "SINGLE_PROCESS", "PROCESSES", "REGISTRY", "wrap",
           "launch_world_size", "assign_buckets"]
