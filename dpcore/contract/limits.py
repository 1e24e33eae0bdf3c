"""What this machine can hold, so that a request that cannot fit is refused in one line before
anything runs (a rank is forked, a run folder made, a buffer allocated).

Why lower bounds: every estimate here counts only memory a job certainly needs (its parameters
and gradients, the global batch every rank draws, an all-reduce's buffers), so a refusal is
never wrong; a request that passes may still be too big, and is then a job's failure, recorded
as such. Why torch-free and here: the options objects (:mod:`dpcore.contract.options`) check
their values when they are built, in the CLI before torch is imported; the model sizes below
are the built-in models' (``dpcore.write.training.models``; a test keeps the two equal).
"""
from __future__ import annotations

import os
import resource

from dpcore.contract.errors import UsageError

#: Memory one spawned rank needs at the least (a forkserver child: its own heap, gloo's
#: buffers and threads; torch's pages are shared with the server). Measured RSS of an idle
#: gloo rank on this project's CPU machines is 150-250 MiB; 100 MiB is well below it.
RANK_MIN_BYTES = 100 * 2**20
#: File descriptors each rank's launcher side keeps per rank (its process, pipe, socket).
FDS_PER_RANK = 4
#: Largest accepted ``--bucket-mb`` / ``--bucket-sweep`` value (1 TiB): beyond it a bucket's
#: byte count overflows DDP's 64-bit sizes, and a bucket larger than the model is one bucket.
MAX_BUCKET_MB = float(2**20)
#: Seeds are drawn into torch generators, which take 64-bit values; dpcore derives per-step
#: seeds modulo 2**63, so a seed is 0 .. 2**63 - 1.
MAX_SEED = 2**63 - 1
#: Most torch threads per rank, per CPU this process may use.
THREADS_PER_CPU = 8
#: Largest world size ``whatif`` predicts for: its replay holds a row per rank and message.
MAX_WHATIF_WORLD = 65536

# The built-in models' shapes (dpcore.write.training.models; tests/contract/test_limits.py
# checks these against the built models).
MLP_IN_DIM, MLP_CLASSES, MLP_LAYERS = 256, 10, 16
VOCAB = 10000
TRANSFORMER_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (64, 256, 2, 4, 32), "small": (768, 3072, 12, 12, 128),
    "medium": (1024, 4096, 24, 16, 128), "large": (1280, 5120, 36, 20, 128),
    "xl": (1600, 6400, 48, 25, 128), "2.7B": (2560, 10240, 32, 32, 128),
}
EINSUM_D, EINSUM_F = 2048, 1024


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), None where
    /proc/meminfo is not there (then nothing is refused for its size)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def in_torchrun() -> bool:
    """True when ``torchrun`` started this process: then the world size is torchrun's."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def max_local_ranks() -> tuple[int, str]:
    """The most ranks one job may spawn on this host, and why: each needs a process (the
    user's process limit), a few file descriptors, and memory (:data:`RANK_MIN_BYTES`)."""
    limits: list[tuple[int, str]] = []
    mem = available_memory()
    if mem is not None:
        limits.append((mem // RANK_MIN_BYTES,
                       f"{_size(mem)} of available memory at >= {_size(RANK_MIN_BYTES)} per rank"))
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile != resource.RLIM_INFINITY:
        limits.append(((nofile - 64) // FDS_PER_RANK,
                       f"the open-file limit {nofile} at {FDS_PER_RANK} per rank"))
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if nproc != resource.RLIM_INFINITY:
        limits.append((nproc // 2, f"the process limit {nproc}"))
    if not limits:
        return 1 << 20, "no limit known"
    n, why = min(limits)
    return max(1, n), why


def check_world_sizes(values: tuple[int, ...] | list[int], option: str) -> None:
    """Refuse a world size this host cannot spawn (a fork bomb otherwise: a store for every
    rank, then forks until ``fork()`` fails). Under torchrun the world is torchrun's and
    already exists: nothing is spawned, nothing to bound here."""
    if in_torchrun() or not values:
        return
    top = max(values)
    limit, why = max_local_ranks()
    if top > limit:
        raise UsageError(f"{option} {top} is more ranks than this machine can hold: at most "
                         f"{limit} ({why}); use torchrun across hosts for more")


def check_threads(threads: int | None, option: str = "--threads-per-rank") -> None:
    """Torch threads per rank: at most :data:`THREADS_PER_CPU` per CPU this process may use.
    A few more threads than CPUs is a legitimate experiment (recorded as given); a huge value
    starts that many OpenMP threads in every rank, which only time-slice the same CPUs."""
    cpus = usable_cpus()
    if threads is not None and threads > THREADS_PER_CPU * cpus:
        raise UsageError(f"{option} must be between 1 and {THREADS_PER_CPU * cpus} "
                         f"({THREADS_PER_CPU} per CPU this process may use: {cpus}), got {threads}")


def check_fits(what: str, nbytes: int, hint: str) -> None:
    """Refuse when ``nbytes`` (a lower bound of what ``what`` needs) exceeds the memory
    available now; ``hint`` says what to change."""
    mem = available_memory()
    if mem is not None and nbytes > mem:
        raise UsageError(f"{what} needs at least {_size(nbytes)}, more than the {_size(mem)} of "
                         f"memory available on this machine; {hint}")


def param_count(model: str, size: str, width: int) -> int | None:
    """Trainable parameters of a built-in model (tied weights once); None for a user's."""
    if model == "mlp":
        dims = [MLP_IN_DIM] + [width] * (MLP_LAYERS - 1) + [MLP_CLASSES]
        return sum(a * b + b for a, b in zip(dims, dims[1:]))
    if model == "transformer" and size in TRANSFORMER_SIZES:
        d, ff, layers, _heads, ctx = TRANSFORMER_SIZES[size]
        block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d)
        return VOCAB * d + ctx * d + layers * block + 2 * d
    if model == "einsum":
        return 2 * EINSUM_D * EINSUM_F
    return None


def batch_bytes(model: str, size: str, global_batch: int) -> int | None:
    """Bytes of the global batch's inputs and targets, which every rank draws whole before
    taking its shard; None for a user's model."""
    if model == "mlp":
        return global_batch * (MLP_IN_DIM * 4 + 8)
    if model == "transformer":
        ctx = TRANSFORMER_SIZES.get(size, (0, 0, 0, 0, 32))[4]
        return global_batch * ctx * 8 * 2
    if model == "einsum":
        return global_batch * EINSUM_D * 4 * 2
    return None


def _size(n: float) -> str:
    """Bytes as binary units, e.g. 21.9 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover
