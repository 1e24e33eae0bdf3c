"""The machinery of ``fsdp``: sharded parameters, per-module all-gather / free, gradient
reduce-scatter, prefetch. The wrapper (:mod:`dpcore.write.dp.variants.fsdp`) only wires it up.

FSDP (Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", VLDB
2023; ZeRO stage 3 in Rajbhandari et al., SC 2020): a rank stores 1/N of every large
parameter, its gradient and its optimizer state; a module's full parameters exist only while
that module computes.

Layout (one *unit* per module that directly owns parameters or buffers):

* A parameter with >= 2 dims is replaced IN ITS MODULE by a flat shard: an ``nn.Parameter`` of
  ``ceil(numel/N)`` elements (zero padded at the end), so ``module.parameters()``, the optimizer
  and ``.grad`` all see shards, in the master dtype (float32). A tied parameter (one tensor in
  two modules) becomes one shard, used by both units.
* For compute, each unit has its own full tensor of the parameter (``compute_dtype``), whose
  STORAGE is freed (resized to 0 bytes) between uses; the full view is shadowed onto the module
  as an instance attribute during its forward, so ``self.weight`` inside ``forward`` is the full
  weight while ``named_parameters()`` keeps the shard (and its order).
* 1-D parameters (biases, norms) stay replicated; their gradients are all-reduced in one
  coalesced call after backward. With ``compute_dtype`` they (and floating buffers) are cast by
  a differentiable ``.to()`` per forward, so their gradients arrive in float32.

Schedule: forward pre-hook = all-gather (or wait for the prefetched one) and prefetch the NEXT
unit of the previous forward's order asynchronously, so it overlaps this unit's compute;
forward post-hook = free, and a hook on the outputs that re-gathers before this unit's backward
(prefetching the unit before it). Each full weight's gradient, once accumulated, is cast to
float32, divided by N and reduce-scattered asynchronously into the owner's shard; the full
weight is freed right there, and at most MAX_INFLIGHT_REDUCE_SCATTERS stay in flight.
``finish()`` waits for the rest, adds the shard gradients into ``.grad`` (so accumulation and
tied weights add up), all-reduces the replicated ones and frees what is left.

Assumptions (as DDP without ``find_unused_parameters``): every rank runs the same modules in
the same order; a module's parameters are used only inside its own forward.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from dpcore.write.dp.sharding import Collectives, shard_size

#: Reduce-scatters allowed in flight during backward: each holds a full-size float32 gradient,
#: so the oldest is settled (waited, added into its shard's ``.grad``, buffer dropped) when
#: another would pass this; gradient memory stays ~2 full parameters, not all of them.
MAX_INFLIGHT_REDUCE_SCATTERS = 2


class ShardedParam:
    """One >= 2-D parameter as one unit uses it: the shard and this unit's full tensor."""

    __slots__ = ("attr", "param", "numel", "full", "view", "live", "work", "src")

    def __init__(self, attr: str, param: nn.Parameter, shape: torch.Size, world: int,
                 dtype: torch.dtype) -> None:
        self.attr, self.param, self.numel = attr, param, int(torch.Size(shape).numel())
        self.full = torch.empty(world * param.numel(), dtype=dtype, device=param.device)
        # The leaf autograd differentiates aliases full's storage but has its OWN version
        # counter: the backend writes each all-gather into ``full`` (on its own thread, so a
        # version bump there could not be undone), and the saved-for-backward ``view`` must
        # not look modified when its storage is refilled with the same values.
        self.view = torch.empty(0, dtype=dtype, device=param.device).set_(
            self.full.untyped_storage(), 0, shape)
        if param.requires_grad:
            self.view.requires_grad_()
        self.live = True
        self.work: Any = None
        self.src: torch.Tensor | None = None  # the all-gather input, alive until it is done
        self.free()

    def free(self) -> None:
        if self.live:
            self.full.untyped_storage().resize_(0)
            self.live = False


class Unit:
    """One module's sharded parameters and the attributes cast for compute."""

    def __init__(self, index: int, module: nn.Module) -> None:
        self.index, self.module = index, module
        self.sharded: list[ShardedParam] = []
        self.cast: list[str] = []   # replicated params / floating buffers cast to compute dtype


class ShardEngine:
    """Shards ``module`` in place and drives gathers, frees and gradient reduction."""

    def __init__(self, module: nn.Module, coll: Collectives,
                 compute_dtype: torch.dtype | None = None) -> None:
        self.coll, self.compute_dtype = coll, compute_dtype
        self.world, self.rank = coll.world_size, coll.rank
        self.units: list[Unit] = []
        self.shapes: dict[nn.Parameter, torch.Size] = {}   # shard -> full shape
        self.replicated: list[nn.Parameter] = []
        self._order: list[Unit] = []       # units in the order the current forward ran them
        self._prev_order: list[Unit] = []  # ... and the previous forward (prefetch plan)
        self._pending: list[tuple[Any, torch.Tensor, nn.Parameter, torch.Tensor]] = []
        self._backward_seen = False
        self._bwd_units: set[int] = set()  # units whose backward began (gathered once each)
        self._build(module)

    # -- construction ----------------------------------------------------------------------
    def _build(self, root: nn.Module) -> None:
        shard_of: dict[int, nn.Parameter] = {}
        seen_rep: set[int] = set()
        for mod in root.modules():
            unit = Unit(len(self.units), mod)
            for attr, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if p.dim() >= 2 and p.numel() > 0 and p.is_floating_point():
                    if id(p) not in shard_of:
                        shard_of[id(p)] = self._make_shard(p)
                    sp = shard_of[id(p)]
                    mod._parameters[attr] = sp
                    entry = ShardedParam(attr, sp, self.shapes[sp], self.world,
                                         self.compute_dtype or sp.dtype)
                    unit.sharded.append(entry)
                    if sp.requires_grad:
                        entry.view.register_post_accumulate_grad_hook(
                            self._grad_hook(unit, entry))
                else:
                    if id(p) not in seen_rep:
                        seen_rep.add(id(p))
                        self.replicated.append(p)
                    if self.compute_dtype is not None and p.is_floating_point():
                        unit.cast.append(attr)
            if self.compute_dtype is not None:
                unit.cast += [a for a, b in mod._buffers.items()
                              if b is not None and b.is_floating_point()]
            if unit.sharded or unit.cast:
                self.units.append(unit)
                mod.register_forward_pre_hook(self._pre_forward_hook(unit))
                mod.register_forward_hook(self._post_forward_hook(unit))

    def _make_shard(self, p: nn.Parameter) -> nn.Parameter:
        c = shard_size(p.numel(), self.world)
        data = torch.zeros(c, dtype=p.dtype, device=p.device)
        flat = p.detach().reshape(-1)[self.rank * c:(self.rank + 1) * c]
        data[:flat.numel()].copy_(flat)
        sp = nn.Parameter(data, requires_grad=p.requires_grad)
        self.shapes[sp] = p.shape
        return sp

    # -- gather / free ---------------------------------------------------------------------
    def _launch_gather(self, unit: Unit) -> None:
        for sp in unit.sharded:
            if sp.live or sp.work is not None:
                continue
            sp.full.untyped_storage().resize_(sp.full.numel() * sp.full.element_size())
            src = sp.param.detach()
            sp.src = src if src.dtype == sp.full.dtype else src.to(sp.full.dtype)
            with torch.no_grad():
                sp.work = self.coll.all_gather(sp.full, sp.src, bucket=unit.index,
                                               async_op=True)

    def _wait_gather(self, unit: Unit) -> None:
        self._launch_gather(unit)
        for sp in unit.sharded:
            if sp.work is not None:
                sp.work.wait()
                sp.work, sp.src, sp.live = None, None, True

    def _prefetch(self, unit: Unit, step: int) -> None:
        """Start the all-gather of the unit ``step`` places after ``unit`` in the order of the
        last finished forward (+1 in forward, -1 in the backward that follows it)."""
        order = self._prev_order
        if unit in order:
            k = order.index(unit) + step
            if 0 <= k < len(order) and not (step < 0 and order[k].index in self._bwd_units):
                self._launch_gather(order[k])

    def free_all(self) -> None:
        for unit in self.units:
            self._wait_gather_if_pending(unit)
            for sp in unit.sharded:
                sp.free()

    def _wait_gather_if_pending(self, unit: Unit) -> None:
        if any(sp.work is not None for sp in unit.sharded):
            self._wait_gather(unit)

    # -- hooks -----------------------------------------------------------------------------
    def _pre_forward_hook(self, unit: Unit) -> Callable[..., None]:
        def hook(mod: nn.Module, _args: Any) -> None:
            if unit not in self._order:
                self._order.append(unit)
            self._wait_gather(unit)
            self._prefetch(unit, +1)
            for sp in unit.sharded:
                object.__setattr__(mod, sp.attr, sp.view)
            for attr in unit.cast:
                src = mod._parameters.get(attr)
                src = mod._buffers[attr] if src is None else src
                object.__setattr__(mod, attr, src.to(self.compute_dtype))
        return hook

    def _post_forward_hook(self, unit: Unit) -> Callable[..., None]:
        def hook(mod: nn.Module, _args: Any, output: Any) -> None:
            for attr in [sp.attr for sp in unit.sharded] + unit.cast:
                mod.__dict__.pop(attr, None)
            for sp in unit.sharded:
                sp.free()
            if torch.is_grad_enabled():
                for t in _tensors(output):
                    if t.requires_grad:
                        t.register_hook(lambda g, u=unit: self._pre_backward(u))
        return hook

    def _pre_backward(self, unit: Unit) -> None:
        self._backward_seen = True
        self._wait_gather(unit)  # no-op when a second output of the unit already gathered it
        if unit.index not in self._bwd_units:
            self._bwd_units.add(unit.index)  # its backward began: never prefetch it again
            self._prefetch(unit, -1)

    def _grad_hook(self, unit: Unit, sp: ShardedParam) -> Callable[[torch.Tensor], None]:
        def hook(view: torch.Tensor) -> None:
            g, view.grad = view.grad, None
            send = torch.empty(sp.full.numel(), dtype=sp.param.dtype, device=sp.param.device)
            send[sp.numel:].zero_()
            torch.div(g.reshape(-1), self.world, out=send[:sp.numel])
            out = torch.empty_like(sp.param)
            work = self.coll.reduce_scatter(out, send, bucket=unit.index, async_op=True)
            self._pending.append((work, out, sp.param, send))
            sp.free()
            while len(self._pending) > MAX_INFLIGHT_REDUCE_SCATTERS:
                self._settle(self._pending.pop(0))
        return hook

    @staticmethod
    def _settle(entry: tuple[Any, torch.Tensor, nn.Parameter, torch.Tensor]) -> None:
        """Wait for one reduce-scatter and add its shard into ``.grad`` (tied weights and
        accumulation add up)."""
        work, out, param, _send = entry
        work.wait()
        if param.grad is None:
            param.grad = out
        else:
            param.grad.add_(out)

    # -- after backward --------------------------------------------------------------------
    def finish(self) -> None:
        """Shard gradients into ``.grad``, replicated gradients all-reduced, all freed."""
        if not self._backward_seen:
            return
        for entry in self._pending:
            self._settle(entry)
        self._pending.clear()
        for sp in self.shapes:
            if sp.requires_grad and sp.grad is None:
                sp.grad = torch.zeros_like(sp)  # not used this step: zero, as on every rank
        rep = [p for p in self.replicated if p.requires_grad]
        if rep:
            for p in rep:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat = torch.cat([p.grad.reshape(-1) for p in rep]).div_(self.world)
            self.coll.all_reduce(flat)
            off = 0
            for p in rep:
                p.grad.copy_(flat[off:off + p.numel()].view_as(p.grad))
                off += p.numel()
        self.free_all()
        self._backward_seen = False
        self._bwd_units.clear()

    def end_forward(self) -> None:
        """The root's forward ended: its unit order plans the next forward's prefetch."""
        self._prev_order, self._order = self._order, []
        self._bwd_units.clear()

    def gathered_buffers(self) -> list[torch.Tensor]:
        """Full tensors currently holding memory, and reduce-scatter buffers in flight."""
        live = [sp.full for u in self.units for sp in u.sharded
                if sp.full.untyped_storage().nbytes() > 0]
        return live + [t for _w, out, _p, send in self._pending for t in (out, send)]


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors in a module's output (a tensor, or nested tuples / lists / dicts)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []
