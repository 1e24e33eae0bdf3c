"""Worker processes for the read wing: the one way it starts them (:func:`worker_pool`), when
it may (:func:`can_fork`), and ``map`` over them in order (:func:`fork_map`).

A pool is used only when it pays (:data:`PARALLEL_MIN_BYTES`): the callers (``dpcore.read.ranks``)
size the files with :func:`dpcore.read.traces.files.json_bytes` first.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from dpcore.contract.procs import exit_with

#: Read ranks in worker processes only when it pays: a worker costs ~0.05 s to fork, a rank of
#: 250k events (~45 MB of JSON) ~0.35 s of CPU to read.
PARALLEL_MIN_BYTES = 64 << 20
T = TypeVar("T")


def can_fork() -> bool:
    """Worker processes only by fork, only on Linux, only from a single-threaded process.

    fork is cheap (workers inherit the imports); forking a multi-threaded process (the Streamlit
    app) can deadlock the child on a lock another thread held, and spawn/forkserver re-import the
    caller's ``__main__`` (a script without a main guard would re-run), so those read serially.
    """
    return sys.platform.startswith("linux") and threading.active_count() == 1


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` forked processes that end with their parent, even when it is killed
    with ``kill -9`` (:func:`dpcore.contract.procs.exit_with`: a pool's workers otherwise wait for
    work forever, re-parented to init): the one way dpcore's read wing starts worker processes
    (callers check :func:`can_fork`). The parent's pid is taken here, not in the worker, so a
    parent already gone when the worker starts is seen too."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=exit_with, initargs=(os.getpid(),))


def fork_map(fn: Callable[..., T], workers: int, *args: Iterable[Any]) -> Generator[T, None, None]:
    """``map(fn, *args)``, in order, in ``workers`` forked worker processes where
    :func:`can_fork` allows it (else, or with fewer than 2 workers, in this process). ``fn``
    must be a module-level function (workers receive it by name). An error or an early close
    drops the calls not yet started."""
    if workers < 2 or not can_fork():
        yield from map(fn, *args)
        return
    ex = None
    try:
        ex = worker_pool(workers)
        results = ex.map(fn, *args)  # submits every call: starts the workers
    except (OSError, NotImplementedError):  # no usable worker processes here (no sem_open, ...)
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)
        yield from map(fn, *args)
        return
    try:
        yield from results
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
