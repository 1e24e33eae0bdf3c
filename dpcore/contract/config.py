"""Frozen configuration objects (saved verbatim to run.json) and size parsing."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from dpcore.contract.errors import UsageError

# DESIGN.md's fixed names, in one torch-free place (the CLI and the app import them cheaply;
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
SINGLE_PROCESS = ("single", "manual", "data_parallel")
#: The variant of a job that ``dpcore import`` made from foreign traces. Its world size counts
#: the ranks imported, not the ranks of the job that wrote them (one rank of eight: 1).
IMPORTED = "imported"
#: variants whose job id carries the bucket size (zero1 / torch_zero1 average gradients in
#: bucketed / DDP buckets)
BUCKET_SENSITIVE = ("bucketed", "torch_ddp", "zero1", "torch_zero1")
ALGOS = ("native", "ring", "naive", "central")
MODELS = ("mlp", "transformer", "einsum")
SIZES = ("tiny", "small", "medium", "large", "xl", "2.7B")
SCALING = ("weak", "strong")
#: ``--model MODULE:FUNCTION``: a user's own model (a function returning a ``dpcore.Workload``).
MODEL_SPEC = "MODULE:FUNCTION"
_SPEC_RE = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*)")


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


@dataclass(frozen=True)
class TrainConfig:
    """How one training job runs. ``batch_size`` is per rank for weak scaling and global for
    strong scaling (the global batch must then divide evenly by the world size)."""

    model: str = "mlp"
    size: str = "tiny"          # transformer size
    width: int = 512            # mlp hidden width
    batch_size: int = 32
    scaling: str = "weak"
    steps: int = 10
    warmup: int = 3
    profile_steps: int = 3      # 0 == no trace
    bucket_mb: float = 25.0
    lr: float = 0.01
    seed: int = 0
    dtype: str = "float32"
    #: ``--inject-delay RANK:MS``: rank RANK sleeps MS ms in its forward every step, to show
    #: what a straggler looks like (-1: nobody).
    delay_rank: int = -1
    delay_ms: float = 0.0
    #: ``--optimizer``: one of OPTIMIZERS (torch.optim.SGD / Adam / AdamW with ``lr``).
    optimizer: str = "sgd"
    #: fsdp only: all-gather and compute in this dtype (one of COMPUTE_DTYPES), "" = float32.
    compute_dtype: str = ""

    def global_batch(self, world_size: int) -> int:
        return self.batch_size * world_size if self.scaling == "weak" else self.batch_size

    def local_batch(self, world_size: int) -> int:
        gb = self.global_batch(world_size)
        if gb % world_size:
            raise UsageError(f"global batch {gb} is not divisible by world size {world_size}; "
                             "strong scaling splits the batch evenly: choose a batch size that "
                             f"is a multiple of every world size")
        return gb // world_size

    def to_dict(self) -> dict:
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


def parse_int_list(text: str, what: str, minimum: int = 1) -> list[int]:
    """'1,2,4' -> [1, 2, 4], with a clear error naming ``what``."""
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"bad {what} {text!r}; expected comma-separated integers like 1,2,4") from None
    if not vals or min(vals) < minimum:
        raise UsageError(f"{what} must be integers >= {minimum}, got {text!r}")
    return list(dict.fromkeys(vals))  # a repeated value would run the same job twice


def parse_choices(text: str, what: str, valid: tuple[str, ...], all_ok: bool = True) -> list[str]:
    """'a,b' or 'all' -> list, rejecting unknown names with the valid choices."""
    if all_ok and text.strip() == "all":
        return list(valid)
    vals = [v.strip() for v in text.split(",") if v.strip()]
    vals = list(dict.fromkeys(vals))
    bad = [v for v in vals if v not in valid]
    if bad or not vals:
        raise UsageError(f"unknown {what} {', '.join(bad) or repr(text)}; valid choices: "
                         f"{', '.join(valid)}" + (" or all" if all_ok else ""))
    return vals


def parse_bucket_sweep(text: str) -> tuple[float, ...]:
    """'1,10,25' (MB) or sizes with units ('512KB,4MB') -> MB, all finite and > 0."""
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            mb = parse_size(item) / 2**20 if item.upper().endswith("B") else float(item)
        except (ValueError, UsageError):
            mb = float("nan")
        if not (math.isfinite(mb) and mb > 0):
            raise UsageError(f"bad --bucket-sweep value {item!r}; use positive MB like 1,10,25,100")
        out.append(mb)
    return tuple(dict.fromkeys(out))


def parse_delay(text: str, world_size: int) -> tuple[int, float]:
    """'1:20' -> (rank 1, 20.0 ms), with a clear error naming the valid ranks."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+(?:\.\d+)?)\s*", text or "")
    if not m:
        raise UsageError(f"bad --inject-delay {text!r}; use RANK:MS, e.g. 1:20 (rank 1 sleeps 20 ms "
                         "in its forward every step)")
    rank, ms = int(m.group(1)), float(m.group(2))
    if rank >= world_size:
        raise UsageError(f"--inject-delay rank {rank} does not exist; valid ranks: 0..{world_size - 1}")
    if not 0 < ms <= 60_000:
        raise UsageError(f"--inject-delay must sleep between 0 and 60000 ms, got {ms:g}")
    return rank, ms


#: Longest accepted job timeout (seconds): beyond it c10d's millisecond timeouts overflow.
MAX_TIMEOUT_S = 1e6


def check_timeout(timeout_s: float, option: str = "--timeout") -> float:
    """A job timeout must be a finite number of seconds in (0, MAX_TIMEOUT_S]: 0 or less makes
    every rendezvous fail at once with pages of c10d C++ frames, and nan/inf overflow it.
    One rule for the CLI (before anything runs) and the launcher (library callers)."""
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s)
            and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise UsageError(f"{option} must be a number of seconds > 0 and <= {MAX_TIMEOUT_S:.0f}, "
                         f"got {timeout_s:g}")
    return float(timeout_s)
