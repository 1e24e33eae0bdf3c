"""DistContext: a rank's place in its job, passed explicitly to everything that runs on a rank.

Why a module of its own: the trainer, the clock, the commands and the recording all need this
one type, and none of them should have to import the launcher (which spawns processes) to get
it. Whoever makes a rank (the launcher, torchrun's world, a user's own process group) fills it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class DistContext:
    """Everything a rank needs to know about its place in the job (passed explicitly)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    threads: int
    #: CPUs this rank is pinned to (os.sched_setaffinity); empty when it is not pinned.
    cpus: tuple[int, ...] = ()
    #: Forwards rank 0's progress events to the launcher; None when nobody listens.
    progress: Callable[[dict], None] | None = None
    #: (host, port) of the job's TCP store, where the ranks send live rows and answer the hang
    #: watchdog (:mod:`dpcore.write.capture.rank_channel`); None when there is none to reach.
    store_addr: tuple[str, int] | None = None

    def report(self, event: dict) -> None:
        """Send a progress event to the parent (rank 0 only; others are ignored)."""
        if self.progress is not None and self.rank == 0:
            self.progress(event)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"
