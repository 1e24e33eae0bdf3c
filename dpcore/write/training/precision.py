"""The precision a job trains in (``--dtype``): autocast, fp16's gradient scaler, TF32, ``auto``.

Why autocast with float32 master weights rather than half-precision parameters: that is how
people train (Lightning's ``precision="bf16-mixed"``, the Hugging Face Trainer's ``bf16=True``,
``torch.autocast`` in a hand-written loop), so the step times and the bytes on the wire are the
ones a user's job has: compute in the half type, gradients and optimizer in float32. fp16 needs
a gradient scaler (its range underflows small gradients); bf16 has float32's range and does not.

``auto`` is bf16 on a GPU whose tensor cores compute it (compute capability 8.0 and up:
A100, H100, RTX 30xx...) and fp32 otherwise. torch's ``is_bf16_supported()`` also says yes
where bf16 is only emulated (V100, T4: no bf16 units, slower than fp32), so the question asked
is the hardware one. On a CPU bf16 autocast is often slower than float32: only when asked for.

Sharded variants and fp16: the gradient scaler looks for inf/nan in the gradients the
optimizer steps, which on a sharded rank are only its own shards (fsdp, torch_fsdp) or its
own parameters (zero1). Ranks would then disagree on skipping a step and diverge for good, so
their scaler (:func:`grad_scaler` with ``sync_ranks``) takes the maximum of the found-inf flag
over the group before deciding, as PyTorch's sharded scaler does.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from dpcore.contract.config import PRECISION_TORCH

#: The first CUDA compute capability with bf16 tensor cores (Ampere, sm_80).
BF16_NATIVE_CAPABILITY = (8, 0)


def gpu_computes_bf16() -> bool:
    """Whether the current GPU computes bf16 in hardware (not merely emulates it).

    ``is_bf16_supported(including_emulation=False)`` where this torch has the argument;
    otherwise (older torch) compute capability >= 8.0, the same question asked directly."""
    if not torch.cuda.is_available():
        return False
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # a torch whose is_bf16_supported has no including_emulation
        return tuple(torch.cuda.get_device_capability()) >= BF16_NATIVE_CAPABILITY


def resolve_dtype(dtype: str, device_type: str) -> str:
    """``--dtype`` as the jobs run it: ``auto`` -> bf16 on a GPU that computes bf16 in
    hardware (:func:`gpu_computes_bf16`), else fp32."""
    if dtype != "auto":
        return dtype
    if device_type == "cuda" and gpu_computes_bf16():
        return "bf16"
    return "fp32"


def param_dtype_name(precision: str, compute_dtype: str = "") -> str | None:
    """The dtype the parameter-sharded variants (fsdp, torch_fsdp) all-gather and compute in:
    ``compute_dtype`` where given, else the half type of a bf16 / fp16 job (what FSDP users
    set as ``MixedPrecisionPolicy(param_dtype=...)``), None (float32) for fp32."""
    if compute_dtype:
        return compute_dtype
    return PRECISION_TORCH[precision] if precision in ("bf16", "fp16") else None


def torch_dtype(precision: str) -> torch.dtype:
    """fp32 / bf16 / fp16 -> torch.float32 / bfloat16 / float16."""
    return getattr(torch, PRECISION_TORCH[precision])


def autocast(device: torch.device, precision: str) -> Any:
    """The forward's context: nothing for fp32, ``torch.autocast`` in the half type otherwise."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch_dtype(precision))


class RankAgreeingGradScaler(torch.amp.GradScaler):
    """A gradient scaler whose skip decision is the group's: after unscaling this rank's
    gradients, the found-inf flag is all-reduced (MAX) over ``group``, so every rank skips
    the step when any rank's shard overflowed (see the module docstring). A rank with no
    gradient to check (a ZeRO-1 rank that owns nothing) still takes part, with 0."""

    def __init__(self, device: str, group: Any = None) -> None:
        super().__init__(device)
        self.group = group

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        super().unscale_(optimizer)
        if not self.is_enabled():
            return
        state = self._per_optimizer_states[id(optimizer)]
        scale = self._scale
        assert scale is not None  # set by unscale_ above
        found = torch.zeros((), dtype=torch.float32, device=scale.device)
        for flag in state["found_inf_per_device"].values():
            found += flag.to(scale.device)
        dist.all_reduce(found, op=dist.ReduceOp.MAX, group=self.group)
        state["found_inf_per_device"] = {scale.device: found}


def grad_scaler(device: torch.device, precision: str, sync_ranks: bool = False,
                group: Any = None) -> Any:
    """fp16's gradient scaler on ``device`` (None for fp32 and bf16, which need none).
    ``sync_ranks``: the ranks of ``group`` decide together whether to skip a step
    (:class:`RankAgreeingGradScaler`, for the sharded variants)."""
    if precision != "fp16":
        return None
    if sync_ranks:
        return RankAgreeingGradScaler(device.type, group)
    return torch.amp.GradScaler(device.type)


def set_tf32(on: bool) -> None:
    """Allow (or forbid) TF32 in float32 matmuls and convolutions on GPUs, in this process."""
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def tf32_enabled() -> bool:
    """Whether float32 matmuls on a GPU may use TF32 in this process (torch's own switch)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


def autocast_precision(device_type: str) -> str:
    """The precision code running now under ``device_type`` computes in: the autocast type
    where autocast is on (bf16 / fp16), else fp32. What ``dpcore.record`` writes for a user's
    loop, read at step time, inside the loop's own autocast."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return "fp32"
        dt = torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError, RuntimeError):  # a torch without per-device queries
        return "fp32"
    names = {v: k for k, v in PRECISION_TORCH.items()}
    return names.get(str(dt).removeprefix("torch."), str(dt).removeprefix("torch."))
