"""A GPU host and a process group faked in-process, that write down the order things happen in.

Why: how a rank binds its GPU and makes its process group is decided in a few calls whose
*order* is the whole point (NCCL makes its communicator on the device that is current when the
group starts, and every object collective or barrier of an NCCL group runs on the current
device). A CPU machine cannot run NCCL, but it can run every line of dpcore's path to that
point against stand-ins for ``torch.cuda`` and ``torch.distributed`` that record each call
with the device current at that moment. One process plays one rank at a time: a fresh
:class:`FakeHost` per rank is a fresh process (current device 0, no group).

What is faked (and nothing else, so a path that touches anything more fails loudly):
``torch.cuda`` is_available, device_count, set_device, current_device, get_device_name;
``torch.distributed`` is_available, is_nccl_available, is_initialized, init_process_group,
get_rank, get_world_size, get_backend, new_group, broadcast_object_list, gather_object,
all_gather_object, barrier, send, recv, destroy_process_group, and the default group
(``dist.group.WORLD``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.distributed as dist


@dataclass(eq=False)
class FakeGroup:
    """A process group as dpcore sees it: its backend, and the device it was bound to."""

    backend: str
    bound_device_id: torch.device | None = None


@dataclass
class Call:
    """One call: its name, the device current when it was made, and what it was given."""

    name: str
    device: int
    args: dict[str, Any] = field(default_factory=dict)


class FakeHost:
    """One rank's process on a host with ``gpus`` GPUs, in a job of ``world_size`` ranks.

    ``calls``: every faked call in order. What the other ranks contribute to object
    collectives: ``box``, rank 0's list for a broadcast; ``objects``, {rank: object} for a
    gather (None for a rank not named)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, gpus: int, rank: int, world_size: int,
                 box: list[Any] | None = None, objects: dict[int, Any] | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.box, self.objects = box, objects or {}
        self.current = 0
        self.calls: list[Call] = []
        self.world: FakeGroup | None = None
        self.groups: list[FakeGroup] = []
        mp = monkeypatch
        mp.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        mp.setattr(torch.cuda, "device_count", lambda: gpus)
        mp.setattr(torch.cuda, "set_device", self.set_device)
        mp.setattr(torch.cuda, "current_device", lambda: self.current)
        mp.setattr(torch.cuda, "get_device_name", lambda i=None: "Fake H200")
        mp.setattr(torch, "set_num_threads", lambda n: None)  # the test process keeps its own
        for var in ("GLOO_SOCKET_IFNAME", "TORCH_FR_BUFFER_SIZE"):  # set by a rank's body
            mp.setenv(var, os.environ.get(var, "lo" if var.startswith("GLOO") else "2000"))
        mp.setattr(dist, "is_available", lambda: True)
        mp.setattr(dist, "is_nccl_available", lambda: True)
        mp.setattr(dist, "is_initialized", lambda: self.world is not None)
        mp.setattr(dist, "init_process_group", self.init_process_group)
        mp.setattr(dist, "get_rank", lambda group=None: self.rank)
        mp.setattr(dist, "get_world_size", lambda group=None: self.world_size)
        mp.setattr(dist, "get_backend", lambda group=None: (group or self.world).backend)
        mp.setattr(dist, "new_group", self.new_group)
        mp.setattr(dist, "destroy_process_group", self.destroy_process_group)
        for name in ("broadcast_object_list", "gather_object", "all_gather_object", "barrier",
                     "send", "recv"):
            mp.setattr(dist, name, self._collective(name))
        # dist.group.WORLD is a property of torch's; this stand-in answers for it
        mp.setattr(dist, "group", type("group", (), {"WORLD": property(lambda s: self.world)})())

    # -- torch.cuda ---------------------------------------------------------------------
    def set_device(self, device: int | torch.device) -> None:
        index = device.index if isinstance(device, torch.device) else int(device)
        self.calls.append(Call("set_device", self.current, {"index": index}))
        self.current = index

    # -- torch.distributed --------------------------------------------------------------
    def init_process_group(self, backend: str, **kwargs: Any) -> None:
        if self.world is not None:
            raise RuntimeError("trying to initialize the default process group twice")
        self.calls.append(Call("init_process_group", self.current, {"backend": backend, **kwargs}))
        self.world = FakeGroup(backend, kwargs.get("device_id"))

    def new_group(self, ranks: Any = None, timeout: Any = None, backend: str | None = None,
                  **kwargs: Any) -> FakeGroup:
        if self.world is None:
            raise RuntimeError("new_group before init_process_group")
        group = FakeGroup(backend or self.world.backend, self.world.bound_device_id)
        self.groups.append(group)
        self.calls.append(Call("new_group", self.current, {"backend": group.backend,
                                                            "timeout": timeout}))
        return group

    def destroy_process_group(self, group: Any = None) -> None:
        self.calls.append(Call("destroy_process_group", self.current))
        self.world = None

    def _collective(self, name: str) -> Any:
        def call(*args: Any, group: FakeGroup | None = None, **kwargs: Any) -> None:
            if self.world is None:
                raise RuntimeError(f"{name} before init_process_group")
            used = group or self.world
            self.calls.append(Call(name, self.current, {"group": used, "backend": used.backend}))
            if name == "broadcast_object_list" and self.rank != 0 and self.box is not None:
                args[0][:] = list(self.box)
            elif name == "gather_object" and len(args) > 1 and args[1] is not None:
                args[1][:] = [args[0] if r == self.rank else self.objects.get(r)
                              for r in range(self.world_size)]
            elif name == "all_gather_object":
                args[0][:] = [args[1] if r == self.rank else self.objects.get(r)
                              for r in range(self.world_size)]
        return call

    # -- reading the record -------------------------------------------------------------
    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    def first(self, name: str) -> int:
        """Index of the first call named ``name`` (a clear failure when it never came)."""
        names = self.names()
        assert name in names, f"{name} was never called; calls: {names}"
        return names.index(name)

    def collectives(self) -> list[Call]:
        return [c for c in self.calls if c.name in ("broadcast_object_list", "gather_object",
                                                    "all_gather_object", "barrier", "send", "recv")]


def torchrun_env(monkeypatch: pytest.MonkeyPatch, rank: int, local_rank: int, world_size: int,
                 local_world_size: int) -> None:
    """The variables torchrun sets for one rank (no store address: no live rows)."""
    for k, v in {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world_size,
                 "LOCAL_WORLD_SIZE": local_world_size, "TORCHELASTIC_RUN_ID": "fake"}.items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
