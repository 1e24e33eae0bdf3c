"""The options of each command that runs jobs (``profile``, ``allreduce``, ``verify``), as frozen
dataclasses that refuse bad values when they are built.

Why here, torch-free: the CLI builds its argparse defaults from these fields and must stay cheap
to import; the commands take the same objects. Cross-option rules (a trace needs
``--profile-steps`` within ``--steps``; strong scaling needs a batch every world size divides;
an ``--inject-delay`` rank must exist) need the options and the training config together, so
:class:`ProfileOptions` holds its :class:`~dpcore.contract.config.TrainConfig`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dpcore.contract.config import (
    ALGOS,
    COMM_HOOKS,
    DEFAULT_TIMEOUT_S,
    DEVICES,
    DTYPES,
    MAX_REPEATS,
    MAX_STEPS,
    PROGRESS_MODES,
    VARIANTS,
    VERIFY_MODELS,
    TrainConfig,
    check_at_most,
    check_backend,
    check_bucket_sweep,
    check_choices,
    check_int,
    check_int_list,
    check_model_name,
    check_run_id,
    check_timeout,
    profile_steps_error,
)
from dpcore.contract.errors import UsageError
from dpcore.contract.limits import (
    batch_bytes,
    check_fits,
    check_threads,
    check_world_sizes,
    param_count,
)


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What every command that writes a run is told: where, under which name, on which backend,
    how long a job may take and how progress is shown."""

    out: str = "profiles"
    name: str | None = None
    backend: str = "auto"
    #: ``--device``: one of DEVICES (auto: cuda where a GPU is present)
    device: str = "auto"
    timeout_s: float = DEFAULT_TIMEOUT_S
    progress: str = "bar"
    run_id: str | None = None

    def __post_init__(self) -> None:
        check_timeout(self.timeout_s)
        check_choices((self.device,), "device", DEVICES)
        check_choices((self.progress,), "progress mode", PROGRESS_MODES)
        check_backend(self.backend)
        check_run_id(self.run_id)
        if not self.out.strip():  # Path("") is the current folder: never write there unasked
            raise UsageError("--out is empty; give the folder the run is written into, e.g. profiles")
        # whether --out can hold a run is checked where the folder is made (RunWriter)


@dataclass(frozen=True)
class ProfileOptions(RunOptions):
    """``profile``: which jobs (variants x world sizes x bucket sizes), how each trains
    (``train``), and the resources every job gets."""

    variants: tuple[str, ...] = VARIANTS
    world_sizes: tuple[int, ...] = (1, 2)
    bucket_sweep: tuple[float, ...] = ()
    trace: bool = True
    threads_per_rank: int | None = None   # None: physical cores // largest world size
    pin: bool = True                      # pin each rank to its own CPUs where they fit
    #: one torch_ddp job per hook at every world size >= 2 (``none``: the plain job)
    comm_hooks: tuple[str, ...] = ("none",)
    train: TrainConfig = field(default_factory=TrainConfig)
    #: ``--inject-hang RANK:STEP[:sleep]`` as (rank, step, mode); None: no hang injected
    inject_hang: tuple[int, int, str] | None = None
    #: ``--hang-timeout S``: no step for S seconds ends the job as hung (None: the default,
    #: a multiple of the job's median step, floored, below --timeout)
    hang_timeout_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train.model in VERIFY_MODELS:  # verify's own model; profile offers MODELS
            check_model_name(self.train.model)
        check_choices(self.variants, "variant", VARIANTS, all_ok=True)
        check_int_list(self.world_sizes, "world sizes")
        check_world_sizes(self.world_sizes, "--world-sizes")
        check_bucket_sweep(self.bucket_sweep)
        check_choices(self.comm_hooks, "comm hook", COMM_HOOKS)
        if set(self.comm_hooks) - {"none"} and "torch_ddp" not in self.variants:
            raise UsageError("--comm-hook adds torch_ddp jobs: include torch_ddp in --variants")
        if set(self.comm_hooks) - {"none"} and max(self.world_sizes) < 2:
            raise UsageError("--comm-hook adds torch_ddp jobs at world sizes of 2 or more (one "
                             "rank communicates nothing): add one to --world-sizes, e.g. 1,2")
        check_int("--threads-per-rank", self.threads_per_rank, 1)
        check_threads(self.threads_per_rank)
        cfg = self.train
        if self.trace and not 0 < cfg.profile_steps <= cfg.steps:
            raise profile_steps_error(cfg.steps, cfg.profile_steps)
        for ws in self.world_sizes:
            cfg.local_batch(ws)  # raises the divisibility error for strong scaling
        top = max(self.world_sizes)
        if self.hang_timeout_s is not None:
            check_timeout(self.hang_timeout_s, "--hang-timeout")
            if self.hang_timeout_s >= self.timeout_s:
                raise UsageError(f"--hang-timeout ({self.hang_timeout_s:g} s) must be below "
                                 f"--timeout ({self.timeout_s:g} s)")
        if self.inject_hang is not None:
            rank, step, _ = self.inject_hang
            if not 0 <= rank < top or top < 2:
                raise UsageError(f"--inject-hang rank {rank} does not exist; valid ranks: "
                                 f"0..{top - 1} (a hang needs a world size of at least 2)")
            if not 0 <= step < cfg.steps:
                raise UsageError(f"--inject-hang step {step} is not a timed step; valid steps: "
                                 f"0..{cfg.steps - 1}")
            if step == 0 and cfg.warmup == 0:
                # the hang watchdog's deadline is a multiple of a finished step: before the
                # first one ends it is not armed, and the job would wait for --timeout
                raise UsageError("--inject-hang step 0 with --warmup 0 hangs before any step has "
                                 "finished, when the hang watchdog is not armed yet; valid: a step "
                                 f"of 1..{cfg.steps - 1}, or --warmup 1 or more")
        if cfg.delay_rank >= top:
            raise UsageError(f"--inject-delay rank {cfg.delay_rank} does not exist; valid ranks: "
                             f"0..{top - 1}")
        # every rank of the largest job draws the whole global batch, then holds its weights
        # and gradients: a lower bound of what that job needs on this host
        batch = batch_bytes(cfg.model, cfg.size, cfg.global_batch(top))
        params = param_count(cfg.model, cfg.size, cfg.width)
        if batch is not None and params is not None:
            check_fits(f"--batch-size {cfg.batch_size} at world size {top}",
                       top * (batch + params * 4 * 2), "choose a smaller --batch-size or world size")


@dataclass(frozen=True)
class AllreduceOptions(RunOptions):
    """``allreduce``: algorithms x world sizes, each timed at every size (bytes, float32)."""

    algos: tuple[str, ...] = ALGOS
    world_sizes: tuple[int, ...] = (2, 4)
    sizes: tuple[int, ...] = (1024, 64 * 1024, 2**20, 16 * 2**20, 64 * 2**20)
    warmup: int = 3
    repeats: int = 0                # 0 == adaptive: more repeats for small sizes

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choices(self.algos, "algorithm", ALGOS, all_ok=True)
        check_int_list(self.world_sizes, "world sizes")
        check_world_sizes(self.world_sizes, "--world-sizes")
        if not self.sizes:
            raise UsageError("--sizes is empty; give sizes like 1KB,64KB,1MB")
        bad = [s for s in self.sizes if s < 4 or s % 4]
        if bad:
            raise UsageError(f"--sizes must be multiples of 4 bytes (float32 elements), got "
                             f"{', '.join(map(str, bad))}; e.g. 1KB,64KB,1MB")
        check_int("--warmup", self.warmup, 0)
        check_at_most("--warmup", self.warmup, MAX_REPEATS, "untimed repeats per size")
        check_int("--repeats", self.repeats, 0, " (0 = adaptive)")
        check_at_most("--repeats", self.repeats, MAX_REPEATS, "timed repeats per size; 0 = adaptive")
        # every rank holds its message and the result (the algorithms keep at least one more
        # buffer of chunks): two copies per rank at the least
        top = max(self.world_sizes)
        check_fits(f"--sizes {max(self.sizes)} bytes at world size {top}", 2 * max(self.sizes) * top,
                   "choose smaller --sizes or world sizes")


@dataclass(frozen=True)
class VerifyOptions:
    """``verify``: which variants are compared with ``single``, at which world size, on which
    model, for how many steps (the training config itself is verify's, per model)."""

    model: str = VERIFY_MODELS[0]
    world_size: int = 2
    variants: tuple[str, ...] = VARIANTS
    steps: int = 5
    backend: str = "auto"
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: extra ``torch_ddp[<hook>]`` rows: DDP with that comm hook, reported as lossy
    comm_hooks: tuple[str, ...] = ()
    #: ``--device`` (DEVICES) and ``--dtype`` (DTYPES): every variant and ``single`` alike
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        check_choices((self.device,), "device", DEVICES)
        check_choices((self.dtype,), "dtype", DTYPES)
        check_model_name(self.model, VERIFY_MODELS)
        if self.comm_hooks:
            check_choices(self.comm_hooks, "comm hook", COMM_HOOKS)
        check_timeout(self.timeout_s)
        check_int("--world-size", self.world_size, 1)
        check_world_sizes((self.world_size,), "--world-size")
        check_int("--steps", self.steps, 1)
        check_at_most("--steps", self.steps, MAX_STEPS, "each step is compared across variants")
        check_choices(self.variants, "variant", VARIANTS, all_ok=True)
        check_backend(self.backend)
