"""The precision a job trains in (``--dtype``): autocast, fp16's gradient scaler, TF32, ``auto``.

Why autocast with float32 master weights rather than half-precision parameters: that is how
people train (Lightning's ``precision="bf16-mixed"``, the Hugging Face Trainer's ``bf16=True``,
``torch.autocast`` in a hand-written loop), so the step times and the bytes on the wire are the
ones a user's job has: compute in the half type, gradients and optimizer in float32. fp16 needs
a gradient scaler (its range underflows small gradients); bf16 has float32's range and does not.

``auto`` is bf16 on a GPU that supports it and fp32 otherwise: on a CPU, bf16 autocast is
often slower than float32, so it is only used when asked for.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from dpcore.contract.config import PRECISION_TORCH


def resolve_dtype(dtype: str, device_type: str) -> str:
    """``--dtype`` as the jobs run it: ``auto`` -> bf16 on a GPU with bf16 support, else fp32."""
    if dtype != "auto":
        return dtype
    if device_type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def torch_dtype(precision: str) -> torch.dtype:
    """fp32 / bf16 / fp16 -> torch.float32 / bfloat16 / float16."""
    return getattr(torch, PRECISION_TORCH[precision])


def autocast(device: torch.device, precision: str) -> Any:
    """The forward's context: nothing for fp32, ``torch.autocast`` in the half type otherwise."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch_dtype(precision))


def grad_scaler(device: torch.device, precision: str) -> Any:
    """fp16's gradient scaler on ``device`` (None for fp32 and bf16, which need none)."""
    if precision != "fp16":
        return None
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
