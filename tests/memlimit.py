"""A child process's address-space cap, for the tests that show a read's memory is bounded.

Why a cap rather than a measured peak: RSS depends on the allocator and the machine's load, a
limit does not; the test then shows that the bounded path fits where the unbounded one (all
ranks' events in one frame) raises MemoryError. Used from the ``python -c`` children of
tests/read/ranks/test_workers.py and tests/read/importer/test_import_cache.py (run with the
repository as their working directory).
"""
from __future__ import annotations

import resource


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def limit_address_space(extra_mib: int) -> None:
    """Cap this process's address space at its size now plus ``extra_mib`` MiB."""
    limit = _vm_bytes() + extra_mib * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
