"""``torch_fsdp``: PyTorch's ``fully_shard`` (FSDP2), the production reference for ``fsdp``.

Zhao et al., "PyTorch FSDP" (VLDB 2023); FSDP2 shards every parameter as a ``DTensor``
(``Shard(0)``) on a one-dimensional device mesh over the group. ``fully_shard`` is applied to
every module that directly owns parameters none of which it shares with another module (so a
tied embedding/head weight stays with the root), then to the root: one all-gather per module
before its forward and backward, one reduce-scatter of its gradients.

Where it cannot run: ``fully_shard`` needs the flat all-gather and reduce-scatter of the
backend (``all_gather_into_tensor`` / ``reduce_scatter_tensor``); older gloo builds lack
reduce-scatter, and some torch builds lack ``fully_shard``. Both are checked (NCCL is asked,
any other backend probed with a one-element collective on every rank, on the model's
device), and the job is skipped with the reason, like ``data_parallel`` without GPUs.
torch 2.13's gloo has both, so it runs on CPU.

Mixed precision: ``compute_dtype`` (bfloat16 / float16; the trainer passes a bf16 / fp16
job's half type) becomes ``MixedPrecisionPolicy(param_dtype=compute_dtype,
reduce_dtype=float32, output_dtype=float32)``, what an FSDP2 job under mixed precision sets:
parameters are all-gathered and computed in the half type (half the bytes of float32 on the
wire), gradients reduce-scattered in float32, outputs handed back in float32 like ``fsdp``'s.

Recording: with a recording recorder, FSDP2's public ``set_custom_all_gather`` /
``set_custom_reduce_scatter`` hooks install comms that issue the same collectives as FSDP2's
defaults and log each one (``all_gather`` / ``reduce_scatter`` rows, one per module).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.sharding import group_backend, has_native_reduce_scatter, tensors_device
from dpcore.write.dp.variants.base import Wrapper, broadcast_module


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank really stores); other tensors as they are."""
    return t.to_local() if hasattr(t, "to_local") else t


class TorchFSDP(Wrapper):
    name = "torch_fsdp"
    processes = "N"
    grad_sync_in_backward = True  # FSDP2 waits for its reduce-scatters at the end of backward

    def __init__(self, module: nn.Module, *, group: Any = None,
                 recorder: Recorder = NULL_RECORDER, bucket_mb: float = 25.0,
                 compute_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.module = module
        self.compute_dtype = compute_dtype
        self.skip_reason = _probe(group, tensors_device(module.parameters()))
        if self.skip_reason:
            return
        broadcast_module(module, group, recorder)  # fully_shard keeps each rank's own slice
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        policy: dict[str, Any] = {}
        if compute_dtype is not None:
            from torch.distributed.fsdp import MixedPrecisionPolicy
            policy["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype,
                                                       reduce_dtype=torch.float32,
                                                       output_dtype=torch.float32)
        dev = next(module.parameters()).device.type
        mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, dev)
        owners: dict[int, int] = {}
        for mod in module.modules():
            for p in mod.parameters(recurse=False):
                owners[id(p)] = owners.get(id(p), 0) + 1
        units = [mod for mod in list(module.modules())[1:]
                 if list(mod.parameters(recurse=False))
                 and all(owners[id(p)] == 1 for p in mod.parameters(recurse=False))]
        for mod in reversed(units):  # bottom-up, as fully_shard expects (then the root)
            fully_shard(mod, mesh=mesh, **policy)
        fully_shard(module, mesh=mesh, **policy)
        if recorder.enabled:
            _install_recorded_comms(module, recorder)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """No-op: FSDP2 reduce-scatters inside backward and waits at its end."""

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Full parameters by name (``DTensor.full_tensor()``: a collective on every rank)."""
        return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for n, p in self.module.named_parameters()}

    def memory_tensors(self, optimizer: torch.optim.Optimizer | None = None
                       ) -> dict[str, list[torch.Tensor]]:
        """The local shards of parameters, gradients and optimizer state."""
        out = super().memory_tensors(optimizer)
        return {k: [_local(t) for t in v] for k, v in out.items()}


def _probe(group: Any, device: torch.device) -> str | None:
    """Why ``fully_shard`` cannot run here, or None (see the module docstring): the backend
    is asked about the tensors on ``device``, the model's (NCCL answers without a probe)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard ({exc})"
    if not has_native_reduce_scatter(group, device):
        return (f"the {group_backend(group, device)} backend of torch {torch.__version__} has no "
                "reduce_scatter_tensor, which fully_shard needs")
    return None


def _install_recorded_comms(module: nn.Module, recorder: Recorder) -> None:
    """Log FSDP2's all-gathers and reduce-scatters (its own default comms, plus a log row)."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
    except ImportError:
        return  # an older FSDP2 without custom comms: runs, unrecorded

    def logged(op: str, nbytes: int, call: Any) -> Any:
        with record_function(f"torch_fsdp_{op}"):
            idx = recorder.launch(op, "native", nbytes)
            work = call()
            if work is None:  # a blocking call: its end is when it returned
                recorder.done(idx)
                return work
            # FSDP2 waits on what we return: the recorded work logs that wait (and, for a gloo
            # work without a future, the end when the wait returns)
            return recorder.track(idx, work)

    class _AllGather(DefaultAllGather):
        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                     group: Any, async_op: bool = False) -> Any:
            return logged("all_gather", output_tensor.numel() * output_tensor.element_size(),
                          lambda: super(_AllGather, self).__call__(output_tensor, input_tensor,
                                                                   group, async_op))

    class _ReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                     group: Any, op: Any, async_op: bool = False) -> Any:
            return logged("reduce_scatter", input_tensor.numel() * input_tensor.element_size(),
                          lambda: super(_ReduceScatter, self).__call__(
                              output_tensor, input_tensor, group, op, async_op))

    for mod in module.modules():
        if isinstance(mod, FSDPModule):
            try:
                mod.set_custom_all_gather(_AllGather())
                mod.set_custom_reduce_scatter(_ReduceScatter())
            except (AttributeError, ValueError):
                return
