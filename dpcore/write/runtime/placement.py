"""Where a rank computes, and how it joins its job's process group: device placement, bound
before any process group exists.

Why a module of its own: every world (ranks dpcore spawns, torchrun's, a user's own loop) must
answer the same two questions the same way, in the same order: which GPU is this rank's, and
how is the group made on it. Order matters on NCCL: ``init_process_group`` and every
collective without an explicit device use ``torch.cuda.current_device()``, which is GPU 0 in
every process until someone calls ``set_device``. A rank that joins its group before binding
its GPU puts every rank of the node on GPU 0 ("Duplicate GPU detected", or a hang). So a world
calls :func:`bind` (``set_device``) first, then :func:`init_group`, which on NCCL also passes
``device_id=``: the group is then bound to that GPU (PyTorch's ``bound_device_id``), NCCL's
communicator is made eagerly on it, and no later collective of the group has to guess.

``device_id`` is a parameter of ``init_process_group`` since torch 2.3 (``torch>=2.4`` is the
floor); it is passed only where this torch's ``init_process_group`` names it, and only on NCCL
(on gloo a bound device makes torch try to split groups that gloo cannot split). On torch 2.7.0
a bound NCCL group defaults to NCCL's non-blocking mode, which hangs at random with the NCCL
2.26 it ships (pytorch/pytorch#153960; 2.7.1 turned that default off): there dpcore turns it
off too (``TORCH_NCCL_USE_COMM_NONBLOCKING=0``, unless the user set it), as 2.7.1 does.
"""
from __future__ import annotations

import datetime as _dt
import inspect
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpcore.contract.config import DEVICES, check_backend
from dpcore.contract.errors import UsageError, choices_error

#: Does this torch's ``init_process_group`` take ``device_id``? Read once from the real
#: function (a test may stand a fake in for it later; the answer is torch's, not the fake's).
TAKES_DEVICE_ID = "device_id" in inspect.signature(dist.init_process_group).parameters


def gpu_count() -> int:
    """GPUs this process can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class Placement:
    """Where a run's ranks compute and how they talk: one device type and one backend for
    every job of the run (sized for the most ranks any job puts on this host), so T(1) and
    T(N) measure the same machine. ``why`` says how ``auto`` decided, for the line printed
    before the first job."""

    device: str   #: "cpu" or "cuda"
    backend: str  #: "gloo" or "nccl"
    gpus: int     #: GPUs on this host
    why: str = ""

    def rank_device(self, local_rank: int) -> torch.device:
        """Local rank r computes on GPU r mod G (ranks share GPUs when there are more ranks),
        or on the CPU."""
        if self.device != "cuda":
            return torch.device("cpu")
        index = local_rank % max(1, self.gpus)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)

    def gpus_shared(self, ranks: int) -> bool:
        """Do ``ranks`` local ranks share GPUs (more ranks than GPUs, on cuda)?"""
        return self.device == "cuda" and ranks > self.gpus

    def job_fields(self, ranks: int) -> dict[str, Any]:
        """run.json's per-job ``backend``, ``device`` and ``gpus_shared``."""
        return {"backend": self.backend, "device": self.device,
                "gpus_shared": self.gpus_shared(ranks)}

    def describe(self, world_sizes: Sequence[int]) -> str:
        """One line: the device and backend each world size runs on, and why."""
        cells = []
        for ws in world_sizes:
            if self.device == "cuda":
                where = (f"{ws} rank(s) share {self.gpus} GPU(s), rank r on GPU r mod {self.gpus}"
                         if self.gpus_shared(ws) else f"{ws} rank(s), one GPU each")
            else:
                where = f"{ws} rank(s) on the CPU"
            cells.append(f"world size {ws}: {self.device}/{self.backend} ({where})")
        return "; ".join(cells) + (f". Why: {self.why}" if self.why else "")


def place(device: str | None, backend: str, ranks_on_host: int) -> Placement:
    """Resolve ``--device`` and ``--backend`` for a run whose jobs put at most
    ``ranks_on_host`` ranks on this host.

    ``device`` ``auto``: cuda where a GPU is present, else cpu. On cuda, backend ``auto`` is
    nccl when every local rank has its own GPU, else gloo (which carries CUDA tensors; NCCL
    refuses two ranks on one GPU), so ranks share the GPUs. ``device`` None: the device
    follows the backend (cuda for nccl, cpu for gloo), the library default for callers that
    name only a backend. Impossible pairs (cuda without a GPU, nccl on the CPU or with fewer
    GPUs than ranks) raise :class:`UsageError` naming the choices."""
    check_backend(backend)
    if device is not None and device not in DEVICES:
        raise choices_error("device", device, DEVICES)
    gpus = gpu_count()
    local = max(1, int(ranks_on_host))
    if device is None:
        backend = resolve_backend(backend, local, local)
        return Placement("cuda" if backend == "nccl" else "cpu", backend, gpus,
                         "the device follows the backend")
    if device == "auto":
        dev = "cuda" if gpus else "cpu"
        why = (f"--device auto found {gpus} GPU(s)" if gpus else "--device auto found no GPU")
    else:
        dev, why = device, f"--device {device}"
    if dev == "cuda" and not gpus:
        raise UsageError("--device cuda needs a GPU but torch sees none (torch.cuda.is_available() "
                         "is False); valid choices here: --device cpu or auto")
    if dev == "cpu":
        if backend == "nccl":
            raise UsageError("backend nccl needs GPUs but " + ("none were found; use --backend gloo"
                             if not gpus else "--device cpu was asked; use --device cuda or --backend gloo"))
        return Placement("cpu", "gloo", gpus, why)
    nccl_fits = gpus >= local and dist.is_nccl_available()
    if backend == "auto":
        if nccl_fits:
            return Placement("cuda", "nccl", gpus, f"{why}, one per rank: nccl")
        return Placement("cuda", "gloo", gpus,
                         f"{why} for up to {local} rank(s) on this host: the ranks share them over "
                         f"gloo (NCCL needs its own GPU per rank); --world-sizes within {gpus} "
                         "give nccl" if dist.is_nccl_available() else f"{why}; this torch has no nccl")
    if backend == "nccl":
        resolve_backend("nccl", local, local)  # fewer GPUs than ranks: the one-line refusal
    return Placement("cuda", backend, gpus, f"{why}, --backend {backend}")


def resolve_backend(backend: str, world_size: int, ranks_on_host: int | None = None) -> str:
    """Pick gloo/nccl for ranks whose device follows the backend. ``auto`` -> nccl when every
    local rank can have its own GPU."""
    check_backend(backend)
    local = world_size if ranks_on_host is None else ranks_on_host
    gpus = gpu_count()
    if backend == "auto":
        return "nccl" if gpus >= local and gpus > 0 and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and gpus < local:
        raise UsageError(f"backend nccl needs {local} GPU(s) on this host but {gpus} found; "
                         f"use --backend gloo or a world size of at most {gpus}"
                         if gpus else "backend nccl needs GPUs but none were found; use --backend gloo")
    return backend


def local_rank() -> int:
    """This process's rank on its host: torchrun's ``LOCAL_RANK`` (0 without one)."""
    return int(os.environ.get("LOCAL_RANK", 0))


def bind(placement: Placement, local: int) -> torch.device:
    """Make local rank ``local``'s device the current one (``set_device``) and return it. Call it
    before any process group of the process exists (module docstring)."""
    return placement.rank_device(local)


#: the torch whose bound NCCL groups default to the non-blocking mode that hangs (docstring)
NONBLOCKING_HANG_TORCH = (2, 7, 0)


def torch_release() -> tuple[int, ...]:
    """This torch's release numbers: ``2.7.0+cu126`` -> (2, 7, 0), ``2.7.1rc2`` -> (2, 7, 1)."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", torch.__version__)
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


def init_options(backend: str, device: torch.device) -> dict[str, Any]:
    """The extra keywords of ``init_process_group`` for a rank on ``device``: ``device_id`` on
    NCCL where this torch takes it, else none. On torch 2.7.0 it also opts out of NCCL's
    non-blocking mode for the group, unless the user chose (module docstring)."""
    if backend == "nccl" and device.type == "cuda" and TAKES_DEVICE_ID:
        if torch_release() == NONBLOCKING_HANG_TORCH:
            os.environ.setdefault("TORCH_NCCL_USE_COMM_NONBLOCKING", "0")
        return {"device_id": device}
    return {}


def init_group(backend: str, device: torch.device, timeout_s: float, **kwargs: Any) -> None:
    """``init_process_group`` for a rank whose device is already bound (:func:`bind`), with
    ``device_id`` on NCCL (:func:`init_options`). ``kwargs``: store, rank, world_size."""
    dist.init_process_group(backend, timeout=_dt.timedelta(seconds=timeout_s), **kwargs,
                            **init_options(backend, device))


def rank_cuda_device() -> torch.device:
    """The GPU of a rank in a process group someone else made (a user's loop): the one the
    default group was bound to (``init_process_group(device_id=...)``), else the current one if
    the user chose it (any GPU but 0, the default), else GPU ``LOCAL_RANK mod G``, the GPU
    torchrun's convention gives this rank (the current device, 0 on every rank of a user who
    never called ``set_device``, would put every rank's events on GPU 0)."""
    if dist.is_available() and dist.is_initialized():
        bound = getattr(dist.group.WORLD, "bound_device_id", None)
        if isinstance(bound, torch.device) and bound.type == "cuda" and bound.index is not None:
            return bound
    current = torch.cuda.current_device()
    if current != 0:
        return torch.device("cuda", current)
    return torch.device("cuda", local_rank() % max(1, gpu_count()))
