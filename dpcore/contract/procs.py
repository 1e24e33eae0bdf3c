"""Helper processes that end with the process they serve: no process outlives a command.

Why this is shared by both wings: the write wing's ranks and forkserver, and the read wing's
trace-parsing workers, are all children that must not outlive the command that started them,
whether it returned or was killed with ``kill -9`` (which runs no cleanup in the parent).

Why a pidfd and not ``PR_SET_PDEATHSIG``: the parent-death signal fires when the *thread* that
forked the child exits, not the process; a forkserver started by a short-lived thread (two
launches from a thread pool) would be killed under a running job. A pidfd becomes readable
when the watched *process* is gone, so a thread blocked on it wakes at once, with no polling
period. Where pidfds are missing (Linux < 5.3, other systems) the thread polls the pid.
"""
from __future__ import annotations

import atexit
import os
import select
import sys
import threading
import time

#: how often the fallback (no pidfd) checks that the watched process still exists
POLL_S = 0.2
#: set by a launcher before its multiprocessing forkserver starts: the launcher's pid, so that
#: the forkserver (and only it: its parent has this pid) binds its life to the launcher's
LAUNCHER_ENV = "DPCORE_LAUNCHER_PID"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # the pid was reused by another user's process: ours is gone
        return True
    return False


def _wait_for_exit(pid: int) -> None:
    """Block until process ``pid`` no longer exists."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or the process is already gone
        while not _gone(pid):
            time.sleep(POLL_S)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def exit_with(pid: int, code: int = 3) -> None:
    """End this process (``os._exit(code)``: no cleanup, which may wait on the dead peer) as soon
    as process ``pid`` ends. A daemon thread waits for it; call once, early, in the child."""
    def watch() -> None:
        _wait_for_exit(pid)
        os._exit(code)

    if _gone(pid):  # the parent died before this child got here
        os._exit(code)
    threading.Thread(target=watch, name="dpcore-exit-with-parent", daemon=True).start()


def bind_forkserver_to_launcher() -> None:
    """In a multiprocessing forkserver started by a dpcore launcher: end it the moment the
    launcher ends (even by ``kill -9``), and make its own exit immediate.

    Why the immediate exit: a forkserver that has imported torch spends up to seconds in the
    interpreter's teardown after its launcher closes the "alive" pipe; a launcher that waits
    for it (:func:`stop_helpers`) would wait that long, and one that does not leaves it alive
    after the command returned. It has nothing to flush: each rank is its own process.
    Call it only in that forkserver (:mod:`dpcore.write.runtime.forkserver`, which only the
    forkserver imports, says why); it does nothing where the parent is not the launcher named in
    the environment."""
    if os.environ.get(LAUNCHER_ENV) != str(os.getppid()):
        return
    atexit.register(os._exit, 0)  # registered after torch's handlers, so it runs first
    exit_with(os.getppid(), code=0)


def stop_helpers() -> None:
    """Stop this process's multiprocessing forkserver and resource tracker and wait for them,
    so that none is left when a command returns (each otherwise ends on its own only after the
    command's process has exited). Only those already started; nothing is imported for it.

    Uses the ``_stop`` methods the standard library's own tests use: Python has no public way
    to stop either, and both are restarted on demand if a later launch needs them."""
    for module, attr in (("multiprocessing.forkserver", "_forkserver"),
                         ("multiprocessing.resource_tracker", "_resource_tracker")):
        helper = getattr(sys.modules.get(module), attr, None)
        stop = getattr(helper, "_stop", None)
        if stop is not None:
            try:
                stop()
            except (OSError, ChildProcessError):  # already gone
                pass
