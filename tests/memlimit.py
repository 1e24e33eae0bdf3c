"""A child process's address-space cap, for the tests that show a read's memory is bounded.

Why a cap rather than a measured peak: RSS depends on the allocator and the machine's load, a
limit does not; the test then shows that the bounded path fits where the unbounded one (all
ranks' events in one frame) raises MemoryError. Used from the ``python -c`` children of
tests/read/ranks/test_workers.py and tests/read/importer/test_import_cache.py (run with the
repository as their working directory).
"""
from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path


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


def run_capped(code: str, args: list[str], cwd: Path, timeout: float = 300) -> str:
    """Run ``python -c code *args`` and say how it ended: its last line of output, or "killed by
    SIG..." (with faulthandler's report of where) when a signal ended it, or the last line of
    its errors.

    Why a signal is an answer: under an address-space cap a native allocation that fails can end
    the process outright (a C++ ``std::bad_alloc`` with no handler aborts, a NULL that is not
    checked faults) before Python can raise MemoryError. One CI run's control ("all ranks'
    events in one frame") ended that way, with nothing printed."""
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, *args], cwd=cwd,
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode < 0:
        name = signal.Signals(-p.returncode).name if -p.returncode in signal.valid_signals() else str(-p.returncode)
        return f"killed by {name}: {p.stderr.strip()[-400:]}"
    lines = p.stdout.strip().splitlines() or p.stderr.strip().splitlines() or [f"exit {p.returncode}, no output"]
    return lines[-1]


def did_not_fit(outcome: str) -> bool:
    """Whether :func:`run_capped`'s outcome says the work did not fit under the cap."""
    return outcome == "MemoryError" or outcome.startswith("killed by SIG")
