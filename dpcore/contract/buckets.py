"""Gradient bucketing: which gradients share one all-reduce (pure, torch-free).

Why here: the ``bucketed`` variant (write wing) packs real gradients with this rule, and the
what-if model (read wing) re-packs the recorded gradients of a run into buckets of other sizes.
Both must use the same rule, and neither wing may import the other.

Li et al. 2020 ("PyTorch Distributed", section 3.2.2) pack gradients in REVERSE registration
order (roughly the order backward produces them) into buckets of about ``bucket_cap_mb``. Two
closing rules exist:

* dpcore's ``bucketed``: a bucket closes BEFORE a gradient would push it past the cap
  (:func:`assign_buckets`), so no bucket exceeds the cap unless one gradient alone does;
* PyTorch DDP (``compute_bucket_assignment_by_size`` in c10d's reducer): the gradient is added
  first and the bucket closes once it REACHES the cap (:func:`assign_buckets_ddp`), so buckets
  are slightly over the cap. With an explicit ``bucket_cap_mb`` DDP uses no smaller first
  bucket, and after the first iteration it rebuilds buckets in gradient-ready order (for a
  feed-forward model the reverse registration order again).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MB = 1024 * 1024  # bucket_cap_mb is MiB in DDP too

#: Variant -> closing rule used when re-packing its gradients.
RULES = ("dpcore", "ddp")


def assign_buckets(sizes: Sequence[int], cap_bytes: float,
                   keys: Sequence[Any] | None = None) -> list[list[int]]:
    """Greedy bucket assignment of tensors given in launch order (dpcore's ``bucketed`` rule).

    A bucket closes when adding the next tensor would pass ``cap_bytes`` (a tensor bigger
    than the cap gets a bucket of its own) or when the key (dtype/device) changes.
    """
    buckets: list[list[int]] = []
    size = 0.0
    for i, nbytes in enumerate(sizes):
        new_key = keys is not None and buckets and keys[buckets[-1][-1]] != keys[i]
        if not buckets or new_key or size + nbytes > cap_bytes:
            buckets.append([i])
            size = float(nbytes)
        else:
            buckets[-1].append(i)
            size += nbytes
    return buckets


def assign_buckets_ddp(sizes: Sequence[int], cap_bytes: float) -> list[list[int]]:
    """PyTorch DDP's rule for tensors given in launch order: add the tensor, then close the
    bucket once its size reaches ``cap_bytes``."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0.0
    for i, nbytes in enumerate(sizes):
        current.append(i)
        size += nbytes
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0.0
    if current:
        buckets.append(current)
    return buckets


def rule_for(variant: str) -> str:
    """The closing rule of a variant's buckets: ``ddp`` for ``torch_ddp``, else ``dpcore``."""
    return "ddp" if variant == "torch_ddp" else "dpcore"


def pack_reverse(sizes: Sequence[int], bucket_mb: float, rule: str = "dpcore") -> list[list[int]]:
    """Buckets of gradients given in REGISTRATION order (index = registration index), packed in
    reverse registration order as DDP does; returns registration indices, buckets in launch
    order. ``rule``: ``dpcore`` or ``ddp`` (see the module docstring)."""
    if rule not in RULES:
        raise ValueError(f"unknown bucket rule {rule!r}; valid choices: {', '.join(RULES)}")
    order = list(range(len(sizes)))[::-1]
    launch = [sizes[i] for i in order]
    cap = float(bucket_mb) * MB
    plan = assign_buckets(launch, cap) if rule == "dpcore" else assign_buckets_ddp(launch, cap)
    return [[order[j] for j in b] for b in plan]
