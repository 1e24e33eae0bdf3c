"""DP variants: one module per variant, one interface (:class:`Wrapper`), one registry.

``VARIANTS`` / ``MULTIPROCESS`` / ``SINGLE_PROCESS`` / ``SHARDED`` are docs/DESIGN.md's names
(defined torch-free in :mod:`dpcore.contract.config`). Every class in ``REGISTRY`` derives from
:class:`Wrapper`; its ``processes`` says how a job of it runs: ``1`` (single, manual,
data_parallel: a job of one process, given the logical replica count N as
``dpcore.write.training.trainer.make_trainer(..., replicas=N)``) or ``"N"`` (one process per rank, built
with :func:`wrap`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from dpcore.contract.config import (
    MULTIPROCESS,
    OPTIMIZERS,
    PARAM_SHARDED,
    REPLICATED,
    SHARDED,
    SINGLE_PROCESS,
    VARIANTS,
)
from dpcore.contract.errors import UsageError, choices_error
from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.variants.base import Wrapper
from dpcore.write.dp.variants.bucketed import BucketedDP, assign_buckets
from dpcore.write.dp.variants.central import CentralDP
from dpcore.write.dp.variants.data_parallel import DataParallelDP
from dpcore.write.dp.variants.flat import FlatDP
from dpcore.write.dp.variants.fsdp import FSDP, parse_compute_dtype
from dpcore.write.dp.variants.manual import ManualDP
from dpcore.write.dp.variants.naive import NaiveDP
from dpcore.write.dp.variants.overlap import OverlapDP
from dpcore.write.dp.variants.ring import RingDP
from dpcore.write.dp.variants.single import SingleDP
from dpcore.write.dp.variants.torch_ddp import TorchDDP
from dpcore.write.dp.variants.torch_fsdp import TorchFSDP
from dpcore.write.dp.variants.torch_zero1 import TorchZero1
from dpcore.write.dp.variants.zero1 import Zero1DP

REGISTRY: dict[str, type[Wrapper]] = {
    "single": SingleDP, "manual": ManualDP, "naive": NaiveDP, "flat": FlatDP,
    "central": CentralDP, "ring": RingDP, "overlap": OverlapDP, "bucketed": BucketedDP,
    "torch_ddp": TorchDDP, "data_parallel": DataParallelDP, "zero1": Zero1DP,
    "torch_zero1": TorchZero1, "fsdp": FSDP, "torch_fsdp": TorchFSDP,
}
assert tuple(REGISTRY) == VARIANTS, "registry and docs/DESIGN.md names must match"
assert all(REGISTRY[v].name == v for v in VARIANTS), "a class's name must be its registry key"
assert {v for v in VARIANTS if REGISTRY[v].processes == 1} == set(SINGLE_PROCESS), \
    "a class's processes must agree with dpcore.contract.config.SINGLE_PROCESS"


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """``--optimizer`` name (one of ``OPTIMIZERS``) -> the torch.optim class every variant's
    ``make_optimizer`` receives (sharded variants shard its state)."""
    classes = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if name not in classes:
        raise choices_error("optimizer", name, OPTIMIZERS)
    return classes[name]


def wrap(variant: str, module: nn.Module, *, bucket_mb: float = 25.0, group: Any = None,
         recorder: Recorder = NULL_RECORDER, compute_dtype: Any = None, comm_hook: str = "none",
         powersgd_rank: int = 1) -> Wrapper:
    """Wrap ``module`` (already on this rank's device) in a multi-process DP variant.

    Needs an initialised process group. Every parameter and buffer is broadcast from rank 0
    here, so replicas start equal whatever their initialisation. ``compute_dtype``
    (``torch.float16`` / ``torch.bfloat16`` or their names) is for ``fsdp`` and ``torch_fsdp``:
    all-gather and compute in that dtype, master weights, gradients and optimizer in float32.
    ``comm_hook`` (``torch_ddp`` only; contract.config.COMM_HOOKS) registers one of DDP's own
    comm hooks (fp16, bf16 compression, PowerSGD of rank ``powersgd_rank``).
    """
    if variant not in REGISTRY:
        raise choices_error("variant", variant, VARIANTS)
    if variant not in MULTIPROCESS:
        raise UsageError(f"variant {variant!r} runs in one process and is not a wrapper for a "
                         f"process group; multi-process variants: {', '.join(MULTIPROCESS)}")
    if compute_dtype is not None:
        if variant not in PARAM_SHARDED:
            raise UsageError(f"compute_dtype is an fsdp / torch_fsdp option; variant {variant!r} "
                             "computes in the model's own dtype (use wrap('fsdp', module, "
                             "compute_dtype=torch.bfloat16))")
        cls = FSDP if variant == "fsdp" else TorchFSDP
        return cls(module, bucket_mb=bucket_mb, group=group, recorder=recorder,
                   compute_dtype=parse_compute_dtype(compute_dtype))
    if comm_hook != "none":
        if variant != "torch_ddp":
            raise UsageError(f"comm_hook is a torch_ddp option; variant {variant!r} has no DDP comm hook")
        return REGISTRY[variant](module, bucket_mb=bucket_mb, group=group, recorder=recorder,
                                 comm_hook=comm_hook, powersgd_rank=powersgd_rank)
    return REGISTRY[variant](module, bucket_mb=bucket_mb, group=group, recorder=recorder)


__all__ = ["VARIANTS", "MULTIPROCESS", "SINGLE_PROCESS", "SHARDED", "REPLICATED", "REGISTRY",
           "Wrapper", "wrap", "optimizer_class", "assign_buckets"]
