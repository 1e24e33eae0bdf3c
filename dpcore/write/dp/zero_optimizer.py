"""ZeRO stage 1 from scratch: an optimizer whose state is sharded across the process group.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(SC 2020), stage 1 (P_os): with mixed precision Adam, optimizer state is 12 of the 16 bytes
per parameter; every data-parallel rank holding all of it is pure redundancy. Each rank keeps
state for 1/N of the parameters, steps only those, and the updated parameters go back to the
others. Gradients are still averaged everywhere first (``zero1`` reuses ``bucketed``'s
overlapped all-reduce), so the saving is optimizer memory only, paid for with one extra
parameter exchange per step: with SGD (no state) there is nothing to save.

Sharding layout: WHOLE parameters, assigned to owner ranks balanced by element count
(:func:`~dpcore.write.dp.sharding.assign_owners`), as ``ZeroRedundancyOptimizer`` does, rather
than slices of one flat buffer (DeepSpeed's layout). Why: a torch optimizer then steps exactly
the tensors it would step without sharding (a parameter with no gradient is skipped, shape-aware
optimizers see shapes), so it works with ANY ``torch.optim`` class and matches the unsharded
optimizer bit for bit. The cost: balance is per parameter (a rank may hold a bit more than
1/N, or nothing if there are fewer parameters than ranks).

After the local step each owner broadcasts its parameters, coalesced into one flat buffer per
(owner, dtype): N broadcasts, each rank receives (N-1)/N of the parameter bytes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from dpcore.contract.errors import UsageError
from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.dp.sharding import Collectives, assign_owners, tensors_device


def _as_groups(params: Iterable[Any]) -> list[dict[str, Any]]:
    """torch's two spellings of ``params``: tensors, or dicts with a ``params`` entry."""
    items = list(params)
    if not items:
        raise UsageError("shard_optimizer got an empty parameter list; pass model.parameters()")
    if all(isinstance(g, dict) for g in items):
        return [dict(g, params=list(g["params"])) for g in items]
    if any(isinstance(g, dict) for g in items):
        raise UsageError("shard_optimizer params must be all tensors or all param-group dicts")
    return [{"params": items}]


class ShardedOptimizer(torch.optim.Optimizer):
    """``optimizer_cls`` with its state sharded across ``group`` (ZeRO-1; module docstring).

    A real :class:`torch.optim.Optimizer`: ``param_groups`` are the caller's groups (every
    parameter; an LR scheduler edits them as usual), ``zero_grad`` clears every gradient,
    ``state`` holds only this rank's parameters (``state_dict()`` is therefore this rank's
    shard: save one per rank). :meth:`step` copies the groups' hyper-parameters into the
    inner optimizer, steps the owned parameters and broadcasts them to the other ranks.
    """

    def __init__(self, params: Iterable[Any], optimizer_cls: type[torch.optim.Optimizer], *,
                 group: Any = None, recorder: Recorder = NULL_RECORDER, **kwargs: Any) -> None:
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise UsageError(f"optimizer_cls must be a torch.optim.Optimizer subclass such as "
                             f"torch.optim.Adam, got {optimizer_cls!r}")
        if not dist.is_initialized():
            raise UsageError("shard_optimizer needs an initialised process group "
                             "(torch.distributed.init_process_group)")
        groups = _as_groups(params)
        # a throwaway 0-element parameter validates kwargs and yields the class's defaults
        probe = optimizer_cls([torch.nn.Parameter(torch.zeros(0))], **kwargs)
        super().__init__(groups, dict(probe.defaults))
        self.coll = Collectives(group, recorder, prefix="zero1",
                                device=tensors_device(p for g in groups for p in g["params"]))
        self.rank, self.world_size = self.coll.rank, self.coll.world_size
        flat = [p for g in self.param_groups for p in g["params"]]
        owners = assign_owners([p.numel() for p in flat], self.world_size)
        self.owner: dict[torch.Tensor, int] = dict(zip(flat, owners))
        owned = [{**g, "params": [p for p in g["params"] if self.owner[p] == self.rank]}
                 for g in self.param_groups]
        # the inner optimizer holds the state; it exists only where this rank owns something
        self.inner: torch.optim.Optimizer | None = (
            optimizer_cls([g for g in owned if g["params"]], **kwargs)
            if any(g["params"] for g in owned) else None)
        self._inner_groups = [i for i, g in enumerate(owned) if g["params"]]
        self.state = self.inner.state if self.inner is not None else self.state
        # broadcast plan: per owner and dtype/device, the parameters in a fixed order
        self._plan: list[tuple[int, list[torch.Tensor]]] = []
        for r in range(self.world_size):
            by_key: dict[tuple, list[torch.Tensor]] = {}
            for p in flat:
                if self.owner[p] == r:
                    by_key.setdefault((p.dtype, p.device), []).append(p)
            self._plan.extend((r, ps) for ps in by_key.values())

    def owned_parameters(self) -> list[torch.Tensor]:
        """The parameters whose optimizer state lives on this rank."""
        return [p for p, r in self.owner.items() if r == self.rank]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """Step this rank's parameters, then broadcast every owner's parameters."""
        if closure is not None:
            raise UsageError("shard_optimizer does not take a closure (LBFGS-style "
                             "re-evaluation would need every rank's parameters each time)")
        if self.inner is not None:
            for gi, inner_group in zip(self._inner_groups, self.inner.param_groups):
                for k, v in self.param_groups[gi].items():
                    if k != "params":
                        inner_group[k] = v
            self.inner.step()
        self._broadcast()

    def _broadcast(self) -> None:
        pending = []
        for k, (r, ps) in enumerate(self._plan):
            if r == self.rank:
                buf = torch.cat([p.detach().reshape(-1) for p in ps])
            else:
                buf = torch.empty(sum(p.numel() for p in ps), dtype=ps[0].dtype,
                                  device=ps[0].device)
            pending.append((self.coll.broadcast(buf, r, bucket=k, async_op=True), r, ps, buf))
        for work, r, ps, buf in pending:
            work.wait()
            if r != self.rank:
                off = 0
                for p in ps:
                    p.copy_(buf[off:off + p.numel()].view_as(p))
                    off += p.numel()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict saved by this rank (its shard); keeps the inner optimizer in step."""
        super().load_state_dict(state_dict)
        if self.inner is not None:
            self.inner.state = self.state


def shard_optimizer(params: Iterable[Any], optimizer_cls: type[torch.optim.Optimizer],
                    **kwargs: Any) -> torch.optim.Optimizer:
    """``optimizer_cls(params, **kwargs)`` with its state sharded across the default process
    group (ZeRO-1), for any model in a user's own loop: average the gradients as usual
    (DDP, ``dpcore.wrap``), then ``opt.step()`` steps this rank's share and broadcasts it."""
    return ShardedOptimizer(params, optimizer_cls, **kwargs)
