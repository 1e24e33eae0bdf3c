"""Every command of ``python -m dpcore``, declared once: its name and help, its frozen options
class, and the function that runs it (:data:`COMMANDS`).

Why a table: the CLI's parser, its dispatch and docs/cli.md's option tables are all generated
from it, so a command is added by declaring it here and writing its run function; nothing
copies an option from the parser into an options object by hand (each class builds itself,
:meth:`~dpcore.contract.options.CommandOptions.from_args`).

This module imports only the contract at load time (``--help`` and the option tables stay
cheap): a command's run function is named as ``"module:function"`` and imported when the
command runs. The few run functions here glue a write-wing command to the read wing's end
table (the write wing never imports the read wing).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from dpcore.contract.config import TrainConfig
from dpcore.contract.options import (
    VERIFY_TRAIN,
    AllreduceOptions,
    AnalyzeOptions,
    CommandOptions,
    GpuOptions,
    HangOptions,
    ImportOptions,
    OptionGroup,
    ProfileOptions,
    StragglersOptions,
    SummarizeOptions,
    VerifyOptions,
    WhatifOptions,
)

#: What a command does with its run function's result: ``job`` returns the exit code itself;
#: ``read`` returns exactly what the CLI prints (its bad input, a damaged run included, is one
#: line and exit 2); ``import`` returns what is printed too, and writes a run.
Kind = Literal["job", "read", "import"]


@dataclass(frozen=True)
class Command:
    """One command: what ``--help`` says of it, its options class and how it runs.

    ``run``: ``"module:function"`` (or the function itself), taking the options object. ``train``: options
    it takes from TrainConfig's fields (their one declaration) before its own; ``helps``: its own
    wording of a shared option; ``prepare``: ``"module:function"`` given the parsed namespace
    before the options are built (profile loads a user's workload there, once, and takes its
    batch). ``writes``: it writes a run, so an unexpected error says the finished jobs were kept."""

    name: str
    help: str
    options: type[CommandOptions]
    run: str | Callable[..., Any]
    kind: Kind = "read"
    description: str | None = None
    train: OptionGroup | None = None
    helps: dict[str, str] = field(default_factory=dict)
    prepare: str | Callable[..., Any] | None = None
    writes: bool = False

    @property
    def groups(self) -> tuple[OptionGroup, ...]:
        """The option groups of the parser and the option tables, in ``--help``'s order."""
        own = OptionGroup(self.options, helps=self.helps)
        return (self.train, own) if self.train is not None else (own,)

    def function(self) -> Callable[..., Any]:
        """The run function (imported now: only the command that runs loads its wing)."""
        return resolve(self.run)


def resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    """``"module:function"`` -> the function (a function is itself)."""
    if callable(target):
        return target
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


# --- run functions that join a write-wing command to the read wing's table ---------------------

@contextlib.contextmanager
def reader_may_be_gone() -> Iterator[None]:
    """A run's end table into a closed pipe (``profile | head``): the run is on disk already,
    so its exit status is the run's, not a silent 0; stdout goes to /dev/null from here."""
    try:
        yield
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _status(code: int) -> str:
    return {0: "complete", 130: "interrupted"}.get(code, "failed")


def prepare_profile(args: Any) -> None:
    """Before ``profile``'s options are built: for MODULE:FUNCTION, load the workload here, once
    (import, FUNCTION(), a 2 x world-size batch, one forward + loss, within ``--timeout``), so
    every mistake in it is one line and exit 2 before any rank starts or any run directory
    exists; a ``--batch-size`` left out is then its Workload's."""
    from dpcore.contract.config import check_timeout, is_model_spec
    from dpcore.contract.limits import check_world_sizes

    if not is_model_spec(args.model):
        return
    given = ProfileOptions.values_of(args)
    check_world_sizes(given["world_sizes"], "--world-sizes")  # before the 2 x world-size batch
    from dpcore.write.training.workload import check_workload

    workload = check_workload(args.model, args.seed, given["world_sizes"], check_timeout(given["timeout_s"]))
    if args.batch_size is None:
        args.batch_size = getattr(workload, "batch_size", None)


def run_profile_command(opts: ProfileOptions) -> int:
    """``profile``: the jobs, then the end-of-run table (the dashboard's numbers) and status."""
    from dpcore.write.commands.profile import run_profile

    code, run_dir = run_profile(opts, list(opts.command))
    if run_dir is not None and opts.progress != "json":
        from dpcore.read.report.summarize import run_end_table

        table, failed = run_end_table(str(run_dir))
        with reader_may_be_gone():
            print(table, flush=True)
        print(f"\nrun {_status(code)}: {run_dir}" + (f" ({failed} job(s) failed; see run.json)" if failed else ""),
              file=sys.stderr)
    return code


def run_allreduce_command(opts: AllreduceOptions) -> int:
    """``allreduce``: the jobs, then the table through the read wing (what ``summarize`` prints)."""
    from dpcore.write.commands.allreduce import run_allreduce

    code, run_dir = run_allreduce(opts, list(opts.command))
    if run_dir is not None and opts.progress != "json":
        from dpcore.read.report.allreduce import allreduce_text

        with reader_may_be_gone():
            print(allreduce_text(str(run_dir)), end="", flush=True)
        print(f"\nrun {_status(code)}: {run_dir}", file=sys.stderr)
    return code


def run_verify_command(opts: VerifyOptions) -> int:
    """``verify``: the table, exit 1 when a variant differs. A user's MODULE:FUNCTION is loaded
    once here first (a mistake in it is one line), and sizes the buckets."""
    from dpcore.contract.config import is_model_spec
    from dpcore.write.commands.verify import format_table, spec_bucket_mb, verify, verify_config

    given: dict[str, Any] = {k: getattr(opts, k) for k in ("batch_size", "lr") if getattr(opts, k) is not None}
    if is_model_spec(opts.model):
        from dpcore.write.training.workload import check_workload

        workload = check_workload(opts.model, opts.seed, (opts.world_size,), opts.timeout_s)
        given["bucket_mb"] = spec_bucket_mb(workload.model)
    cfg = verify_config(opts.model, opts.steps, size=opts.size, width=opts.width, seed=opts.seed,
                        optimizer=opts.optimizer, **given)
    rows, ok = verify(opts, cfg)
    print(format_table(rows))
    return 0 if ok else 1


# --- the table ---------------------------------------------------------------------------------

#: ``batch_size`` None: the model's own batch (a Workload's, einsum's b, else TrainConfig's).
_PROFILE_TRAIN = OptionGroup(TrainConfig, defaults={"batch_size": None})
#: verify's learning rate and batch are the model's; its model and steps are VerifyOptions'.
_VERIFY_TRAIN = OptionGroup(TrainConfig, only=VERIFY_TRAIN,
                            defaults={"model": VerifyOptions.model, "steps": VerifyOptions.steps, "lr": None,
                                      "batch_size": None},
                            helps={"lr": "learning rate (default the model's)"})
_RUN_HELP = "a run directory (profiles/<run_id>)"

#: Every command, in ``--help``'s order. The CLI builds one subparser per entry and runs
#: ``resolve(run)(options.from_args(args))``; scripts/option_tables.py writes docs/cli.md from it.
COMMANDS: tuple[Command, ...] = (
    Command("verify", "prove every variant trains exactly like single-process", VerifyOptions,
            "dpcore.commands:run_verify_command", kind="job", train=_VERIFY_TRAIN, writes=True,
            helps={"comm_hooks": "also train torch_ddp with these DDP comm hooks: rows torch_ddp[<hook>], "
                                 "reported as lossy with their difference; none = DDP's plain all-reduce, "
                                 "the torch_ddp row itself (default %(default)s)"}),
    Command("profile", "profile variants x world sizes into a run directory", ProfileOptions,
            "dpcore.commands:run_profile_command", kind="job", train=_PROFILE_TRAIN,
            prepare="dpcore.commands:prepare_profile", writes=True),
    Command("allreduce", "all-reduce bandwidth benchmark (nccl-tests style)", AllreduceOptions,
            "dpcore.commands:run_allreduce_command", kind="job", writes=True,
            description="Time every all-reduce algorithm at every world size and message size (float32, sum) "
                        "and check each result, like nccl-tests' #wrong; the table (repeats, median time, algbw, "
                        "busbw = algbw * 2(N-1)/N, #wrong) is printed and written as a run that the dashboard's "
                        "Bandwidth and Ring messages views open. Under torchrun it runs on torchrun's ranks (its "
                        "one world size).",
            helps={"world_sizes": "comma-separated numbers of ranks; one job per (algorithm, world size) "
                                  "(default %(default)s)",
                   "warmup": "untimed all-reduce calls per size before the timed ones (default %(default)s)"}),
    Command("analyze", "overlap per rank of a run or a folder of traces", AnalyzeOptions,
            "dpcore.read.report.analyze:analyze_command"),
    Command("gpu", "GPU time ledger per rank: compute, non-compute, idle and why the GPU idled", GpuOptions,
            "dpcore.read.report.gpu:gpu_command",
            description="The GPU time ledger of every rank (HTA's temporal breakdown on exact timestamps): span, "
                        "compute, non-compute, communication, memory and idle time, idle split into host (the CPU "
                        "launched late: what it was doing) and device.",
            helps={"path": "a run directory, a job's traces folder, any folder of GPU traces or one trace",
                   "csv": "CSV rows (job_id first) instead of the text tables"}),
    Command("summarize", "per-job table of a run", SummarizeOptions, "dpcore.read.report.summarize:summarize_command",
            helps={"run": _RUN_HELP}),
    Command("stragglers", "which rank arrives last at the collectives, per job and rank", StragglersOptions,
            "dpcore.read.report.stragglers:stragglers_command"),
    Command("hang", "why a job hung: every rank's last collectives (PyTorch's flight recorder) and stack, "
                    "and the verdict", HangOptions, "dpcore.read.report.hang:hang_command",
            helps={"path": "a run, a job's hang/<job_id>/ folder, or a folder of flight-recorder dumps written "
                           "by any PyTorch job"}),
    Command("whatif", "predict a bucketed/torch_ddp job's step time at other buckets, world sizes and networks "
                      "(trace-driven replay)", WhatifOptions, "dpcore.read.report.whatif:whatif_command",
            helps={"csv": "the table as CSV rows (every column, docs/DESIGN.md's whatif columns first) instead of "
                          "the text",
                   "world_sizes": "world sizes to predict for, e.g. 1,2,8 (default: the run's)"}),
    Command("import", "turn a folder of torch.profiler traces into a run directory", ImportOptions,
            "dpcore.read.report.importer:import_command", kind="import", writes=True),
)

#: Each command's option groups by name (what the parser and the option tables read).
COMMAND_OPTIONS: dict[str, tuple[OptionGroup, ...]] = {c.name: c.groups for c in COMMANDS}
