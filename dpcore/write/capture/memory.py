"""Memory per rank: bytes of parameters, gradients, optimizer state and other tensors held,
and the peak during one step (memory.csv, one row per (job, rank)).

Why storages, not tensors: a tied weight is one ``Parameter`` used twice, a bucketed variant's
gradients may be views into one flat buffer, an FSDP shard may be a view of a flat parameter.
Summing ``numel() * element_size()`` per tensor counts such memory twice (or counts a view as
small when it pins a large buffer). What a rank really holds is the set of its tensors'
*storages*, so each ``untyped_storage()`` is counted once, keyed by its device and data
pointer. A storage reported under two kinds counts in the first only, in the order
``params, grads, optim, other`` (a gradient that aliases a parameter is parameter memory).

How the peak is taken (``peak_method``):

* GPU (``cuda_allocator``): ``torch.cuda.max_memory_allocated`` over the measured step, after
  ``reset_peak_memory_stats`` at its start: everything the caching allocator handed out,
  activations and temporaries included; ``reserved_bytes``: ``torch.cuda.max_memory_reserved``
  over the same step (what the caching allocator held from the driver at most: the peak plus
  blocks it kept cached), empty on CPU.
* CPU (``tensor_storage+saved_activations``): there is no allocator to ask, so the step is
  sampled at four points (after forward, after backward, after gradient sync, after the
  optimizer step and before gradients are zeroed); at each point the unique-storage total of
  ``Wrapper.memory_tensors(optimizer)``, plus, after forward, the storages autograd saved for
  backward (``torch.autograd.graph.saved_tensors_hooks``, counted once and not when they are
  already a held tensor, e.g. a Linear's weight). The peak is the largest sample. Temporaries
  freed inside an operator are invisible to this method: it is a lower bound of the process's
  real peak, and exact for what the DP variant itself decides to keep.

Cost: all of this happens in ONE untimed step (the last warm-up step, or an extra step after
the timed ones when there is no warm-up; see ``worker.profile_job``). The timed steps only pay
the trainer's ``if probe`` checks.

The per-kind byte columns are the breakdown at the sample with the largest tensor-storage
total (normally after the optimizer step: parameters, gradients and optimizer state all alive).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

#: memory.csv's kinds, in the order a shared storage is attributed to.
KINDS = ("params", "grads", "optim", "other")
#: Where :class:`StepSampler` samples inside a step (the trainer calls ``sample`` at each).
POINTS = ("forward", "backward", "grad_sync", "optimizer")
CPU_METHOD = "tensor_storage+saved_activations"
CPU_METHOD_NO_ACTIVATIONS = "tensor_storage"
GPU_METHOD = "cuda_allocator"

_Key = tuple[str, int]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind a DTensor (``torch_fsdp``'s parameters are DTensors)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def storage_of(t: torch.Tensor) -> tuple[_Key, int]:
    """(key, bytes) of the storage behind ``t``: the key is (device, data pointer), so views
    and aliases of one buffer share it. A tensor without an accessible storage (a wrapper
    subclass, a meta tensor) is keyed by its own identity and counted by its size."""
    t = _local(t)
    try:
        s = t.untyped_storage()
        return (str(s.device), int(s.data_ptr())), int(s.nbytes())
    except (RuntimeError, NotImplementedError, TypeError):
        return ("tensor", id(t)), int(t.numel() * t.element_size())


def unique_bytes(tensors: Iterable[torch.Tensor | None], seen: set[_Key]) -> int:
    """Bytes of the storages of ``tensors`` not yet in ``seen`` (which this call extends).

    Zero-byte storages (an FSDP parameter freed after use, an empty tensor) count nothing and
    are not remembered: several of them may share the null data pointer."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        key, nbytes = storage_of(t)
        if nbytes == 0 or key in seen:
            continue
        seen.add(key)
        total += nbytes
    return total


def held_bytes(groups: dict[str, list[torch.Tensor]]) -> tuple[dict[str, int], set[_Key]]:
    """Bytes per kind of :data:`KINDS` (each storage once, first kind wins) and the storages."""
    seen: set[_Key] = set()
    return {k: unique_bytes(groups.get(k, []), seen) for k in KINDS}, seen


class StepSampler:
    """Samples one step's memory at the trainer's hook points (``Trainer.probe``).

    ``tensors`` returns what the rank holds now (``trainer.model.memory_tensors(opt)``).
    """

    def __init__(self, tensors: Callable[[], dict[str, list[torch.Tensor]]],
                 activations: bool = True) -> None:
        self._tensors = tensors
        self._activations = activations
        self._saved: dict[_Key, int] = {}
        self.samples: dict[str, tuple[dict[str, int], int]] = {}  # point -> (by kind, total)
        self.hooks_failed = False

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """Around the forward pass: remember each storage autograd saves for backward.

        The pack hook returns the tensor itself (autograd's default behaviour) and keeps no
        reference, so nothing lives longer than without us."""
        if not self._activations:
            yield
            return

        def pack(t: torch.Tensor) -> Any:
            try:
                key, nbytes = storage_of(t)
                if nbytes:
                    self._saved[key] = nbytes
            except Exception:  # noqa: BLE001 - counting must never break training
                self.hooks_failed = True
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def sample(self, point: str) -> None:
        """Record the unique-storage total at ``point`` (activations added after forward)."""
        by_kind, seen = held_bytes(self._tensors())
        total = sum(by_kind.values())
        if point == "forward":
            total += sum(b for k, b in self._saved.items() if k not in seen)
        self.samples[point] = (by_kind, total)

    def result(self) -> tuple[dict[str, int], int]:
        """(bytes per kind at the sample with the largest held total, peak over samples)."""
        if not self.samples:
            return {k: 0 for k in KINDS}, 0
        by_kind = max((s[0] for s in self.samples.values()), key=lambda d: sum(d.values()))
        return by_kind, max(s[1] for s in self.samples.values())


def measure_step(trainer: Any, run_step: Callable[[], None], *, job_id: str, variant: str,
                 world_size: int, rank: int) -> dict[str, Any]:
    """Run ``run_step`` (one untimed training step) with a :class:`StepSampler` installed on
    ``trainer`` and return this rank's memory.csv row (see the module docstring)."""
    device = trainer.ctx.device
    cuda = device.type == "cuda"
    sampler = StepSampler(lambda: trainer.model.memory_tensors(trainer.opt), activations=not cuda)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    trainer.probe = sampler
    try:
        run_step()
    finally:
        trainer.probe = None
    by_kind, peak = sampler.result()
    reserved = None  # CPU: no caching allocator, the cell stays empty
    if cuda:
        peak, method = int(torch.cuda.max_memory_allocated(device)), GPU_METHOD
        reserved = int(torch.cuda.max_memory_reserved(device))
    else:
        method = CPU_METHOD if not sampler.hooks_failed else CPU_METHOD_NO_ACTIVATIONS
    return {"job_id": job_id, "rank": rank, "variant": variant, "world_size": world_size,
            "device": str(device), "param_bytes": by_kind["params"], "grad_bytes": by_kind["grads"],
            "optim_bytes": by_kind["optim"], "other_bytes": by_kind["other"],
            "peak_bytes": int(peak), "peak_method": method, "reserved_bytes": reserved}
