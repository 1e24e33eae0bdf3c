"""``fsdp``: fully sharded data parallel from scratch (parameters, gradients, optimizer state).

Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB 2023),
i.e. ZeRO stage 3 (Rajbhandari et al., SC 2020): >= 2-D parameters are sharded across ranks
(a flat, zero-padded shard of ceil(numel/N) elements per parameter); each module's full
parameters are all-gathered just before its forward and again before its backward, and
freed after each; gradients are reduce-scattered to the owning shard; 1-D parameters stay
replicated and are all-reduced. The mechanics live in :mod:`dpcore.write.dp.fsdp_units`.

``compute_dtype`` (float16 / bfloat16): the shards are cast before the all-gather (half the
bytes on the wire) and the forward/backward run in that dtype, while the master shards, their
gradients and the optimizer stay float32 (gradients are reduce-scattered in float32, as
FSDP's ``MixedPrecisionPolicy(reduce_dtype=float32)``). Floating inputs are cast on the way in
and floating outputs back to float32 on the way out, so the loss is computed in float32.
A ``--dtype bf16`` / ``fp16`` job gets its half type here (the trainer passes it), as an FSDP
job under mixed precision sets ``param_dtype``.

Volume per step for P parameter bytes of sharded parameters: two all-gathers (forward and
backward) and one reduce-scatter, 3(N-1)/N P (the all-gathers halve with a 2-byte
``compute_dtype``); the replicated 1-D parameters add a small all-reduce.

The optimizer is built over the shards (``make_optimizer``): any elementwise optimizer (SGD,
Adam, AdamW...) then keeps state for 1/N of every sharded parameter. ``no_sync`` still
communicates (a sharded gradient cannot wait): the accumulated result is the same.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.fsdp_units import ShardEngine
from dpcore.write.dp.sharding import Collectives, tensors_device
from dpcore.write.dp.variants.base import Wrapper, broadcast_module

#: ``compute_dtype`` names accepted from configs and the CLI.
COMPUTE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": None}


def _cast(obj: Any, dtype: torch.dtype) -> Any:
    """Floating tensors in ``obj`` (nested tuples / lists / dicts) cast to ``dtype``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_cast(o, dtype) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_cast(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast(v, dtype) for k, v in obj.items()}
    return obj


class FSDP(Wrapper):
    """The ``fsdp`` wrapper: ``.module`` holds shards; see the module docstring."""

    name = "fsdp"
    processes = "N"

    def __init__(self, module: nn.Module, *, group: Any = None,
                 recorder: Recorder = NULL_RECORDER, bucket_mb: float = 25.0,
                 compute_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("fsdp needs an initialised process group")
        self.module = module
        self.group, self.recorder, self.bucket_mb = group, recorder, float(bucket_mb)
        self.compute_dtype = compute_dtype
        broadcast_module(module, group, recorder)  # replicas start equal, then each keeps 1/N
        self.coll = Collectives(group, recorder, prefix="fsdp",
                                device=tensors_device(module.parameters()))
        self.engine = ShardEngine(module, self.coll, compute_dtype)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        dt = self.compute_dtype
        if dt is not None:
            args, kwargs = _cast(args, dt), _cast(kwargs, dt)
        try:
            out = self.module(*args, **kwargs)
        finally:
            self.engine.end_forward()
        return _cast(out, torch.float32) if dt is not None else out

    def finish_gradient_synchronization(self) -> None:
        """Every trainable parameter of ``.module`` gets a ``.grad`` of its shard's shape."""
        with record_function("grad_sync_fsdp"):
            self.engine.finish()

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Full parameters by ``named_parameters()`` name (a collective: call on every rank)."""
        out: dict[str, torch.Tensor] = {}
        for name, p in self.module.named_parameters():
            shape = self.engine.shapes.get(p)
            if shape is None:
                out[name] = p.detach().clone()
                continue
            full = torch.empty(p.numel() * self.coll.world_size, dtype=p.dtype, device=p.device)
            self.coll.all_gather(full, p.detach())
            out[name] = full[:shape.numel()].view(shape).clone()
        return out

    def memory_tensors(self, optimizer: torch.optim.Optimizer | None = None
                       ) -> dict[str, list[torch.Tensor]]:
        """Shards and replicated parameters, their gradients, the optimizer state (of the
        shards), and in ``other`` the full tensors gathered right now plus reduce-scatter
        buffers in flight."""
        out = super().memory_tensors(optimizer)
        out["other"] = self.engine.gathered_buffers()
        return out


def parse_compute_dtype(value: Any) -> torch.dtype | None:
    """``None`` / a torch dtype / a name in :data:`COMPUTE_DTYPES` -> dtype (None: float32)."""
    from dpcore.contract.errors import UsageError
    if value is None or value in (torch.float16, torch.bfloat16):
        return value
    if value == torch.float32:
        return None
    if isinstance(value, str) and value in COMPUTE_DTYPES:
        return COMPUTE_DTYPES[value]
    raise UsageError(f"unknown compute_dtype {value!r}; valid choices: "
                     f"{', '.join(COMPUTE_DTYPES)} (or torch.float16 / torch.bfloat16)")
