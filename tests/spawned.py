"""The end of a test rank started by ``torch.multiprocessing.spawn``, once its work is on disk.

Why not a plain return: the child then tears its interpreter down, and on torch 2.13 a gloo
worker thread can still be dropping the last collective's work object at that moment. A work
launched inside ``backward()`` (DDP's reducer, a comm hook) holds the thread-local state of its
launch, which includes the ``contextvars`` context ``torch.autograd`` stashes for every backward
(``_engine_run_backward``); freeing it takes the GIL, a thread that asks for the GIL while the
interpreter finalizes is made to exit, and the unwind through a ``noexcept`` destructor calls
``std::terminate``: "terminate called without an active exception", SIGABRT, after everything
the rank had to do is done. Seen under gdb on this machine (the abort is on ``pt_gloo_runloop``
in ``~AsyncBarrierWork`` -> ``~AsyncAllreduceWork`` -> ``~ThreadLocalState`` -> ``take_gil``,
the main thread in ``Py_FinalizeEx``), in about one run in six of
tests/write/commands/test_record_settle.py, and once in a CI run. ``spawn`` counts any
non-zero exit as the test's failure, so a rank that is done leaves without teardown.
tests/async_backend.py's ranks end the same way for the same reason.
"""
from __future__ import annotations

import os
import sys
from typing import NoReturn


def leave() -> NoReturn:
    """Exit this spawned rank now, with status 0 (its results are written), skipping the
    interpreter teardown where gloo's threads can abort it (module docstring). Call it only
    on the path where the rank's work succeeded: an exception must still reach ``spawn``."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
