"""Imported by one process only: the multiprocessing forkserver of a dpcore launcher, which
preloads it (:data:`dpcore.write.runtime.launch.BASE_PRELOAD`). Importing it binds the server's
life to its launcher's (:func:`dpcore.contract.procs.bind_forkserver_to_launcher`).

Why a module of its own, imported nowhere else: the launcher names itself in an environment
variable while its forkserver starts, and a process started in that moment by another thread
(a ``python -m dpcore ...`` the dashboard runs, a test's subprocess) inherits the variable with
the launcher as its parent, exactly as the forkserver does. Bound at the import of a module that
every dpcore command imports, such a process would take itself for the forkserver and end with
status 0 whatever its outcome (``atexit``'s ``os._exit(0)``); here only the forkserver is bound.
"""
from __future__ import annotations

from dpcore.contract.procs import bind_forkserver_to_launcher

bind_forkserver_to_launcher()
