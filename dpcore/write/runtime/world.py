"""Where a run's ranks come from, and what the numbers were measured on.

Three worlds, one interface, so that a command's run life cycle is written once
(:mod:`dpcore.write.capture.run_lifecycle`) whatever made the ranks:

- :class:`LocalWorld`: ranks spawned by dpcore on this host, one launch per job; this process
  writes the run.
- :class:`TorchrunWorld`: the world ``torchrun`` made. Every rank runs every job; the results
  are gathered to rank 0, which writes. This is how ``profile`` and ``allreduce`` run across
  nodes.
- :class:`UserWorld`: a user's own loop (``dpcore.record``): the default process group the user
  initialised, or one process without one. dpcore neither starts nor ends it.

A world answers: does this process write (``writes``), which world sizes it can run
(``world_sizes``), how to share a small object from the writing rank (``broadcast``), the
environment for run.json, whether a job is oversubscribed, how to end (``finish``); the two
job-running worlds also ``run`` a function on every rank of a job.

Two rules every world keeps, whatever its backend. Bind first: a rank's GPU is made current
(``set_device``, from ``LOCAL_RANK``) before any process group exists, and an NCCL group is made
with ``device_id=`` (:mod:`dpcore.write.runtime.placement`). dpcore's own messages (the run
folder's name, the gathered rows, run-level barriers, the clock sync) go over a gloo side group
on CPU tensors, never the job's backend (:mod:`dpcore.write.runtime.control`).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dpcore.contract.config import DEFAULT_TIMEOUT_S
from dpcore.contract.errors import JobFailed
from dpcore.contract.limits import in_torchrun
from dpcore.write.runtime import control, cpu_claims
from dpcore.write.runtime.context import DistContext
from dpcore.write.runtime.launch import (
    MONITOR_PERIOD_S,
    Monitor,
    flight_recorder_on,
    launch,
    settle_collectives,
    torchrun_store,
)
from dpcore.write.runtime.placement import (
    Placement,
    bind,
    gpu_count,
    init_group,
    local_rank,
    place,
    rank_cuda_device,
)
from dpcore.write.runtime.resources import (
    is_oversubscribed,
    physical_cores,
    pinning,
    rank_cpus,
    threads_per_rank,
)


def device_names(device: str, gpus: int | None = None) -> list[str]:
    """What ``device`` is, by name: every GPU's (torch.cuda) for cuda, the processor for cpu."""
    if device == "cuda":
        count = gpu_count() if gpus is None else gpus
        return [torch.cuda.get_device_name(i) for i in range(count)]
    return [platform.processor() or platform.machine() or "cpu"]


def environment(backend: str, world_sizes: list[int], ranks_per_host: int | None = None,
                threads: int | None = None, pin: bool = False, device: str | None = None) -> dict:
    """What the numbers were measured on. ``oversubscribed`` when any job has more ranks on
    this host than physical cores (its timings then mean little). ``device`` None: the one the
    backend implies (cuda for nccl)."""
    gpus = gpu_count()
    local = ranks_per_host or max(world_sizes or [1])
    device = device or ("cuda" if backend == "nccl" else "cpu")
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "backend": backend,
        "device": device,
        "devices": device_names(device, gpus),
        "cpu_cores": physical_cores(),
        "logical_cpus": os.cpu_count(),
        # one value for every job (cores // largest world size unless --threads-per-rank)
        "threads_per_rank": threads or threads_per_rank(local),
        "pinning": pinning(local, threads or threads_per_rank(local)) if pin else "none",
        "oversubscribed": is_oversubscribed(local),
        "gpus": gpus,
    }


def store_client(addr: tuple[str, int] | None) -> Any:
    """A client of the TCP store at ``addr`` (None without one, or when it cannot be reached:
    live rows are an extra, never a reason for a job to fail)."""
    if addr is None:
        return None
    try:
        return dist.TCPStore(addr[0], addr[1], is_master=False, wait_for_workers=False,
                             timeout=_dt.timedelta(seconds=30))
    except Exception:  # noqa: BLE001
        return None


def job_store(ctx: DistContext) -> Any:
    """The store a user's job shares (``dpcore.record``): its default process group's, or an
    in-process one for a world of one (rank 0 is then both sender and collector)."""
    if ctx.world_size <= 1:
        return dist.HashStore()
    try:
        from torch.distributed.distributed_c10d import _get_default_store
        return _get_default_store()
    except Exception:  # noqa: BLE001 - a group without a store: no live rows
        return None


class MonitorThread:
    """Polls a job's monitor from a thread of rank 0 while rank 0 trains (torchrun and
    ``dpcore.record``, where no launcher loop exists): live rows only."""

    def __init__(self, monitor: Monitor, store: Any) -> None:
        self.monitor = monitor
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_ns = 0  #: CPU time the polling thread used (ns), for the benchmark
        if store is None:
            return
        monitor.attach(store)
        self._thread = threading.Thread(target=self._run, name="dpcore-live", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(MONITOR_PERIOD_S):
            t0 = time.thread_time_ns()
            self.monitor.poll()
            self.cpu_ns += time.thread_time_ns() - t0

    def stop(self) -> None:
        """The job ended on rank 0: stop polling, take the last rows."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self.monitor.close()


def _resources(threads: int | None, pin: bool, ranks_on_host: int) -> tuple[int, bool]:
    """Equal resources for every job of a run: the same threads per rank (cores // the most
    ranks any job puts on this host, unless given), and every rank pinned to its own CPUs
    when all of them fit, so T(1) and T(N) differ only by what data parallelism adds."""
    threads = threads or threads_per_rank(ranks_on_host)
    return threads, pin and pinning(ranks_on_host, threads) == "per-rank"


class LocalWorld:
    """Ranks spawned by dpcore on this host, one launch per job; this process writes."""

    writes = True
    #: the ranks are this process's children: a failed job's ranks were killed mid-way
    spawns = True

    def __init__(self, backend: str, world_sizes: Sequence[int], *, ranks_on_host: int,
                 timeout_s: float = DEFAULT_TIMEOUT_S, threads: int | None = None,
                 pin: bool = True, preload: Sequence[str] = (), device: str | None = None) -> None:
        #: one device and backend for every job of the run, sized for its largest job
        self.placement: Placement = place(device, backend, ranks_on_host)
        self.backend, self.device = self.placement.backend, self.placement.device
        self.world_sizes = tuple(world_sizes)
        self.timeout_s, self.preload = timeout_s, tuple(preload)
        self.threads, self.pin = _resources(threads, pin, ranks_on_host)
        # CPUs another dpcore run has pinned its ranks to, that ours are pinned to as well:
        # both runs then measure each other (cpu_claims)
        cpus = ({c for r in range(ranks_on_host) for c in rank_cpus(r, ranks_on_host, self.threads)}
                if self.pin else set())
        self.shared = cpu_claims.shared_with(cpus) if cpus else {}
        self._claim = cpu_claims.claim(cpus) if cpus else None
        cpu_claims.tell(self.shared)  # the runs already there learn of this one
        self._cpus = cpus
        self._job_shared: dict[int, list[int]] = {}

    def environment(self) -> dict:
        env = environment(self.backend, list(self.world_sizes), threads=self.threads, pin=self.pin,
                          device=self.device)
        if self.shared:
            env["cpus_shared_with"] = {str(pid): cpus for pid, cpus in self.shared.items()}
            env["oversubscribed"] = True
        return env

    def oversubscribed(self, processes: int) -> bool:
        """More ranks than cores, or ranks on CPUs another dpcore run's ranks are pinned to."""
        return processes > physical_cores() or bool(self.shared)

    def broadcast(self, box: list[Any]) -> None:
        """Nothing to share: this process is the only one that plans and writes."""

    def run(self, fn: Callable[..., Any], processes: int, args: tuple,
            on_progress: Callable[[dict], None] | None = None,
            monitor: Monitor | None = None) -> list[Any] | None:
        """Every rank's result; JobFailed when a rank raised, died, timed out or hung
        (``monitor``'s watchdog). Which other runs shared this job's CPUs is then
        :meth:`shared_during_job`."""
        before = cpu_claims.shared_with(self._cpus) if self._cpus else {}
        try:
            return launch(fn, processes, backend=self.backend, args=args, timeout_s=self.timeout_s,
                          on_progress=on_progress, threads=self.threads, pin=self.pin,
                          preload=self.preload, monitor=monitor, device=self.device)
        finally:
            # a run there at the job's start or end, or one that started (and maybe ended)
            # within it and left a note, measured its CPUs as this job did
            after = {**cpu_claims.shared_with(self._cpus), **cpu_claims.told()} if self._cpus else {}
            self._job_shared = {**before, **after}
            self.shared.update(self._job_shared)

    def shared_during_job(self) -> dict[int, list[int]]:
        """{pid: CPUs} of the other dpcore runs pinned to the last job's CPUs while it ran."""
        return dict(self._job_shared)

    def finish(self, status: str) -> None:
        """launch() reaped every rank of every job: only the CPU claim is given back (also at
        exit, when the run ended by an error and finish was not called)."""
        cpu_claims.release(self._claim)


class TorchrunWorld:
    """The world torchrun made: every rank runs every job, results gathered to rank 0, which
    writes. Its one world size is torchrun's."""

    spawns = False

    def __init__(self, backend: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 threads: int | None = None, pin: bool = True, device: str | None = None) -> None:
        self.ws, self.rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        self.local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", self.ws))
        self.placement: Placement = place(device, backend, self.local_ws)
        self.backend, self.device = self.placement.backend, self.placement.device
        self.writes, self.world_sizes, self.timeout_s = self.rank == 0, (self.ws,), timeout_s
        self.threads, self.pin = _resources(threads, pin, self.local_ws)
        #: this rank's device, current before the group exists (NCCL makes its communicator there)
        self.rank_device = bind(self.placement, local_rank())
        if not dist.is_initialized():
            flight_recorder_on()
            init_group(self.backend, self.rank_device, timeout_s)
        # made now, at the same point on every rank; waits as long as a job may run (the gather
        # after a job waits for its slowest rank)
        self.control = control.control_group(timeout_s)

    def environment(self) -> dict:
        return {**environment(self.backend, [self.ws], ranks_per_host=self.local_ws,
                              threads=self.threads, pin=self.pin, device=self.device),
                "torchrun": True, "nnodes": self.ws // max(self.local_ws, 1)}

    def oversubscribed(self, processes: int) -> bool:
        return self.local_ws > physical_cores()

    def broadcast(self, box: list[Any]) -> None:
        """Rank 0's ``box`` contents reach every rank (in place), over the control plane."""
        control.broadcast(box)

    def run(self, fn: Callable[..., Any], processes: int, args: tuple,
            on_progress: Callable[[dict], None] | None = None,
            monitor: Monitor | None = None) -> list[Any] | None:
        """Run ``fn`` on every rank of torchrun's world; rank 0 gets every rank's result (or
        JobFailed naming the first rank that raised), the other ranks None. ``monitor`` (rank
        0): polled by a thread for the live rows; torchrun's ranks are not this process's to
        end, so here it does not watch for hangs (``--timeout`` does)."""
        poller = (MonitorThread(monitor, store_client(torchrun_store())) if self.writes and monitor
                  else None)
        try:
            mine: Any = launch(fn, self.ws, backend=self.backend, args=args,
                               timeout_s=self.timeout_s, on_progress=on_progress,
                               threads=self.threads, pin=self.pin, device=self.device)[self.rank]
        except Exception as exc:  # noqa: BLE001 - reported through rank 0
            mine = {"error": f"rank {self.rank}: {type(exc).__name__}: {exc}\n"
                             f"{traceback.format_exc(limit=6)}"}
        gathered = control.gather(mine)  # the control plane: CPU objects, never the job's GPU
        if poller is not None:  # every rank flushed its live rows before the gather
            poller.stop()
        if not self.writes or gathered is None:
            return None
        failed = [(i, g["error"]) for i, g in enumerate(gathered)
                  if isinstance(g, dict) and "error" in g]
        if failed:
            raise JobFailed(*failed[0])
        return gathered

    def shared_during_job(self) -> dict[int, list[int]]:
        """torchrun placed the ranks: dpcore claims no CPUs for them."""
        return {}

    def finish(self, status: str) -> None:
        """A clean goodbye, except after Ctrl-C: the other ranks are stopping too. On gloo the
        job's own barrier comes first: it returns after every earlier collective of the job's
        group ran its callbacks, which torch 2.4's gloo teardown would otherwise deadlock on
        (``launch._worker``); then every rank meets on the control plane."""
        if status != "interrupted":
            settle_collectives()
            control.barrier()
            dist.destroy_process_group()


def open_world(backend: str, world_sizes: Sequence[int], *, ranks_on_host: int | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S, threads: int | None = None,
               pin: bool = True, preload: Sequence[str] = (),
               device: str | None = None) -> LocalWorld | TorchrunWorld:
    """The world this process runs jobs in: torchrun's when torchrun started it, else ranks
    spawned here for each job (``ranks_on_host``: the most any job puts on this host, default
    the largest world size). ``preload``: modules the spawned ranks run (the command's).
    ``device``: ``--device`` (:func:`~dpcore.write.runtime.placement.place`)."""
    if in_torchrun():
        return TorchrunWorld(backend, timeout_s=timeout_s, threads=threads, pin=pin, device=device)
    return LocalWorld(backend, world_sizes, ranks_on_host=ranks_on_host or max(world_sizes),
                      timeout_s=timeout_s, threads=threads, pin=pin, preload=preload, device=device)


def world_context() -> DistContext:
    """This process's place in the default process group (a world of one without a group).
    On NCCL its device is the rank's GPU (:func:`~dpcore.write.runtime.placement.
    rank_cuda_device`: the group's bound device, the user's current one, else LOCAL_RANK's),
    never GPU 0 for every rank because the user's loop did not call ``set_device``."""
    if dist.is_available() and dist.is_initialized():
        backend = str(dist.get_backend())
        dev = rank_cuda_device() if backend == "nccl" else torch.device("cpu")
        return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                           local_rank=local_rank(), backend=backend,
                           device=dev, threads=torch.get_num_threads())
    dev = rank_cuda_device() if torch.cuda.is_available() else torch.device("cpu")
    return DistContext(rank=0, world_size=1, local_rank=0, backend="none", device=dev,
                       threads=torch.get_num_threads())


class UserWorld:
    """The world of a user's own loop: whatever process group the user made (or none). Rank 0
    writes; dpcore runs no job in it and leaves the group as it found it.

    What run.json says it ran on is what it really ran on: the default group's backend (also
    at world size 1; ``none`` without a group) and ``device``, the model's device when the
    caller knows it (a gloo group, or no group, may train on a GPU), else the group's."""

    spawns = False

    def __init__(self, device: torch.device | None = None) -> None:
        self.ctx = world_context()
        if device is not None and device.type == "cuda" and device.index is not None:
            self.ctx.device = device  # the model's GPU is where the rank's work and events are
        self.writes = self.ctx.rank == 0
        self.world_sizes = (self.ctx.world_size,)
        self.local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", self.ctx.world_size))
        #: "cuda" or "cpu": where the job computes
        self.device = (device or self.ctx.device).type

    def job_fields(self) -> dict[str, Any]:
        """run.json's per-job ``backend``, ``device`` and ``gpus_shared`` (more local ranks
        than GPUs on cuda)."""
        return {"backend": self.ctx.backend, "device": self.device,
                "gpus_shared": self.device == "cuda" and self.local_ws > gpu_count()}

    def environment(self) -> dict:
        ctx = self.ctx
        return environment(ctx.backend, [ctx.world_size], ranks_per_host=self.local_ws,
                           threads=ctx.threads, device=self.device)

    def oversubscribed(self, processes: int) -> bool:
        return is_oversubscribed(self.local_ws)

    def broadcast(self, box: list[Any]) -> None:
        """Rank 0's ``box`` reaches every rank, over the control plane (not the user's group)."""
        control.broadcast(box)

    def shared_during_job(self) -> dict[int, list[int]]:
        """The user's processes: dpcore claims no CPUs for them."""
        return {}

    def finish(self, status: str) -> None:
        """The user's process group is the user's to end."""
