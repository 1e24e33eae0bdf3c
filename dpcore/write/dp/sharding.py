"""What the sharded variants (ZeRO-1, FSDP) share: the shard arithmetic and recorded collectives.

Pure parts (testable without processes): :func:`shard_size` (the padded flat shard of one
tensor) and :func:`assign_owners` (which rank steps which whole parameter in ZeRO-1).

:class:`Collectives` issues the sharded variants' all-gathers, reduce-scatters, all-reduces and
broadcasts through the :class:`~dpcore.write.capture.comm_log.Recorder` (op names ``all_gather``,
``reduce_scatter``, ``all_reduce``, ``broadcast``; bytes are the FULL buffer, nccl-tests'
convention, so busbw = algbw x (N-1)/N for the first two) inside ``record_function`` ranges
named after the caller (``fsdp_all_gather``...), so collectives.csv and the traces show them.

Backend gaps: NCCL implements the flat reduce-scatter natively (``ncclReduceScatter``) and
only accepts tensors on the rank's GPU, so a NCCL group is never probed: asked, the backend says
yes. gloo implements ``all_gather_into_tensor`` (an all_gather) and ``reduce_scatter_tensor``
(an all_reduce keeping this rank's slice) on CPU and on CUDA tensors (torch >= 2.3's
ProcessGroupGloo.cpp; probed on CPU at 2.13, float16/bfloat16 too), but older gloo builds
raise "does not support reduce_scatter". For any other backend :class:`Collectives` probes once, with a
one-element collective on every rank ON THE GROUP'S OWN DEVICE (the device the caller's tensors
live on: a probe on CPU tensors would ask a GPU backend a question it must refuse), and where
reduce-scatter is missing runs an all-reduce of the whole buffer and keeps this rank's slice.
That moves 2(N-1)/N of the buffer instead of (N-1)/N, and it is logged as what it is
(``all_reduce``), so the measured volume stays honest.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder

# torch 2.13 renamed the flat collectives (the old names warn); older torch has only the old
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
#: backends whose flat reduce-scatter is a native operation of their library: never probed
NATIVE_REDUCE_SCATTER = ("nccl", "xccl")


def group_backend(group: Any, device: torch.device) -> str:
    """The backend that carries ``device``'s tensors in ``group``: a group made with a
    per-device backend string ("cpu:gloo,cuda:nccl") answers with the pair for
    ``device.type``; a plain one ("gloo") with its name."""
    name = str(dist.get_backend(group))
    pairs = dict(part.split(":", 1) for part in name.split(",") if ":" in part)
    return pairs.get(torch.device(device).type, name)


def tensors_device(tensors: Iterable[torch.Tensor]) -> torch.device:
    """The device of the first of ``tensors`` (a model's parameters), CPU when there is none."""
    first = next(iter(tensors), None)
    return first.device if first is not None else torch.device("cpu")


def has_native_reduce_scatter(group: Any, device: torch.device | str = "cpu") -> bool:
    """Does ``group``'s backend implement the flat reduce-scatter for tensors on ``device``?

    NCCL (and XCCL) do: asked, not probed. Any other case is probed with a one-element
    reduce-scatter on ``device`` on every rank (so every rank must call this at the same
    point, like any collective). gloo's reduce-scatter is an all-reduce of the whole buffer
    on CPU and CUDA tensors alike (torch >= 2.3; an older gloo raises "does not support",
    which the probe answers with no): safe to probe on CUDA tensors too."""
    device = torch.device(device)
    backend = group_backend(group, device)
    if backend in NATIVE_REDUCE_SCATTER:
        return True
    n = dist.get_world_size(group)
    try:
        out = torch.zeros(1, device=device)
        _REDUCE_SCATTER(out, torch.ones(n, device=device), group=group)
        return bool(out.item() == n)
    except (RuntimeError, NotImplementedError, ValueError):
        return False


def shard_size(numel: int, world_size: int) -> int:
    """Elements of each rank's flat shard of a ``numel``-element tensor: ceil(numel / N).

    The last shards are padded with zeros (at most N-1 elements in all), so every rank's
    shard has the same size, as the flat all-gather and reduce-scatter need."""
    return -(-int(numel) // max(1, int(world_size)))


def assign_owners(sizes: Sequence[int], world_size: int) -> list[int]:
    """Owner rank of each parameter (ZeRO-1's partition), balanced by element count.

    Greedy "largest first onto the least loaded rank" (ties: lower rank), deterministic so
    every rank computes the same plan. Whole parameters, never split: any optimizer (also
    ones that look at a parameter's shape, like Adafactor) then steps exactly what it would
    step without sharding. A rank may own nothing when there are fewer parameters than ranks.
    """
    loads = [0] * max(1, world_size)
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        r = min(range(len(loads)), key=lambda k: (loads[k], k))
        owners[i] = r
        loads[r] += int(sizes[i])
    return owners


class _SliceWork:
    """An all-reduce standing in for a reduce-scatter: ``wait()`` copies this rank's slice."""

    def __init__(self, work: Any, full: torch.Tensor, out: torch.Tensor, lo: int) -> None:
        self.work, self.full, self.out, self.lo = work, full, out, lo

    def wait(self) -> bool:
        self.work.wait()
        self.out.copy_(self.full[self.lo:self.lo + self.out.numel()])
        return True


class Collectives:
    """Recorded flat collectives of one process group (see module docstring).

    ``prefix`` names the trace ranges (``<prefix>_all_gather``...). ``device``: where the
    caller's tensors live (the model's device), which is where the backend is asked about
    reduce-scatter. ``native_reduce_scatter`` None asks the backend at the first
    reduce-scatter (a probe, where one is needed, reaches every rank at the same point, so it
    is one more collective in the same order); False forces the all-reduce fallback (tests).
    """

    def __init__(self, group: Any = None, recorder: Recorder = NULL_RECORDER,
                 prefix: str = "sharded", native_reduce_scatter: bool | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.group, self.recorder, self.prefix = group, recorder, prefix
        self.device = torch.device(device)
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._native_rs = native_reduce_scatter

    @property
    def native_reduce_scatter(self) -> bool:
        """Does the backend implement the flat reduce-scatter on this group's device?
        (asked once, on first use: :func:`has_native_reduce_scatter`)"""
        if self._native_rs is None:
            self._native_rs = has_native_reduce_scatter(self.group, self.device)
        return self._native_rs

    def _run(self, op: str, nbytes: int, bucket: int, async_op: bool, fn: Any) -> Any:
        rec = self.recorder
        with record_function(f"{self.prefix}_{op}"):
            idx = rec.launch(op, "native", nbytes, bucket)
            work = fn()
            if async_op:  # the recorded work logs the caller's wait (and, without a
                work = rec.track(idx, work)  # future, the end when the wait returns)
            else:
                rec.done(idx)
        return work

    def all_gather(self, out: torch.Tensor, shard: torch.Tensor, bucket: int = -1,
                   async_op: bool = False) -> Any:
        """``out`` (N x shard elements) = every rank's ``shard``, in rank order."""
        return self._run("all_gather", out.numel() * out.element_size(), bucket, async_op,
                         lambda: _ALL_GATHER(out, shard, group=self.group, async_op=async_op))

    def reduce_scatter(self, out: torch.Tensor, full: torch.Tensor, bucket: int = -1,
                       async_op: bool = False) -> Any:
        """``out`` = this rank's slice of the sum of every rank's ``full`` (N x out elements).

        Without a native reduce-scatter: all-reduce ``full`` in place (it is the caller's
        scratch buffer) and copy the slice, logged as the all-reduce it is."""
        nbytes = full.numel() * full.element_size()
        if self.native_reduce_scatter:
            return self._run("reduce_scatter", nbytes, bucket, async_op,
                             lambda: _REDUCE_SCATTER(out, full, group=self.group,
                                                     async_op=async_op))
        lo = self.rank * out.numel()
        work = self._run("all_reduce", nbytes, bucket, True,
                         lambda: dist.all_reduce(full, group=self.group, async_op=True))
        sliced = _SliceWork(work, full, out, lo)
        if not async_op:
            sliced.wait()
        return sliced

    def all_reduce(self, tensor: torch.Tensor, bucket: int = -1, async_op: bool = False) -> Any:
        """Sum ``tensor`` over the group, in place."""
        return self._run("all_reduce", tensor.numel() * tensor.element_size(), bucket, async_op,
                         lambda: dist.all_reduce(tensor, group=self.group, async_op=async_op))

    def broadcast(self, tensor: torch.Tensor, src_group_rank: int, bucket: int = -1,
                  async_op: bool = False) -> Any:
        """``tensor`` = group rank ``src_group_rank``'s ``tensor``."""
        src = (src_group_rank if self.group is None
               else dist.get_global_rank(self.group, src_group_rank))
        return self._run("broadcast", tensor.numel() * tensor.element_size(), bucket, async_op,
                         lambda: dist.broadcast(tensor, src=src, group=self.group,
                                                async_op=async_op))
