"""docs/DESIGN.md's fixed names, the training config (saved verbatim to run.json), the rules every
option value is checked by, and the parsing of the CLI's list and size syntax.

Why validation lives in ``TrainConfig.__post_init__`` (and in the command options built on it,
:mod:`dpcore.contract.options`): a config that no job can run must be refused wherever it is
built (the CLI, a test, a library caller), before any rank starts or any run folder exists,
with one line naming the option and its valid values (:class:`UsageError`, exit 2 in the CLI).
TrainConfig's fields are also the training options of ``profile`` and ``verify`` (flag, help;
:mod:`dpcore.contract.option_fields`): the CLI's parser is generated from them and only turns
text into values, so a rule, a default or a help text is written once.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from dpcore.contract.errors import UsageError, choices_error
from dpcore.contract.limits import MAX_BUCKET_MB, MAX_SEED, check_fits, param_count
from dpcore.contract.option_fields import OptionSpec, option

# docs/DESIGN.md's fixed names, in one torch-free place (the CLI and the app import them cheaply;
# dpcore.write.dp.variants and dpcore.write.dp.comm re-export them next to their implementations).
VARIANTS = ("single", "manual", "naive", "flat", "central", "ring", "overlap", "bucketed",
            "torch_ddp", "data_parallel", "zero1", "torch_zero1", "fsdp", "torch_fsdp")
MULTIPROCESS = ("naive", "flat", "central", "ring", "overlap", "bucketed", "torch_ddp",
                "zero1", "torch_zero1", "fsdp", "torch_fsdp")
#: Multi-process variants that shard state across ranks (ZeRO-1: optimizer state; FSDP:
#: parameters, gradients and optimizer state). The rest of MULTIPROCESS replicate everything.
SHARDED = ("zero1", "torch_zero1", "fsdp", "torch_fsdp")
#: ... of which these shard the parameters themselves (full ones exist only while computing).
PARAM_SHARDED = ("fsdp", "torch_fsdp")
REPLICATED = tuple(v for v in MULTIPROCESS if v not in SHARDED)
#: ``--optimizer``: the torch.optim class every variant's optimizer is built from. SGD (the
#: default) has no state, so ZeRO-1's saving only shows with adam / adamw.
OPTIMIZERS = ("sgd", "adam", "adamw")
#: ``compute_dtype`` of ``fsdp`` (``TrainConfig.compute_dtype``); "" = compute in float32.
COMPUTE_DTYPES = ("float16", "bfloat16")
#: ``profile --comm-hook``: DDP's own communication hooks, one ``torch_ddp`` job each
#: (``none``: DDP's default all-reduce, the uncompressed job the others are compared with).
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
SINGLE_PROCESS = ("single", "manual", "data_parallel")
#: The variant of a job that ``dpcore import`` made from foreign traces. Its world size counts
#: the ranks imported, not the ranks of the job that wrote them (one rank of eight: 1).
IMPORTED = "imported"
#: variants whose job id carries the bucket size (zero1 / torch_zero1 average gradients in
#: bucketed / DDP buckets)
BUCKET_SENSITIVE = ("bucketed", "torch_ddp", "zero1", "torch_zero1")
ALGOS = ("native", "ring", "naive", "central")
MODELS = ("mlp", "transformer", "einsum")
#: Built-in models that only ``verify`` and the tests use (not offered by ``profile``).
VERIFY_MODELS = ("toy",)
SIZES = ("tiny", "small", "medium", "large", "xl", "2.7B")
SCALING = ("weak", "strong")
#: ``--backend``: ``auto`` = nccl when every local rank can have its own GPU, else gloo.
BACKENDS = ("auto", "gloo", "nccl")
#: ``--device``: where the ranks compute. ``auto`` = cuda where a GPU is present, else cpu;
#: with more local ranks than GPUs, rank r computes on GPU r mod G and the ranks talk over
#: gloo (which carries CUDA tensors, send/recv excepted; NCCL refuses two ranks on one GPU).
DEVICES = ("auto", "cpu", "cuda")
#: ``--dtype``: the precision a job trains in. ``fp32``: float32 throughout; ``bf16`` /
#: ``fp16``: float32 master weights, forward and loss under ``torch.autocast`` in that type
#: (fp16 with a gradient scaler, as mixed-precision training does; fsdp / torch_fsdp also
#: all-gather and compute their parameters in the half type); ``auto``: bf16 on a GPU that
#: computes it in hardware (compute capability 8.0+), fp32 otherwise (the CPU included),
#: resolved before the first job.
DTYPES = ("auto", "fp32", "bf16", "fp16")
#: ``--dtype``'s help, the same in every command that takes it.
DTYPE_HELP = (f"{', '.join(DTYPES)}: fp32, or bf16 / fp16 autocast with float32 master weights (fp16 with "
              "a gradient scaler); auto = bf16 on a GPU that computes it (compute capability 8.0+), else fp32 "
              "(default %(default)s)")
#: What gloo cannot do with CUDA tensors, from torch's ProcessGroupGloo.cpp (torch 2.4 to
#: 2.11): broadcast, all_reduce, reduce, all_gather (``all_gather_into_tensor`` is an
#: all_gather), gather, scatter and all_to_all each have a CUDA work (the tensors are staged
#: through pinned host memory), and ``reduce_scatter_tensor`` is an all_reduce of the whole
#: buffer that keeps this rank's slice; send/recv and the coalesced all-gather hand the
#: tensor's device pointer to gloo's CPU transport, which can crash the rank. Variants and
#: all-reduce algorithms that need send/recv are skipped with the reason when ranks share GPUs
#: over gloo; the FSDPs run (``scripts/gpu_check.py`` probes each collective on a GPU).
GLOO_CUDA_MISSING = {"naive": "send/recv", "central": "send/recv", "ring": "send/recv"}


def gloo_cuda_refusal(name: str, backend: str, device_type: str) -> str | None:
    """Why variant or algorithm ``name`` cannot run on ``backend`` with tensors on
    ``device_type`` (:data:`GLOO_CUDA_MISSING`), or None."""
    if backend != "gloo" or device_type != "cuda" or name not in GLOO_CUDA_MISSING:
        return None
    return (f"{name} needs {GLOO_CUDA_MISSING[name]}, which gloo does not do on CUDA tensors; "
            "run it with --device cpu, or on nccl with a GPU per rank")


#: the resolved precisions (what run.json's config says a job ran in)
PRECISIONS = ("fp32", "bf16", "fp16")
#: a precision's torch dtype name (autocast's type; fsdp's matching compute_dtype)
PRECISION_TORCH = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: ``--progress``: a terminal bar per job, JSON lines (what the dashboard follows), or nothing.
PROGRESS_MODES = ("bar", "json", "none")
#: ``--model MODULE:FUNCTION``: a user's own model (a function returning a ``dpcore.Workload``).
MODEL_SPEC = "MODULE:FUNCTION"
_SPEC_RE = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*)")


def model_size_text(cfg: dict[str, Any]) -> str:
    """A run's model size in its own knob's words: 'width 256' for mlp (``--width``; ``--size``
    applies to the transformer only, so an mlp run's recorded ``size`` says nothing), the size
    for the transformer, '' for others (einsum, a user's module) or when not recorded."""
    model = cfg.get("model")
    if model == "mlp":
        width = cfg.get("width")
        return f"width {width}" if isinstance(width, int) and not isinstance(width, bool) else ""
    if model == "transformer":
        return str(cfg.get("size") or "")
    return ""


def is_model_spec(name: str) -> bool:
    """True for ``MODULE:FUNCTION`` (a user's model), False for a built-in model name."""
    return ":" in name


def parse_model_spec(text: str) -> tuple[str, str]:
    """'pkg.mod:build' -> ('pkg.mod', 'build'); torch-free so the CLI can check it cheaply."""
    m = _SPEC_RE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"bad --model {text!r}; use {MODEL_SPEC} with a dotted module name and "
                         "a function name, e.g. my_model:build")
    return m.group(1), m.group(2)


def check_model_name(name: str, extra: tuple[str, ...] = ()) -> None:
    """Accept a built-in model (``MODELS`` + ``extra``) or a well-formed ``MODULE:FUNCTION``."""
    if is_model_spec(name):
        parse_model_spec(name)
    elif name not in MODELS + extra:
        raise UsageError(f"--model must be one of {', '.join(MODELS + extra)} or {MODEL_SPEC}, "
                         f"got {name!r}")


#: Most training steps (and warm-up steps) of one job: a million steps of a millisecond each are
#: already a quarter of an hour, and steps.csv holds a row per rank and step.
MAX_STEPS = 1_000_000
#: Most timed repeats per message size of ``allreduce`` (a million 1-KB all-reduces take minutes).
MAX_REPEATS = 1_000_000
#: Calibration steps get indices CAL_STEP_BASE + 1000·plan + step in the recorder: below 1000.
MAX_CALIBRATION_STEPS = 100


#: ``--warmup``, declared once: the untimed steps of a job (TrainConfig) and the untimed calls per
#: size of ``allreduce`` (:class:`~dpcore.contract.options.AllreduceOptions`) are the same idea.
WARMUP = OptionSpec(flag="--warmup", type=int,
                    help="untimed steps (allreduce: calls per size) before the timed ones, 0 or more "
                         "(default %(default)s)")
#: A built-in model's own global batch where ``--batch-size`` is not given (einsum: docs/DESIGN.md's
#: b, ``dpcore.write.training.models.EINSUM_BATCH``); the others take TrainConfig's.
MODEL_BATCH_SIZES = {"einsum": 5120}


@dataclass(frozen=True)
class TrainConfig:
    """How one training job runs. ``batch_size`` is per rank for weak scaling and global for
    strong scaling (the global batch must then divide evenly by the world size)."""

    model: str = option(
        "mlp", flag="--model",
        help=f"one of {', '.join(MODELS)}, or MODULE:FUNCTION: your own model, FUNCTION() in MODULE (found "
             "in the current directory or on PYTHONPATH) returning a dpcore.Workload(model, make_batch, "
             "loss_fn) (default %(default)s)")
    #: transformer size
    size: str = option("tiny", flag="--size",
                       help=f"transformer size: {', '.join(SIZES)} (ignored for MODULE:FUNCTION) "
                            "(default %(default)s)")
    #: mlp hidden width
    width: int = option(512, flag="--width", type=int,
                        help="mlp hidden width (ignored for MODULE:FUNCTION) (default %(default)s)")
    batch_size: int = option(
        32, flag="--batch-size", type=int,
        help="per-rank batch (weak scaling) or global batch (strong); default 32, einsum 5120 "
             "(docs/DESIGN.md's b), MODULE:FUNCTION its Workload.batch_size or 32")
    scaling: str = option("weak", flag="--scaling",
                          help="weak (fixed per-rank batch) or strong (fixed global batch) (default %(default)s)")
    steps: int = option(10, flag="--steps", type=int,
                        help="steps each job trains (profile: the timed ones, after --warmup) (default %(default)s)")
    warmup: int = option(3, spec=WARMUP)
    #: 0 == no trace
    profile_steps: int = option(
        3, flag="--profile-steps", type=int,
        help="steps traced by torch.profiler after the timed ones, 0: none (default %(default)s)")
    bucket_mb: float = option(25.0, flag="--bucket-mb", type=float,
                              help="gradient bucket cap in MiB of the bucketed variants (default %(default)g)")
    lr: float = option(0.01, flag="--lr", type=float, help="learning rate (default %(default)g)")
    seed: int = option(0, flag="--seed", type=int,
                       help="seed of the model's weights and the data, the same in every variant "
                            "(default %(default)s)")
    #: ``auto`` is resolved where the device is known: by the command before run.json is
    #: written, else by the trainer
    dtype: str = option("auto", flag="--dtype", help=DTYPE_HELP)
    #: whether float32 matmuls and convolutions on a GPU may use TF32 (torch's own switches,
    #: set on every rank; no effect on CPU): recorded because it changes fp32 speed and results
    tf32: bool = False
    #: torch.optim.SGD / Adam / AdamW with ``lr``
    optimizer: str = option(
        "sgd", flag="--optimizer", choices=OPTIMIZERS,
        help="torch.optim class of every variant: sgd (default), adam, adamw. SGD keeps no state, so "
             "ZeRO-1's saving (zero1, torch_zero1) only shows with adam/adamw")
    #: fsdp only: all-gather and compute in this dtype (one of COMPUTE_DTYPES), "" = the
    #: job's: a bf16 / fp16 job's half type (fsdp and torch_fsdp), float32 for fp32.
    compute_dtype: str = ""
    #: untimed steps per bucket plan of the what-if calibration that follows a 2+-rank
    #: bucketed/torch_ddp job's measured steps (0: none; docs/DESIGN.md)
    calibration_steps: int = option(
        4, flag="--calibration-steps", type=int,
        help="untimed steps per bucket plan of the what-if calibration after each 2+-rank "
             "bucketed/torch_ddp job (0: none) (default %(default)s)")
    #: torch_ddp only: PowerSGD's matrix rank. Which comm hook a job runs is the job's
    #: (``JobSpec.comm_hook``, one job per hook), handed to the trainer with it.
    powersgd_rank: int = option(1, flag="--powersgd-rank", type=int,
                                help="PowerSGD's matrix approximation rank (default %(default)s)")

    def __post_init__(self) -> None:
        """Refuse a config no job can run: one line naming the option and its valid values."""
        if self.model not in VERIFY_MODELS:
            check_model_name(self.model)
        if self.model == "transformer":
            check_choices((self.size,), "size", SIZES)
        check_int("--width", self.width, 1)
        check_int("--batch-size", self.batch_size, 1)
        check_choices((self.scaling,), "scaling mode", SCALING)
        check_int("--steps", self.steps, 1)
        check_at_most("--steps", self.steps, MAX_STEPS, "steps.csv holds a row per rank and step")
        check_int("--warmup", self.warmup, 0)
        check_at_most("--warmup", self.warmup, MAX_STEPS, "warm-up steps run before the timed ones")
        check_int("--calibration-steps", self.calibration_steps, 0)
        if self.calibration_steps > MAX_CALIBRATION_STEPS:
            raise UsageError(f"--calibration-steps must be from 0 to {MAX_CALIBRATION_STEPS}, "
                             f"got {self.calibration_steps}")
        if self.profile_steps < 0:
            raise profile_steps_error(self.steps, self.profile_steps)
        if not (math.isfinite(self.bucket_mb) and 0 < self.bucket_mb <= MAX_BUCKET_MB):
            raise UsageError(f"--bucket-mb must be a positive number of MB, at most "
                             f"{MAX_BUCKET_MB:.0f}, got {self.bucket_mb:g}")
        if not 0 <= self.seed <= MAX_SEED:
            raise UsageError(f"--seed must be between 0 and {MAX_SEED} (2**63 - 1), got {self.seed}")
        if not (math.isfinite(self.lr) and self.lr >= 0):
            raise UsageError(f"--lr must be a finite number >= 0, got {self.lr:g}")
        check_choices((self.optimizer,), "optimizer", OPTIMIZERS)
        check_choices((self.dtype,), "dtype", DTYPES)
        if self.compute_dtype:
            check_choices((self.compute_dtype,), "compute dtype", COMPUTE_DTYPES)
            if self.dtype in ("bf16", "fp16") and PRECISION_TORCH[self.dtype] != self.compute_dtype:
                raise UsageError(f"fsdp's compute dtype {self.compute_dtype} contradicts --dtype "
                                 f"{self.dtype}; under autocast fsdp computes in "
                                 f"{PRECISION_TORCH[self.dtype]}: give that, or --dtype fp32")
        check_int("--powersgd-rank", self.powersgd_rank, 1)
        params = param_count(self.model, self.size, self.width)
        if params is not None:  # weights + gradients, float32, in one replica at the least
            check_fits(f"--model {self.model}" + (f" --width {self.width}" if self.model == "mlp"
                                                  else f" --size {self.size}"),
                       params * 4 * 2, "choose a smaller model")

    def global_batch(self, world_size: int) -> int:
        return self.batch_size * world_size if self.scaling == "weak" else self.batch_size

    def local_batch(self, world_size: int) -> int:
        gb = self.global_batch(world_size)
        if gb % world_size:
            raise UsageError(f"global batch {gb} is not divisible by world size {world_size}; "
                             "strong scaling splits the batch evenly: choose a batch size that "
                             f"is a multiple of every world size")
        return gb // world_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_UNITS = {"": 1, "B": 1, "KB": 1024, "K": 1024, "MB": 1024**2, "M": 1024**2,
          "GB": 1024**3, "G": 1024**3}


def parse_size(text: str) -> int:
    """'64KB' -> 65536 bytes (binary units, as nccl-tests prints them)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", text.upper())
    if not m:
        raise UsageError(f"bad size {text!r}; use a number with an optional unit B, KB, MB or GB "
                         "(e.g. 1KB,64KB,1MB)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def split_items(text: str, what: str, example: str) -> list[str]:
    """'a,b' -> ['a', 'b'] (stripped). An empty item ('1,,2', a trailing comma, '') is refused,
    not dropped: it is a typo whose intended value is unknown, and silently running fewer
    jobs than were asked for hides it."""
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise UsageError(f"empty item in {what} {text!r}; give comma-separated values like {example}")
    return items


def parse_size_list(text: str) -> tuple[int, ...]:
    """'1KB,64KB' -> (1024, 65536): sizes in bytes, each once, in the order given."""
    return tuple(dict.fromkeys(parse_size(s) for s in split_items(text, "--sizes", "1KB,64KB,1MB")))


def size_text(nbytes: int) -> str:
    """65536 -> '64KB': the largest binary unit that holds ``nbytes`` whole (parse_size's inverse)."""
    for unit in ("GB", "MB", "KB"):
        if nbytes and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return f"{nbytes}B"


def check_int(option: str, value: int | None, minimum: int, note: str = "") -> None:
    """An integer option below its minimum is one line naming the option and the range
    (None: not given, nothing to check)."""
    if value is not None and value < minimum:
        raise UsageError(f"{option} must be >= {minimum}{note}, got {value}")


def check_at_most(option: str, value: int | None, maximum: int, why: str) -> None:
    """An integer option above its maximum is one line naming the option, the range and why
    (a count no run reaches before ``--timeout`` would only run until it)."""
    if value is not None and value > maximum:
        raise UsageError(f"{option} must be at most {maximum:,} ({why}), got {value}")


def check_int_list(values: Iterable[int], what: str, minimum: int = 1, text: str | None = None) -> None:
    """Every value >= ``minimum`` and at least one; ``text``: how the user wrote them."""
    vals = list(values)
    if not vals or min(vals) < minimum:
        shown = text if text is not None else ",".join(map(str, vals))
        raise UsageError(f"{what} must be integers >= {minimum}, got {shown!r}")


def parse_int_list(text: str, what: str, minimum: int = 1) -> list[int]:
    """'1,2,4' -> [1, 2, 4], with a clear error naming ``what``."""
    items = split_items(text, what, "1,2,4")
    try:
        vals = [int(v) for v in items]
    except ValueError:
        raise UsageError(f"bad {what} {text!r}; expected comma-separated integers like 1,2,4") from None
    check_int_list(vals, what, minimum, text)
    return list(dict.fromkeys(vals))  # a repeated value would run the same job twice


def check_choices(values: Iterable[str], what: str, valid: tuple[str, ...], all_ok: bool = False,
                  text: str | None = None) -> None:
    """Refuse unknown names (or none at all) with the valid choices; ``all_ok``: the option
    also takes ``all``; ``text``: how the user wrote them (shown when none were given)."""
    vals = list(values)
    bad = [v for v in vals if v not in valid]
    if bad or not vals:
        raise UsageError(f"unknown {what} {', '.join(map(str, bad)) or repr(text or '')}; valid "
                         f"choices: {', '.join(valid)}" + (" or all" if all_ok else ""))


def parse_choices(text: str, what: str, valid: tuple[str, ...], all_ok: bool = True) -> list[str]:
    """'a,b' or 'all' -> list, rejecting unknown names with the valid choices."""
    if all_ok and text.strip() == "all":
        return list(valid)
    vals = list(dict.fromkeys(split_items(text, what, ",".join(valid[:2]))))
    check_choices(vals, what, valid, all_ok, text)
    return vals


def check_bucket_sweep(values: Iterable[float], shown: Iterable[str] | None = None) -> None:
    """Every bucket size of a sweep finite and > 0 MB (``shown``: as the user wrote them)."""
    vals = list(values)
    for mb, item in zip(vals, shown if shown is not None else map(str, vals)):
        if not (math.isfinite(mb) and 0 < mb <= MAX_BUCKET_MB):
            raise UsageError(f"bad --bucket-sweep value {item!r}; use positive MB up to "
                             f"{MAX_BUCKET_MB:.0f} like 1,10,25,100")


def parse_bucket_sweep(text: str) -> tuple[float, ...]:
    """'1,10,25' (MB) or sizes with units ('512KB,4MB') -> MB, all finite and > 0."""
    items = split_items(text, "--bucket-sweep", "1,10,25,100") if text.strip() else []
    out = []
    for item in items:
        try:
            mb = parse_size(item) / 2**20 if item.upper().endswith("B") else float(item)
        except (ValueError, UsageError):
            mb = float("nan")
        out.append(mb)
    check_bucket_sweep(out, items)
    return tuple(dict.fromkeys(out))


#: Longest accepted ``--inject-delay`` sleep (ms): a straggler, not a hang.
MAX_DELAY_MS = 60_000


def parse_delay(text: str) -> tuple[int, float]:
    """'1:20' -> (rank 1, 20.0 ms). Whether the sleep is in range and the rank exists is
    ``ProfileOptions``'s check (it knows the world sizes)."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+(?:\.\d+)?)\s*", text or "")
    if not m:
        raise UsageError(f"bad --inject-delay {text!r}; use RANK:MS, e.g. 1:20 (rank 1 sleeps 20 ms "
                         "in its forward every step)")
    return int(m.group(1)), float(m.group(2))


#: ``--inject-hang`` modes: skip one all-reduce (a desync), or sleep forever (a missing rank)
HANG_MODES = ("skip", "sleep")


def parse_hang(text: str) -> tuple[int, int, str]:
    """'1:3' -> (rank 1, step 3, 'skip'); '1:3:sleep' -> (1, 3, 'sleep'). Whether the rank and
    the step exist is ``ProfileOptions``'s check."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*(?::\s*(\w+)\s*)?", text or "")
    if not m or (m.group(3) or "skip") not in HANG_MODES:
        raise UsageError(f"bad --inject-hang {text!r}; use RANK:STEP (rank skips one all-reduce "
                         "at that timed step: a desync) or RANK:STEP:sleep (it sleeps forever "
                         "there), e.g. 1:3 or 1:3:sleep")
    return int(m.group(1)), int(m.group(2)), m.group(3) or "skip"


def profile_steps_error(steps: int, got: int) -> UsageError:
    """The one message for a --profile-steps outside 1..--steps."""
    return UsageError(f"--profile-steps must be between 1 and --steps ({steps}), got {got}; "
                      "use --no-trace to skip tracing")


#: Longest accepted job timeout (seconds): beyond it c10d's millisecond timeouts overflow.
MAX_TIMEOUT_S = 1e6
#: Shortest accepted job timeout (seconds): below it no rank can even join the rendezvous
#: (forking a rank and connecting to the store take ~0.1-1 s), so every job would fail with
#: c10d's C++ frames instead of a measurement.
MIN_TIMEOUT_S = 1.0
#: How long a job may run before it is killed and reported, unless --timeout says otherwise.
DEFAULT_TIMEOUT_S = 300.0


def check_timeout(timeout_s: float, option: str = "--timeout") -> float:
    """A job timeout must be a finite number of seconds in [MIN_TIMEOUT_S, MAX_TIMEOUT_S]: less
    makes every rendezvous fail at once with pages of c10d C++ frames, and nan/inf overflow it.
    One rule for the command options (before anything runs) and the launcher (library callers)."""
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s)
            and MIN_TIMEOUT_S <= timeout_s <= MAX_TIMEOUT_S):
        raise UsageError(f"{option} must be a number of seconds > 0, from {MIN_TIMEOUT_S:g} to "
                         f"{MAX_TIMEOUT_S:.0f}, got {timeout_s:g}")
    return float(timeout_s)


def check_backend(backend: str) -> None:
    """One of :data:`BACKENDS` (whether nccl has its GPUs is the launcher's question)."""
    if backend not in BACKENDS:
        raise choices_error("backend", backend, BACKENDS)


#: A run id starts with a letter or digit: listings hide folders starting with '.' or '_'
#: (the dashboard's own), so a run named '_x' would be written and never shown.
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def check_run_id(run_id: str | None) -> None:
    """Run ids become folder names under --out: letters, digits, '-', '_' and '.' only."""
    if run_id is not None and not _RUN_ID_RE.fullmatch(run_id):
        raise UsageError(f"bad --run-id {run_id!r}; use letters, digits, '-', '_' and '.' "
                         "(no slashes), starting with a letter or digit, e.g. my-run-1")


def default_of(cls: type, name: str) -> Any:
    """The default of field ``name`` of dataclass ``cls`` (how the CLI takes its defaults)."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
    raise KeyError(f"{cls.__name__} has no default for {name!r}")
