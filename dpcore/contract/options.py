"""The options of each command that runs jobs (``profile``, ``allreduce``, ``verify``), as frozen
dataclasses that refuse bad values when they are built.

Why here, torch-free: each field is also its command-line option (:func:`option`: flag, help,
metavar, how its text is parsed), so the CLI's parser and docs/cli.md's option tables are
generated from these classes and must stay cheap to import; the commands take the same objects.
Cross-option rules (a trace needs ``--profile-steps`` within ``--steps``; strong scaling needs a
batch every world size divides; an ``--inject-delay`` rank must exist) need the options and the
training config together, so :class:`ProfileOptions` holds its :class:`~dpcore.contract.config.TrainConfig`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dpcore.contract.config import (
    ALGOS,
    BACKENDS,
    COMM_HOOKS,
    DEFAULT_TIMEOUT_S,
    DEVICES,
    DTYPES,
    MAX_DELAY_MS,
    MAX_REPEATS,
    MAX_STEPS,
    MODEL_BATCH_SIZES,
    PROGRESS_MODES,
    VARIANTS,
    VERIFY_MODELS,
    WARMUP,
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
    default_of,
    parse_bucket_sweep,
    parse_choices,
    parse_delay,
    parse_hang,
    parse_int_list,
    parse_size_list,
    profile_steps_error,
    size_text,
    split_items,
)
from dpcore.contract.errors import UsageError
from dpcore.contract.limits import (
    MAX_BUCKET_MB,
    MAX_WHATIF_WORLD,
    batch_bytes,
    check_fits,
    check_threads,
    check_world_sizes,
    param_count,
)
from dpcore.contract.option_fields import (
    OptionSpec,
    option,
    option_argv,
    option_fields,
    option_values,
    value_text,
)

T = TypeVar("T", bound="CommandOptions")


def list_text(values: tuple[Any, ...], every: tuple[str, ...] | None = None) -> str:
    """A tuple as an option's text: '1,2'; 'all' when it names every choice."""
    return "all" if every is not None and tuple(values) == tuple(every) else ",".join(map(value_text, values))


#: The help of the options that profile, allreduce and verify share (one text each).
DEVICE_HELP = (f"{', '.join(DEVICES)}: auto = cuda where a GPU is present, else cpu; with more ranks than "
               "GPUs, rank r computes on GPU r mod G and the ranks share the GPUs over gloo (default %(default)s)")
BACKEND_HELP = (f"{', '.join(BACKENDS)}: auto = nccl on cuda when every rank has its own GPU, else gloo "
                "(default %(default)s)")
TIMEOUT_HELP = "seconds before a hung job is killed and reported (default %(default)g)"
VARIANTS_HELP = "comma-separated variants, or all: " + ", ".join(VARIANTS) + " (default %(default)s)"


def _variants(text: str) -> tuple[str, ...]:
    return tuple(parse_choices(text, "variant", VARIANTS))


def _variants_text(values: tuple[str, ...]) -> str:
    return list_text(values, VARIANTS)


def _world_sizes(text: str) -> tuple[int, ...]:
    return tuple(parse_int_list(text, "world sizes"))


#: ``--world-sizes``, declared once: profile (default 1,2), allreduce (2,4) and whatif (None: the
#: run's) take it with their own defaults (:func:`option`'s ``spec``).
WORLD_SIZES = OptionSpec(
    flag="--world-sizes", parse=_world_sizes, text=list_text,
    help="comma-separated numbers of ranks; every job runs at each (default %(default)s)")


class CommandOptions:
    """What every command's options class can do: be built from the parsed command line
    (:meth:`from_args`) and be written back as one (:meth:`to_argv`). Cooperative
    ``__post_init__``: each base checks its own fields, the shared bases once."""

    def __post_init__(self) -> None:
        pass

    @classmethod
    def values_of(cls, args: Any) -> dict[str, Any]:
        """The class's option values from a parsed namespace (text parsed, switches inverted)."""
        return option_values(args, cls)

    @classmethod
    def from_args(cls: type[T], args: Any) -> T:
        """The options of the parsed command line ``args``; UsageError for a bad value."""
        return cls(**cls.values_of(args))

    def to_argv(self, keep: tuple[str, ...] = ()) -> list[str]:
        """The command-line arguments that give these options (defaults left out but ``keep``'s)."""
        return option_argv(self, keep=keep)


@dataclass(frozen=True, kw_only=True)
class JobOptions(CommandOptions):
    """What every command that runs jobs is told (``profile``, ``allreduce``, ``verify``): on
    which device and backend, and how long a job may take."""

    device: str = option("auto", flag="--device", help=DEVICE_HELP)
    backend: str = option("auto", flag="--backend", help=BACKEND_HELP)
    timeout_s: float = option(DEFAULT_TIMEOUT_S, flag="--timeout", type=float, help=TIMEOUT_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_timeout(self.timeout_s)
        check_choices((self.device,), "device", DEVICES)
        check_backend(self.backend)


@dataclass(frozen=True, kw_only=True)
class OutputOptions(CommandOptions):
    """Where a command that writes a run puts it (``profile``, ``allreduce``, ``import``), and the
    command line that asked for it (recorded in run.json; not an option, not compared)."""

    out: str = option("profiles", flag="--out",
                      help="folder the run directory is written into (default %(default)s)")
    name: str | None = option(None, flag="--name", help="label added to the generated run id")
    command: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.out.strip():  # Path("") is the current folder: never write there unasked
            raise UsageError("--out is empty; give the folder the run is written into, e.g. profiles")
        # whether --out can hold a run is checked where the folder is made (RunWriter)

    @classmethod
    def values_of(cls, args: Any) -> dict[str, Any]:
        return {**super().values_of(args), "command": tuple(getattr(args, "argv", ()))}


@dataclass(frozen=True, kw_only=True)
class RunOptions(OutputOptions, JobOptions):
    """What every command that runs jobs into a run is told (``profile``, ``allreduce``): the
    job options, where the run goes, under which id, and how progress is shown."""

    run_id: str | None = option(None, flag="--run-id", help="exact run directory name (must not exist)")
    progress: str = option("bar", flag="--progress",
                           help=f"one of {', '.join(PROGRESS_MODES)}: a terminal bar, JSON lines (for the "
                                "dashboard), or nothing (default %(default)s)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choices((self.progress,), "progress mode", PROGRESS_MODES)
        check_run_id(self.run_id)


@dataclass(frozen=True)
class VariantOptions(CommandOptions):
    """Which data-parallel variants a command trains (``profile``, ``verify``) and which DDP comm
    hooks it adds (``none``: DDP's plain all-reduce, the job every hook is compared with)."""

    variants: tuple[str, ...] = option(VARIANTS, flag="--variants", help=VARIANTS_HELP,
                                       parse=_variants, text=_variants_text)
    comm_hooks: tuple[str, ...] = option(
        ("none",), flag="--comm-hook", text=list_text, kw_only=True,
        parse=lambda text: tuple(parse_choices(text, "comm hook", COMM_HOOKS, all_ok=False)),
        help="DDP comm hooks, one torch_ddp job each at world sizes >= 2: " + ",".join(COMM_HOOKS)
             + " (e.g. none,fp16,powersgd) (default %(default)s)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choices(self.variants, "variant", VARIANTS, all_ok=True)
        check_choices(self.comm_hooks, "comm hook", COMM_HOOKS)


def model_batch_size(model: str) -> int:
    """A built-in model's own batch when ``--batch-size`` is not given: einsum's b
    (docs/DESIGN.md), else TrainConfig's (a user's model: its Workload's, set before)."""
    return int(MODEL_BATCH_SIZES.get(model, default_of(TrainConfig, "batch_size")))


@dataclass(frozen=True)
class ProfileOptions(VariantOptions, RunOptions):
    """``profile``: which jobs (variants x world sizes x bucket sizes), how each trains
    (``train``), and the resources every job gets. ``variants`` and ``world_sizes`` may be
    given by position, in that order (``ProfileOptions(("ring",), (1, 2))``)."""

    world_sizes: tuple[int, ...] = option((1, 2), spec=WORLD_SIZES)
    bucket_sweep: tuple[float, ...] = option(
        (), flag="--bucket-sweep", parse=parse_bucket_sweep, text=list_text,
        help="more bucket caps in MiB, one more job of each bucketed variant per cap, e.g. "
             "1,10,25,100 (default: none)")
    trace: bool = option(True, flag="--no-trace", negate=True, help="skip the torch.profiler steps")
    #: pin each rank to its own CPUs where they fit
    pin: bool = option(True, flag="--no-pin", negate=True,
                       help="do not pin each rank to its own CPUs (by default ranks are pinned where they fit)")
    #: ``--inject-hang RANK:STEP[:sleep]`` as (rank, step, mode); None: no hang injected
    inject_hang: tuple[int, int, str] | None = option(
        None, flag="--inject-hang", metavar="RANK:STEP[:sleep]", parse=parse_hang,
        text=lambda hang: f"{hang[0]}:{hang[1]}" + (":sleep" if hang[2] == "sleep" else ""),
        help="rank RANK skips the first all-reduce of timed step STEP (a desync), or with :sleep "
             "sleeps forever there (a missing rank): what a hang looks like")
    #: no step for S seconds ends the job as hung (None: the default, a multiple of the job's
    #: median step, floored, below --timeout)
    hang_timeout_s: float | None = option(
        None, flag="--hang-timeout", type=float, metavar="S",
        help="a job in which no step ends for S seconds is hung: dpcore collects every rank's flight "
             "recorder and stack into hang/<job_id>/ and fails it (default: 50 median steps, at least "
             "20 s, below --timeout)")
    #: None: physical cores // largest world size
    threads_per_rank: int | None = option(
        None, flag="--threads-per-rank", type=int,
        help="torch threads of every rank of every job (default: physical cores // largest world size, "
             "the same for all jobs so scaling compares like with like)")
    #: ``--inject-delay RANK:MS`` as (rank, ms): that rank sleeps MS ms in its forward every
    #: step; None: nobody. It reaches the ranks with ``--inject-hang``, as one value
    #: (:class:`dpcore.write.capture.inject.Injections`).
    inject_delay: tuple[int, float] | None = option(
        None, flag="--inject-delay", metavar="RANK:MS", parse=parse_delay,
        text=lambda delay: f"{delay[0]}:{value_text(delay[1])}",
        help="rank RANK sleeps MS ms in its forward every step: what a straggler looks like")
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_args(cls, args: Any) -> ProfileOptions:
        """The options and the training config of the parsed command line. ``--batch-size`` left
        out is the model's own (:func:`model_batch_size`; a user's Workload's is set on ``args``
        when the workload is loaded, before this); the profiler steps are 0 with ``--no-trace``."""
        given = cls.values_of(args)
        train = option_values(args, TrainConfig)
        if train["batch_size"] is None:
            train["batch_size"] = model_batch_size(train["model"])
        if not given["trace"]:
            train["profile_steps"] = 0
        return cls(train=TrainConfig(**train), **given)

    def to_argv(self, keep: tuple[str, ...] = ()) -> list[str]:
        """The training options first (the batch always: left out it would be the model's), then
        the profile's: ``profile`` fed these builds these options again. ``keep``: fields given
        even at their defaults (the dashboard shows the command it starts)."""
        return [*option_argv(self.train, keep=("batch_size", *keep)), *option_argv(self, keep=keep)]

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train.model in VERIFY_MODELS:  # verify's own model; profile offers MODELS
            check_model_name(self.train.model)
        check_int_list(self.world_sizes, "world sizes")
        check_world_sizes(self.world_sizes, "--world-sizes")
        check_bucket_sweep(self.bucket_sweep)
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
        if self.inject_delay is not None:
            rank, ms = self.inject_delay
            if not 0 < ms <= MAX_DELAY_MS:
                raise UsageError(f"--inject-delay must sleep between 0 and {MAX_DELAY_MS:.0f} ms, got {ms:g}")
            if not 0 <= rank < top:
                raise UsageError(f"--inject-delay rank {rank} does not exist; valid ranks: 0..{top - 1}")
        # every rank of the largest job draws the whole global batch, then holds its weights
        # and gradients: a lower bound of what that job needs on this host
        batch = batch_bytes(cfg.model, cfg.size, cfg.global_batch(top))
        params = param_count(cfg.model, cfg.size, cfg.width)
        if batch is not None and params is not None:
            check_fits(f"--batch-size {cfg.batch_size} at world size {top}",
                       top * (batch + params * 4 * 2), "choose a smaller --batch-size or world size")


@dataclass(frozen=True, kw_only=True)
class AllreduceOptions(RunOptions):
    """``allreduce``: algorithms x world sizes, each timed at every size (bytes, float32)."""

    algos: tuple[str, ...] = option(
        ALGOS, flag="--algos", text=list_text,
        parse=lambda text: tuple(parse_choices(text, "algorithm", ALGOS)),
        help=f"comma-separated algorithms, or all: {', '.join(ALGOS)} (native = the backend's own "
             "dist.all_reduce; the others are dpcore's from-scratch ones) (default: %(default)s)")
    world_sizes: tuple[int, ...] = option((2, 4), spec=WORLD_SIZES)
    sizes: tuple[int, ...] = option(
        (1024, 64 * 1024, 2**20, 16 * 2**20, 64 * 2**20), flag="--sizes", parse=parse_size_list,
        text=lambda sizes: ",".join(size_text(n) for n in sizes),
        help="comma-separated message sizes in bytes, KB, MB or GB (binary: 1MB = 2^20 bytes), each a "
             "multiple of 4 bytes (float32) (default %(default)s)")
    warmup: int = option(3, spec=WARMUP)
    #: 0 == adaptive: more repeats for small sizes
    repeats: int = option(0, flag="--repeats", type=int,
                          help="timed calls per size; the table shows their median (default %(default)s = "
                               "adaptive: 50 up to 64 KiB, 20 up to 4 MiB, 10 above)")

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


#: The training options ``verify`` takes (TrainConfig's fields: their one declaration); the
#: config itself is verify's per model (``dpcore.write.commands.verify.verify_config``).
VERIFY_TRAIN = ("model", "size", "width", "batch_size", "steps", "lr", "optimizer", "seed", "dtype")


@dataclass(frozen=True, kw_only=True)
class VerifyOptions(VariantOptions, JobOptions):
    """``verify``: which variants are compared with ``single``, at which world size, on which
    model, for how many steps. The training options (``model`` .. ``dtype``, :data:`VERIFY_TRAIN`)
    are TrainConfig's on the command line; ``batch_size`` / ``lr`` None: the model's own."""

    model: str = VERIFY_MODELS[0]
    steps: int = 5
    size: str = default_of(TrainConfig, "size")
    width: int = default_of(TrainConfig, "width")
    batch_size: int | None = None
    lr: float | None = None
    optimizer: str = default_of(TrainConfig, "optimizer")
    seed: int = default_of(TrainConfig, "seed")
    #: every variant and ``single`` alike
    dtype: str = "auto"
    world_size: int = option(2, flag="--world-size", type=int,
                             help="ranks of every variant's job (default %(default)s)")

    @classmethod
    def values_of(cls, args: Any) -> dict[str, Any]:
        return {**super().values_of(args), **{k: getattr(args, k) for k in VERIFY_TRAIN}}

    def to_argv(self, keep: tuple[str, ...] = ()) -> list[str]:
        """The training options (TrainConfig's flags) at values other than verify's defaults, then
        verify's own: ``verify`` fed these builds these options again."""
        flags = {f.name: spec.flag for f, spec in option_fields(TrainConfig)}
        train = [(flags[name], getattr(self, name)) for name in VERIFY_TRAIN
                 if name in keep or getattr(self, name) != default_of(type(self), name)]
        return [*(text for flag, value in train for text in (flag, value_text(value))), *option_argv(self, keep=keep)]

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choices((self.dtype,), "dtype", DTYPES)
        check_model_name(self.model, VERIFY_MODELS)
        check_int("--world-size", self.world_size, 1)
        check_world_sizes((self.world_size,), "--world-size")
        check_int("--steps", self.steps, 1)
        check_at_most("--steps", self.steps, MAX_STEPS, "each step is compared across variants")


#: The help of the trace folders the read commands take.
TRACES_HELP = "a run directory, a job's traces folder, or any folder of torch.profiler traces"


@dataclass(frozen=True, kw_only=True)
class CsvOptions(CommandOptions):
    """The output switch of every command that reads runs and traces."""

    csv: bool = option(False, flag="--csv", switch=True,
                       help="CSV rows (every column) instead of the text table")


@dataclass(frozen=True, kw_only=True)
class PathOptions(CommandOptions):
    """A read command's PATH: a run directory or a folder of traces (``analyze``, ``gpu``,
    ``stragglers``, ``hang``; each command words what it reads in its declaration)."""

    path: str = option("", flag="path", help=TRACES_HELP)


def _workers(text: str) -> int:
    try:
        workers = int(text)
    except ValueError:
        raise UsageError(f"--workers must be a whole number of processes >= 1, got {text!r}") from None
    if workers < 1:
        raise UsageError(f"--workers must be a whole number of processes >= 1, got {workers}")
    return workers


@dataclass(frozen=True, kw_only=True)
class ScaleOptions(CommandOptions):
    """Where the commands that read many ranks' traces parse them (``dpcore.read.ranks.Scale``,
    built from these by the read wing)."""

    workers: int | None = option(
        None, flag="--workers", parse=_workers,
        help="processes that parse rank traces, one rank each (default: the cores, for trace sets of 64 MB "
             "or more; 1 = in this process)")
    scheduler: str | None = option(
        None, flag="--scheduler", metavar="ADDRESS",
        help="a Dask distributed scheduler (e.g. tcp://host:8786) that parses the rank traces instead (needs "
             "dask[distributed]; its workers must see the same paths)")
    cache: bool = option(True, flag="--no-cache", negate=True,
                         help="read every trace again and store nothing in cache/ (the numbers are the same)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("--workers", self.workers, 1)


@dataclass(frozen=True, kw_only=True)
class AnalyzeOptions(ScaleOptions, CsvOptions, PathOptions):
    """``analyze``: the overlap per rank of a run or a folder of traces."""


@dataclass(frozen=True, kw_only=True)
class StragglersOptions(ScaleOptions, CsvOptions, PathOptions):
    """``stragglers``: which rank arrives last at the collectives."""


@dataclass(frozen=True, kw_only=True)
class HangOptions(CsvOptions, PathOptions):
    """``hang``: every rank's last collectives and stack (it reads dumps, not rank traces)."""


@dataclass(frozen=True, kw_only=True)
class SummarizeOptions(ScaleOptions, CsvOptions):
    """``summarize``: the per-job table of a run."""

    run: str = option("", flag="run", help="a run directory (profiles/<run_id>)")


@dataclass(frozen=True, kw_only=True)
class GpuOptions(ScaleOptions, CsvOptions, PathOptions):
    """``gpu``: the GPU time ledger, and its views besides it."""

    per_step: bool = option(False, flag="--per-step", switch=True,
                            help="also one row per traced step (ProfilerStep#k)")
    kernels: bool = option(
        False, flag="--kernels", switch=True,
        help="GPU time by kernel class (GEMM, attention, elementwise, reduction, communication, memory) "
             "instead, with the GEMMs' data type and a line where fp32 GEMMs leave tensor cores unused")
    collectives: bool = option(
        False, flag="--collectives", switch=True,
        help="every collective call instead: bytes (from the trace's collective metadata), time, algbw and "
             "busbw (nccl-tests' definitions)")


def parse_bucket_list(text: str) -> tuple[float, ...] | None:
    """'1,4,32' -> (1.0, 4.0, 32.0) MiB, each finite, > 0 and at most MAX_BUCKET_MB; empty ->
    None (the run's sizes); an empty item ('1,,4') is refused."""
    if not text.strip():
        return None
    out = []
    for item in split_items(text, "--bucket-mb", "1,4,25"):
        try:
            mb = float(item)
        except ValueError:
            mb = float("nan")
        if not (math.isfinite(mb) and 0 < mb <= MAX_BUCKET_MB):
            raise UsageError(f"bad --bucket-mb value {item!r}; give positive MiB up to "
                             f"{MAX_BUCKET_MB:.0f} like 1,4,25")
        out.append(mb)
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True, kw_only=True)
class WhatifOptions(CsvOptions):
    """``whatif``'s run and the grid and network it predicts for, parsed (bucket sizes and world
    sizes as tuples, None: the run's)."""

    run: str | None = option(None, flag="run", optional=True,
                             help="a run directory with a bucketed or torch_ddp job (not needed for --fabric list)")
    job: str | None = option(None, flag="--job", help="the measured job to start from, e.g. bucketed-ws2-b25 "
                                                      "(a world-size-1 job too, with --fabric)")
    #: the grid's bucket sizes (MiB), not a job's one cap (TrainConfig's ``--bucket-mb``)
    bucket_mb: tuple[float, ...] | None = option(
        None, flag="--bucket-mb", parse=parse_bucket_list, text=list_text,
        help="bucket sizes in MiB, e.g. 1,4,25 (default: the run's)")
    world_sizes: tuple[int, ...] | None = option(None, spec=WORLD_SIZES)
    bandwidth_gbps: float | None = option(
        None, flag="--bandwidth-gbps", type=float,
        help="per-link bandwidth B in GB/s (default: fitted from an allreduce run or the job)")
    latency_us: float | None = option(None, flag="--latency-us", type=float,
                                      help="per-message latency alpha in us (default: fitted like B)")
    algo: str = option("ring", flag="--algo",
                       help=f"all-reduce algorithm of the alpha-beta model: {', '.join(ALGOS)} (default ring)")
    allreduce_run: str | None = option(
        None, flag="--allreduce-run",
        help="fit alpha and B from this `allreduce` run (default: the run's own allreduce rows, else the job's "
             "collectives)")
    fabric: str | None = option(
        None, flag="--fabric",
        help="messages from an interconnect preset: NAME (inside a node) or INTRA,INTER (between nodes too), "
             "e.g. nvlink-h100,ib-ndr400; 'list' prints the presets and their sources; "
             "--bandwidth-gbps/--latency-us override it")

    @classmethod
    def values_of(cls, args: Any) -> dict[str, Any]:
        """As every class's, with what-if's wording of a bad ``--world-sizes`` (the flag, which
        its one-line messages name throughout)."""
        try:
            return super().values_of(args)
        except UsageError as exc:
            raise UsageError(str(exc).replace(" world sizes ", " --world-sizes ", 1)) from None

    def __post_init__(self) -> None:
        super().__post_init__()
        # the replay holds rows per rank and message: 10**8 ranks is a MemoryError, not a prediction
        if self.world_sizes is not None and max(self.world_sizes, default=1) > MAX_WHATIF_WORLD:
            raise UsageError(f"--world-sizes {max(self.world_sizes)} is beyond what whatif models: give world "
                             f"sizes from 1 to {MAX_WHATIF_WORLD}")


#: ``import --align-clocks``: when the importer shifts ranks onto rank 0's clock (one list, the
#: option's choices and the importer's check).
CLOCK_ALIGNMENTS = ("auto", "always", "never")


@dataclass(frozen=True, kw_only=True)
class ImportOptions(ScaleOptions, OutputOptions):
    """``import``'s traces and where the run it writes goes."""

    traces: str = option("", flag="traces",
                         help="a folder of traces (searched recursively: rank<r>.json, *.pt.trace.json[.gz], "
                              "torchtitan's iteration_<k>/rank<r>_trace.json) or one trace file")
    iteration: int | None = option(None, flag="--iteration", type=int,
                                   help="torchtitan layout: which iteration_<k> folder (default: the latest)")
    align_clocks: str = option(
        "auto", flag="--align-clocks", choices=CLOCK_ALIGNMENTS,
        help="shift ranks onto rank 0's clock by matched collective ends (auto: only when the traces come "
             "from several hosts) (default %(default)s)")


@dataclass(frozen=True)
class OptionGroup:
    """The options one command takes from one options class: all its option fields or those in
    ``only``, with the command's own ``defaults`` and ``helps`` where they differ from the field's."""

    cls: type
    only: tuple[str, ...] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)
