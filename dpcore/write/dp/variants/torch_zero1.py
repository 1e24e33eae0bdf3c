"""``torch_zero1``: DDP + ``torch.distributed.optim.ZeroRedundancyOptimizer``, the reference.

PyTorch's ZeRO-1 (Rajbhandari et al., SC 2020, stage 1): the same optimizer class, its state
partitioned by whole parameters across ranks, the updated parameters broadcast from each
owner after the step; gradients averaged by DDP's bucketed all-reduce (same bucket cap as
``bucketed``). With a recording recorder the DDP buckets are logged by ``torch_ddp``'s comm
hook, and the parameter broadcasts of each step as one ``broadcast`` row (bytes: every
trainable parameter, the sum over the N owner broadcasts).
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.profiler import record_function

from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.variants.torch_ddp import TorchDDP

with warnings.catch_warnings(record=True) as _caught:
    # older torch (2.4) warns, with the filter forced to "always", when torch.distributed.optim
    # is imported that its TorchScript functional optimizers are deprecated: dpcore uses none,
    # and the warning would be two more lines on stderr of every command (a bad option must
    # print exactly one). It is caught here and dropped; any other warning is passed on.
    from torch.distributed.optim import ZeroRedundancyOptimizer
for _w in _caught:
    if "`TorchScript` support for functional optimizers" not in str(_w.message):
        warnings.warn_explicit(_w.message, _w.category, _w.filename, _w.lineno)


class _RecordedZeRO(ZeroRedundancyOptimizer):
    """``ZeroRedundancyOptimizer`` whose parameter broadcasts are logged in a Recorder."""

    def __init__(self, params: Any, optimizer_class: type[torch.optim.Optimizer],
                 recorder: Recorder, process_group: Any = None, **kwargs: Any) -> None:
        self._dp_recorder = recorder
        super().__init__(params, optimizer_class=optimizer_class, process_group=process_group,
                         **kwargs)
        self._dp_bytes = sum(p.numel() * p.element_size() for g in self.param_groups
                             for p in g["params"])

    def _sync_params(self) -> None:
        rec = self._dp_recorder
        with record_function("zero1_broadcast_params"):
            idx = rec.launch("broadcast", "native", self._dp_bytes)
            super()._sync_params()
            rec.done(idx)


class TorchZero1(TorchDDP):
    name = "torch_zero1"

    def __init__(self, module: torch.nn.Module, *, recorder: Recorder = NULL_RECORDER,
                 **kw: Any) -> None:
        super().__init__(module, recorder=recorder, **kw)
        self._dp_recorder = recorder
        self._dp_group = kw.get("group")

    def make_optimizer(self, optimizer_cls: type[torch.optim.Optimizer],
                       **kwargs: Any) -> torch.optim.Optimizer:
        return _RecordedZeRO(self.optim_parameters(), optimizer_cls, self._dp_recorder,
                             process_group=self._dp_group, **kwargs)

    def memory_tensors(self, optimizer: torch.optim.Optimizer | None = None
                       ) -> dict[str, list[torch.Tensor]]:
        """Full parameters and gradients; optimizer state of this rank's partition only
        (the local optimizer inside ``ZeroRedundancyOptimizer``)."""
        out = super().memory_tensors(None)
        local = getattr(optimizer, "optim", optimizer)
        if local is not None:
            out["optim"] = [v for s in local.state.values() for v in s.values()
                            if isinstance(v, torch.Tensor)]
        return out
