"""``manual``: N model replicas in ONE process, gradients averaged on a CPU master copy.

What DP does, with nothing hidden: split the batch N ways, run each replica on its shard
(its own local mean loss), then average the N gradients on the host (GPU->CPU, sum, /N,
CPU->GPU on GPUs, like a parameter server) and copy the average back into every replica, so
all replicas take the same optimizer step and stay identical. Replicas are placed round-robin
on the local GPUs (all on the CPU without GPUs).
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
from torch.profiler import record_function

from dpcore.write.dp.variants.base import LossFn
from dpcore.write.dp.variants.single import LocalWrapper


class ManualDP(LocalWrapper):
    name = "manual"

    def __init__(self, module: nn.Module, *, replicas: int = 2) -> None:
        super().__init__(module)
        self.n = max(1, int(replicas))
        self.loss_terms = self.n
        dev = next(module.parameters()).device
        gpus = torch.cuda.device_count() if dev.type == "cuda" else 0
        devices = [torch.device("cuda", i % gpus) if gpus else dev for i in range(self.n)]
        module.to(devices[0])
        # replica 0 is .module; the others are deliberately not registered as children
        self.__dict__["replicas"] = [module] + [copy.deepcopy(module).to(d) for d in devices[1:]]
        self.devices = devices
        self._master = [torch.zeros(p.shape, dtype=p.dtype) for p in module.parameters()
                        if p.requires_grad]

    def _trainable(self, rep: nn.Module) -> list[nn.Parameter]:
        return [p for p in rep.parameters() if p.requires_grad]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [rep(xs.to(d)) for rep, xs, d in zip(self.replicas, x.chunk(self.n), self.devices)]
        return torch.cat([o.to(self.devices[0]) for o in outs])

    def forward_loss(self, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn) -> torch.Tensor:
        """Sum of the replicas' local mean losses: backward gives each replica its own grad."""
        losses = []
        for i, (rep, d) in enumerate(zip(self.replicas, self.devices)):
            with record_function(f"replica{i}"):
                xs, ys = x.chunk(self.n)[i].to(d), y.chunk(self.n)[i].to(d)
                losses.append(loss_fn(rep(xs), ys).to(self.devices[0]))
        return torch.stack(losses).sum()

    def optim_parameters(self) -> list[nn.Parameter]:
        return [p for rep in self.replicas for p in self._trainable(rep)]

    def finish_gradient_synchronization(self) -> None:
        """Average the replicas' gradients on the CPU master copy (skipped in ``no_sync``)."""
        if not self.require_backward_grad_sync or self.n == 1:
            return
        per_rep = [self._trainable(rep) for rep in self.replicas]
        with torch.no_grad():
            for j, master in enumerate(self._master):
                with record_function(f"average_param{j}"):
                    grads = [ps[j].grad for ps in per_rep]
                    master.zero_()
                    for g in grads:
                        if g is not None:
                            master.add_(g.to("cpu", non_blocking=False))
                    master.div_(self.n)
                    for ps in per_rep:
                        if ps[j].grad is None:
                            ps[j].grad = torch.zeros_like(ps[j])
                        ps[j].grad.copy_(master)
