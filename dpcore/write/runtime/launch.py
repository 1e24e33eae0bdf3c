"""One launcher for every multi-process job: spawned ranks on this host, or a torchrun world.

Why a parent-owned ``TCPStore`` on port 0: the OS picks a free port and the parent holds it
for the job's lifetime, so two dpcore runs at once can never race for the same rendezvous
port (the classic "pick a free port, close it, hope" has a window where another run grabs it).

Why the store listens on loopback only: a c10d store has no authentication, and
``TCPStore(..., is_master=True)`` listens on every interface whatever host name it is given;
anyone on the network could read, write or stall a job's rendezvous. Local ranks reach it at
127.0.0.1, so the launcher binds the listening socket there itself and hands it to the store
(``master_listen_fd``). Under torchrun the rendezvous is torchrun's (its ``--master-addr``).

Why ``forkserver`` with torch preloaded: each job needs fresh processes (a failed collective
can poison a process group), and re-importing torch per rank costs seconds on a small
machine. Forking from a server that already imported torch makes a new rank cheap, while
avoiding ``fork`` of a parent that may hold threads or CUDA state. Which of dpcore's own
modules the server preloads too is the caller's to say (``launch(..., preload=...)``): the
command knows what its ranks run; this generic launcher names nothing above it.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import multiprocessing as mp
import os
import queue as _queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

from dpcore.contract.config import check_timeout
from dpcore.contract.errors import JobFailed, UsageError
from dpcore.contract.limits import in_torchrun
from dpcore.contract.procs import LAUNCHER_ENV, exit_with
from dpcore.write.runtime.context import DistContext

# Device placement lives in its own module; these names stay importable from here.
from dpcore.write.runtime.placement import (  # noqa: F401 - re-exported
    Placement,
    bind,
    gpu_count,
    init_group,
    place,
    resolve_backend,
)
from dpcore.write.runtime.resources import pin_rank, threads_per_rank

#: What the forkserver always imports before forking a rank (the caller adds its own modules).
BASE_PRELOAD = ("torch", "torch.distributed", "torch.profiler", "dpcore.write.runtime.launch",
                "dpcore.write.runtime.forkserver")
#: After a rank reports an error, how long to look for a rank that died meanwhile: a rank killed
#: by a signal sends nothing, and its peers' "Connection closed by peer" usually arrives first.
BLAME_GRACE_S = 1.0
#: PyTorch's flight recorder, on in every rank (entries kept per process group; gloo records
#: them in torch 2.13, without durations): what the hang watchdog and ``hang`` read.
FR_BUFFER_SIZE = "2000"
#: how often the launcher polls a job's monitor (live rows, the hang watchdog)
MONITOR_PERIOD_S = 0.25


class Monitor(Protocol):
    """What the launcher drives while a job runs (:class:`dpcore.write.capture.job_monitor.
    JobMonitor`): given the job's store, told of rank 0's steps, polled, closed."""

    def attach(self, store: Any) -> None: ...

    def stepped(self, event: dict) -> None: ...

    def poll(self) -> JobFailed | None: ...

    def close(self) -> None: ...


def flight_recorder_on() -> None:
    """Turn PyTorch's flight recorder on for process groups made after this (a user's own
    TORCH_FR_BUFFER_SIZE wins)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER_SIZE)


def _worker(rank: int, world_size: int, placement: Placement, port: int, threads: int,
            timeout_s: float, fn: Callable[..., Any], args: tuple, results: Any, launcher_pid: int,
            pin: bool) -> None:
    """Body of a spawned rank: pin, join the group, run ``fn``, report result or error.

    The rank ends the moment its launcher does (even by ``kill -9``): its parent is the
    forkserver, not the launcher, so it watches the launcher itself (:func:`exit_with`)."""
    exit_with(launcher_pid)
    try:
        cpus = pin_rank(rank, world_size, threads) if pin else ()
        torch.set_num_threads(threads)
        flight_recorder_on()
        gloo_on_loopback()  # the job's gloo, or the control plane's beside NCCL
        store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False,
                              timeout=_dt.timedelta(seconds=timeout_s))
        device = bind(placement, rank)  # before the group: NCCL binds the current GPU
        init_group(placement.backend, device, timeout_s, store=store, rank=rank,
                   world_size=world_size)
        ctx = DistContext(rank, world_size, rank, placement.backend, device, threads,
                          cpus=cpus, progress=lambda ev: results.put((rank, "progress", ev)),
                          store_addr=("127.0.0.1", port))
        value = fn(ctx, *args)
        results.put((rank, "ok", value))
        # Before the group is destroyed: on torch 2.4 ~ProcessGroupGloo keeps the GIL while it
        # joins gloo's threads, and one of them may still wait for the GIL to run a future's
        # Python callback (the comm log's end stamp): a deadlock. After the barrier every
        # earlier collective's callbacks have run. Only here, where this rank's job ended well:
        # after an error the others may never come to it.
        try:
            settle_collectives()
        except Exception:  # noqa: BLE001 - a peer that failed left the group: its error is the job's
            pass
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        tb = traceback.format_exc(limit=8)
        results.put((rank, "error", f"{type(exc).__name__}: {exc}\n{tb}"))
        # put() hands the report to a feeder thread; flushed here, it is in the pipe before the
        # group is destroyed below, so before any peer can fail on this rank's leaving and
        # report that echo first (which would be blamed on the peer)
        results.close()
        results.join_thread()
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def settle_collectives() -> None:
    """Wait until every collective this process issued on the default gloo group has ended its
    profiler range; nothing without a process group or on another backend. Every rank must call
    it, at the same point, before the profiler stops.

    Why: over gloo, a collective's future completes (what DDP and the variants wait on) before
    gloo's worker thread closes the collective's profiler range (``Work::finish`` runs the
    range's end after ``markCompleted``). Stopping the profiler in that window frees its event
    lists while that thread still writes into one of them: a use-after-free in PyTorch that
    later aborts the rank (docs/your-code.md, "The SIGABRT over gloo"). gloo's barrier is waited on through
    ``Work::wait``, which returns only after ``Work::finish``, and it runs after every earlier
    collective of the group has finished, ranges included (and so their futures' Python
    callbacks, which ``markCompleted`` runs before ``Work::finish``)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.barrier()


def loopback_interface() -> str | None:
    """The name of this host's loopback interface (``lo`` on Linux, ``lo0`` on macOS), None
    where none is listed."""
    try:
        names = [name for _i, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def gloo_on_loopback() -> None:
    """Make this rank's gloo pairs use the loopback interface (``GLOO_SOCKET_IFNAME``) unless
    the user named an interface.

    Why: without it gloo binds its pair sockets to the address the host name resolves to,
    which on many machines is a LAN address: a single-machine job then listens on the
    network (gloo's pairs have no authentication) and breaks when that address changes. Every
    rank spawned here is on this host, so loopback always reaches the peers. Under torchrun
    ranks span hosts: the interface is the user's to choose, nothing is set there."""
    name = loopback_interface()
    if name is not None and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = name


_MP_CONTEXT: Any = None
_PRELOAD: list[str] = []
#: held while the context, the preload list and the forkserver's start are set up: launches
#: from several threads (the dashboard, a thread pool) share them
_CONTEXT_LOCK = threading.Lock()


def _mp_context(preload: Sequence[str] = ()) -> Any:
    """The start method's context (forkserver where available), created once per process.

    ``preload``: dpcore modules the ranks of this launch import (the caller's, e.g. a command's
    per-rank body), added to :data:`BASE_PRELOAD`. The forkserver reads the list when it starts,
    at the first launch of the process; modules named later are imported by each rank instead
    (correct, only slower). Thread-safe: one thread at a time sets it up."""
    global _MP_CONTEXT  # process-wide cache of the start method; holds no job state
    with _CONTEXT_LOCK:
        if _MP_CONTEXT is None:
            method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
            _MP_CONTEXT = mp.get_context(method)
        new = [m for m in (*BASE_PRELOAD, *preload) if m not in _PRELOAD]
        if _MP_CONTEXT.get_start_method() == "forkserver":
            if new:
                _PRELOAD.extend(new)
                _MP_CONTEXT.set_forkserver_preload(list(_PRELOAD))
            _start_forkserver()
        return _MP_CONTEXT


def _start_forkserver() -> None:
    """Start the forkserver now (a no-op when it runs), told that this process is its launcher
    (:func:`dpcore.contract.procs.bind_forkserver_to_launcher`, which
    :mod:`dpcore.write.runtime.forkserver` runs when the forkserver preloads it). The variable
    is set only while the server starts, so no later child of this process inherits it; call
    it under ``_CONTEXT_LOCK``: two threads saving and restoring the variable around each other
    left it set for good (the second saved the first's value as "the old one"), and every
    later ``python -m dpcore`` this process started ended with status 0."""
    from multiprocessing import forkserver
    old = os.environ.get(LAUNCHER_ENV)
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    try:
        forkserver.ensure_running()
    finally:
        if old is None:
            os.environ.pop(LAUNCHER_ENV, None)
        else:
            os.environ[LAUNCHER_ENV] = old


def torchrun_store() -> tuple[str, int] | None:
    """(host, port) of torchrun's store (MASTER_ADDR/MASTER_PORT), where every rank reaches."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return None


def _torchrun_launch(fn: Callable[..., Any], world_size: int, backend: str, timeout_s: float,
                     args: tuple, on_progress: Callable[[dict], None] | None,
                     threads: int | None = None, pin: bool = False,
                     device: str | None = None) -> list[Any]:
    env_ws = int(os.environ["WORLD_SIZE"])
    if world_size not in (env_ws, 0):
        raise UsageError(f"world size {world_size} requested but torchrun started {env_ws} ranks; "
                         f"under torchrun the world size is torchrun's ({env_ws})")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", env_ws))
    placement = place(device, backend, local_ws)
    threads = threads or threads_per_rank(local_ws)
    cpus = pin_rank(local_rank, local_ws, threads) if pin else ()
    torch.set_num_threads(threads)
    rank_device = bind(placement, local_rank)  # before the group (TorchrunWorld made it, bound)
    if not dist.is_initialized():
        flight_recorder_on()
        init_group(placement.backend, rank_device, timeout_s)
    ctx = DistContext(rank, env_ws, local_rank, placement.backend, rank_device,
                      threads, cpus=cpus, progress=on_progress, store_addr=torchrun_store())
    out: list[Any] = [None] * env_ws
    out[rank] = fn(ctx, *args)
    return out


def launch(fn: Callable[..., Any], world_size: int, *, backend: str = "auto", args: tuple = (),
           timeout_s: float = 300.0, on_progress: Callable[[dict], None] | None = None,
           threads: int | None = None, pin: bool = False, preload: Sequence[str] = (),
           monitor: Monitor | None = None, device: str | None = None) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` ranks and return their results by rank.

    Spawns the ranks on this host, or, under ``torchrun``, runs ``fn`` in the world torchrun
    made (then only this rank's entry of the result is filled). Progress events that rank 0
    sends with ``ctx.report(...)`` reach ``on_progress`` in the launching process. A rank that raises ends the
    job at once: the others are terminated and :class:`JobFailed` names the rank and its
    exception. A job running past ``timeout_s`` is killed the same way (``rank=-1``).

    ``threads``: torch threads per rank (default cores // ranks on this host; ``profile``
    passes one value for every job of a run, so T(1) and T(N) get the same resources).
    ``pin``: pin each rank to its own CPUs (:func:`rank_cpus`) where they fit.
    ``preload``: modules the forkserver imports once for every rank (:func:`_mp_context`);
    the caller names what its ``fn`` needs, so this launcher names no module above it.
    ``monitor``: polled every :data:`MONITOR_PERIOD_S` with the job's store (spawned ranks
    only): live rows, and the hang watchdog, whose :class:`JobFailed` ends the job like a
    rank's error (every rank is then reaped).
    ``device``: ``--device`` (auto, cpu, cuda; :func:`place`), or None for the device that
    follows the backend (cuda for nccl, cpu for gloo).
    """
    if world_size < 1:
        raise UsageError(f"world size must be >= 1, got {world_size}")
    check_timeout(timeout_s)
    if in_torchrun():
        return _torchrun_launch(fn, world_size, backend, timeout_s, args, on_progress, threads, pin,
                                device)
    placement = place(device, backend, world_size)
    threads = threads or threads_per_rank(world_size)
    ctx = _mp_context(preload)
    store = loopback_store(world_size + 1, timeout_s)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, daemon=True, name=f"dpcore-rank{r}",
                         args=(r, world_size, placement, store.port, threads, timeout_s, fn, args,
                               results, os.getpid(), pin))
             for r in range(world_size)]
    out: list[Any] = [None] * world_size
    got: set[int] = set()
    started: list[Any] = []
    ok = False
    if monitor is not None:
        monitor.attach(store)
    next_poll = 0.0
    # The job's clock starts before its first rank: a rank's own collective timeout (the same
    # timeout_s, counted from a collective that starts after the rank does) then always ends
    # after this deadline, so a hang is reported as the launcher's timeout, never as the echo
    # of it in a rank, however long a loaded machine delays this thread after the starts.
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            with signals_deferred():  # a rank is either started and tracked, or not started
                p.start()
                started.append(p)
        while len(got) < world_size:
            if monitor is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + MONITOR_PERIOD_S
                hung = monitor.poll()
                if hung is not None:
                    raise hung
            try:
                rank, status, value = results.get(timeout=0.1)
            except _queue.Empty:
                for r, p in enumerate(procs):
                    if r not in got and p.exitcode is not None:
                        # a rank may have queued its result just before exiting: drain first
                        try:
                            rank, status, value = results.get(timeout=0.5)
                            break
                        except _queue.Empty:
                            raise JobFailed(r, _death_text(p.exitcode)) from None
                else:
                    if time.monotonic() > deadline:
                        raise JobFailed(-1, f"timed out after {timeout_s:.0f} s (a rank hung; raise --timeout "
                                            "if the job is just slow)")
                    continue
            if status == "progress":
                if monitor is not None:
                    monitor.stepped(value)
                if on_progress is not None:
                    on_progress(value)
                continue
            if status == "error":
                if time.monotonic() > deadline:  # past the deadline a rank's error is the hang's echo
                    # (gloo's own timeout in the rank that waited), not its cause: report the hang
                    raise JobFailed(-1, f"timed out after {timeout_s:.0f} s (a rank hung; raise --timeout "
                                        f"if the job is just slow); rank {rank} then failed: "
                                        f"{str(value).strip().splitlines()[-1][:200] if str(value).strip() else '?'}")
                raise _blame(rank, value, procs, got)
            out[rank] = value
            got.add(rank)
        ok = True
        if monitor is not None:
            monitor.close()
        return out
    finally:
        with signals_deferred():  # a second Ctrl-C must not cut the teardown short
            _reap(started, grace_s=5.0 if ok else 0.0)
        del store


def loopback_store(clients: int, timeout_s: float) -> dist.TCPStore:
    """A master TCPStore for ``clients`` that only this host can reach: its listening socket
    is bound to 127.0.0.1 on a free port (the OS picks it; the store holds it for the job)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(max(128, clients))
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()  # the store owns the descriptor from here on, and closes it
    kwargs: dict[str, Any] = {"timeout": _dt.timedelta(seconds=timeout_s), "wait_for_workers": False,
                              "master_listen_fd": fd}
    if not _LIBUV_TAKES_LISTEN_FD:
        kwargs["use_libuv"] = False
    try:
        return dist.TCPStore("127.0.0.1", port, clients, is_master=True, **kwargs)
    except NotImplementedError:
        if "use_libuv" in kwargs:
            raise
    # the default libuv server of an older torch cannot start on a given socket (it says so
    # before touching the descriptor); its legacy server can, so it serves this process's
    # stores from now on (c10d logs the refusal once, on the first store only)
    _remember_legacy_store()
    return dist.TCPStore("127.0.0.1", port, clients, is_master=True, use_libuv=False, **kwargs)


#: Does this torch's default (libuv) store server accept ``master_listen_fd``? Learned from the
#: first loopback store: torch 2.4's refuses it with NotImplementedError, later ones accept it.
_LIBUV_TAKES_LISTEN_FD = True


def _remember_legacy_store() -> None:
    """The libuv server refused a listening socket: use the legacy server from now on."""
    global _LIBUV_TAKES_LISTEN_FD
    _LIBUV_TAKES_LISTEN_FD = False


def _death_text(exitcode: int) -> str:
    """How a rank process ended without a result, as torchrun says it: the signal's name for
    a negative exit code (``-9`` -> SIGKILL), else the exit code."""
    if exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
        how += f" (exit code {exitcode})"
    else:
        how = f"exited with code {exitcode}"
    return (f"process {how} without a result (killed, out of memory, or crashed in native "
            "code)")


def _blame(rank: int, error: str, procs: list[Any], done: set[int]) -> JobFailed:
    """The JobFailed for a job in which ``rank`` reported ``error``.

    Why wait before blaming: when a rank dies (``kill -9``, the OOM killer, a segfault) it
    reports nothing, and its peers fail a moment later with "Connection closed by peer", which
    names the wrong rank. So for up to :data:`BLAME_GRACE_S` we look for a rank process that
    ended abnormally (non-zero exit code: a rank that raised reports it and exits with 0);
    if one did, it is the cause, and the peer's error is kept as context."""
    end = time.monotonic() + BLAME_GRACE_S
    while True:
        codes = {r: p.exitcode for r, p in enumerate(procs) if r != rank and r not in done}
        dead = [r for r, c in codes.items() if c not in (None, 0)]
        if dead:
            first = error.strip().splitlines()[0] if error.strip() else ""
            return JobFailed(dead[0], f"{_death_text(codes[dead[0]])}; rank {rank} then "
                                      f"failed: {first}")
        if all(c is not None for c in codes.values()) or time.monotonic() >= end:
            return JobFailed(rank, error)
        time.sleep(0.05)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the duration of the block, then deliver them as they came.

    Why: Ctrl-C or the dashboard's Stop (SIGTERM) can land at any bytecode. Inside
    ``Process.start`` it could leave a rank running that the launcher does not know it started,
    and inside the teardown it would cut the reaping short; both would leave orphans. The
    blocks are short (one start, one teardown), and the signal is re-raised right after, so
    the run still ends ``interrupted``. Python runs signal handlers in the main thread only,
    so elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not None:  # None: installed outside Python; cannot be restored
                signal.signal(s, handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)


def _reap(procs: list[Any], grace_s: float) -> None:
    """Stop every rank: join for ``grace_s``, then terminate, then kill. No orphans survive.

    Only started processes can be joined; one that never started (the launch was interrupted
    before its turn) is skipped rather than tripping multiprocessing's assertion."""
    procs = [p for p in procs if p.pid is not None]
    end = time.monotonic() + grace_s
    for p in procs:
        if p.is_alive():
            p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=1.0)
