"""Command line: ``python -m dpcore <command>``.

Commands that run jobs and write a run: ``profile``, ``allreduce``; ``verify`` checks that every
variant trains like ``single``. Commands that read runs and traces: ``analyze``, ``summarize``,
``stragglers``, ``whatif``, ``gpu``; ``import`` turns foreign torch.profiler traces into a run.

Bad input never produces a traceback: :class:`UsageError` becomes ``error: <one line>`` and
exit status 2. The CLI computes nothing itself; it parses text into values and calls the
modules the dashboard calls too, so both show the same numbers. Validation is not here: the
options objects (:mod:`dpcore.contract.options`) refuse bad values when they are built, and the
options of ``profile``, ``allreduce`` and ``verify`` are generated from their fields
(:func:`add_options`, :data:`~dpcore.contract.options.COMMAND_OPTIONS`).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dpcore.contract.config import (
    MODELS,
    TrainConfig,
    check_timeout,
    default_of,
    is_model_spec,
)
from dpcore.contract.errors import UsageError
from dpcore.contract.limits import check_world_sizes
from dpcore.contract.option_fields import field_default, option_fields, option_values
from dpcore.contract.options import (
    COMMAND_OPTIONS,
    AllreduceOptions,
    OptionGroup,
    ProfileOptions,
    ScaleOptions,
    VerifyOptions,
)
from dpcore.contract.procs import stop_helpers

if TYPE_CHECKING:  # the read wing loads only for the read commands
    from dpcore.read.ranks import Scale


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage + exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def add_options(p: argparse.ArgumentParser, command: str) -> None:
    """Every option of ``command`` (:data:`~dpcore.contract.options.COMMAND_OPTIONS`) as an
    argument of ``p``: the field's flag, help, metavar and choices, the default as the text the
    field's parser reads back."""
    for group in COMMAND_OPTIONS[command]:
        add_group(p, group)


def add_group(p: argparse.ArgumentParser, group: OptionGroup) -> None:
    """The options of one :class:`~dpcore.contract.options.OptionGroup` as arguments of ``p``."""
    for f, spec in option_fields(group.cls):
        if group.only is not None and f.name not in group.only:
            continue
        help_text = group.helps.get(f.name, spec.help) or None
        if spec.positional:  # argparse names a positional by its flag, which is the field's name
            extra: dict[str, object] = {"nargs": "?", "default": field_default(f)} if spec.optional else {}
            p.add_argument(spec.flag, help=help_text, **extra)  # type: ignore[arg-type]
            continue
        if spec.negate or spec.switch:
            p.add_argument(spec.flag, dest=f.name, action="store_true", help=help_text)
            continue
        default = group.defaults[f.name] if f.name in group.defaults else field_default(f)
        kwargs: dict[str, object] = {"dest": f.name, "default": spec.default_text(default), "help": help_text}
        if spec.type is not None:
            kwargs["type"] = spec.type
        if spec.choices is not None:  # argparse shows them: {sgd,adam,adamw}
            kwargs["choices"] = spec.choices
        else:
            kwargs["metavar"] = spec.shown_metavar()
        p.add_argument(spec.flag, **kwargs)  # type: ignore[arg-type]


def prog_name(argv0: str | None = None) -> str:
    """How the user invoked dpcore, for usage lines: ``python -m dpcore`` (``__main__.py``) or
    the console script's name (``dpcore``), so the help's commands can be pasted as shown."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    return "python -m dpcore" if name in ("__main__.py", "-m", "-c", "") else name


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    ap = _Parser(prog=prog or prog_name(), description="Profile data-parallel training variants.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    v = sub.add_parser("verify", help="prove every variant trains exactly like single-process")
    add_options(v, "verify")

    p = sub.add_parser("profile", help="profile variants x world sizes into a run directory")
    add_options(p, "profile")

    a = sub.add_parser("allreduce", help="all-reduce bandwidth benchmark (nccl-tests style)",
                       description="Time every all-reduce algorithm at every world size and message size "
                                   "(float32, sum) and check each result, like nccl-tests' #wrong; the table "
                                   "(repeats, median time, algbw, busbw = algbw * 2(N-1)/N, #wrong) is printed and "
                                   "written as a run that the dashboard's Bandwidth and Ring messages views open. "
                                   "Under torchrun it runs on torchrun's ranks (its one world size).")
    add_options(a, "allreduce")

    z = sub.add_parser("analyze", help="overlap per rank of a run or a folder of traces")
    add_options(z, "analyze")

    gp = sub.add_parser("gpu", help="GPU time ledger per rank: compute, non-compute, idle and why the GPU idled",
                        description="The GPU time ledger of every rank (HTA's temporal breakdown on exact "
                                    "timestamps): span, compute, non-compute, communication, memory and idle time, "
                                    "idle split into host (the CPU launched late: what it was doing) and device.")
    add_options(gp, "gpu")

    s = sub.add_parser("summarize", help="per-job table of a run")
    add_options(s, "summarize")

    g = sub.add_parser("stragglers", help="which rank arrives last at the collectives, per job and rank")
    add_options(g, "stragglers")

    h = sub.add_parser("hang", help="why a job hung: every rank's last collectives (PyTorch's flight "
                                    "recorder) and stack, and the verdict")
    add_options(h, "hang")

    w = sub.add_parser("whatif", help="predict a bucketed/torch_ddp job's step time at other buckets, "
                                      "world sizes and networks (trace-driven replay)")
    add_options(w, "whatif")

    i = sub.add_parser("import", help="turn a folder of torch.profiler traces into a run directory")
    add_options(i, "import")
    return ap


def _scale(args: argparse.Namespace) -> Scale:
    """The Scale of --workers / --scheduler / --no-cache; UsageError for a bad --workers."""
    from dpcore.read.ranks import Scale
    given = option_values(args, ScaleOptions)
    workers = given["workers"]
    if workers is not None:
        try:
            workers = int(workers)
        except ValueError:
            raise UsageError(f"--workers must be a whole number of processes >= 1, got {workers!r}") from None
        if workers < 1:
            raise UsageError(f"--workers must be a whole number of processes >= 1, got {workers}")
    try:
        return Scale(workers=workers, scheduler=given["scheduler"] or None, cache=given["cache"])
    except ValueError as exc:  # a bad --scheduler address
        raise UsageError(str(exc)) from None


def _load_workload(model: str, seed: int, world_sizes: tuple[int, ...],
                   timeout_s: float) -> object | None:
    """For MODULE:FUNCTION, load the workload here, once, in this process (import, FUNCTION(),
    a 2 x world-size batch, one forward + loss), so every mistake in it is one line and exit 2
    before any rank starts or any run directory exists; within the job ``--timeout``, so one
    that never returns is refused too. None for a built-in model."""
    if not is_model_spec(model):
        return None
    from dpcore.write.training.workload import check_workload

    return check_workload(model, seed, world_sizes, timeout_s)


def _cmd_verify(args: argparse.Namespace) -> int:
    opts = VerifyOptions(model=args.model, steps=args.steps, **option_values(args, VerifyOptions))
    workload = _load_workload(args.model, args.seed, (opts.world_size,), opts.timeout_s)
    from dpcore.write.commands.verify import format_table, run_verify, spec_bucket_mb, verify_config

    given = {k: getattr(args, k) for k in ("batch_size", "lr") if getattr(args, k) is not None}
    if workload is not None:  # already loaded: size the buckets from it, no second FUNCTION()
        given["bucket_mb"] = spec_bucket_mb(workload.model)  # type: ignore[attr-defined]
    cfg = verify_config(args.model, opts.steps, size=args.size, width=args.width, seed=args.seed,
                        optimizer=args.optimizer, **given)
    rows, ok = run_verify(opts.world_size, model=opts.model, steps=opts.steps,
                          variants=list(opts.variants), backend=opts.backend,
                          timeout_s=opts.timeout_s, cfg=cfg, comm_hooks=list(opts.comm_hooks),
                          device=opts.device, dtype=opts.dtype)
    print(format_table(rows))
    return 0 if ok else 1


def _cmd_profile(args: argparse.Namespace, argv: list[str]) -> int:
    given = option_values(args, ProfileOptions)
    world_sizes = given["world_sizes"]
    check_world_sizes(world_sizes, "--world-sizes")  # before the workload's 2 x world-size batch
    workload = _load_workload(args.model, args.seed, world_sizes, check_timeout(given["timeout_s"]))
    batch = args.batch_size
    if batch is None:  # the model's own default: a user's Workload.batch_size, einsum's b
        if workload is not None:
            batch = getattr(workload, "batch_size", None)
        elif args.model in MODELS:
            from dpcore.write.training.models import default_batch_size
            batch = default_batch_size(args.model)
        batch = batch or default_of(TrainConfig, "batch_size")
    train = TrainConfig(**{**option_values(args, TrainConfig), "batch_size": batch,
                           "profile_steps": args.profile_steps if given["trace"] else 0})
    opts = ProfileOptions(train=train, **given)
    from dpcore.write.commands.profile import run_profile

    code, run_dir = run_profile(opts, argv)
    if run_dir is not None and opts.progress != "json":
        _print_run_end(run_dir, code)
    return code


@contextlib.contextmanager
def _reader_may_be_gone() -> Iterator[None]:
    """A run's end table into a closed pipe (``profile | head``): the run is on disk already,
    so its exit status is the run's, not a silent 0; stdout goes to /dev/null from here."""
    try:
        yield
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _print_run_end(run_dir: os.PathLike[str] | str, code: int) -> None:
    """The end-of-run table (the dashboard's numbers: the same analysis functions) and status."""
    from dpcore.read.report.summarize import run_end_table

    table, failed = run_end_table(str(run_dir))
    with _reader_may_be_gone():
        print(table, flush=True)
    status = {0: "complete", 130: "interrupted"}.get(code, "failed")
    print(f"\nrun {status}: {run_dir}" + (f" ({failed} job(s) failed; see run.json)" if failed else ""),
          file=sys.stderr)


def _cmd_allreduce(args: argparse.Namespace, argv: list[str]) -> int:
    opts = AllreduceOptions(**option_values(args, AllreduceOptions))
    from dpcore.write.commands.allreduce import run_allreduce

    code, run_dir = run_allreduce(opts, argv)
    if run_dir is not None and opts.progress != "json":
        # the table through the read wing: the numbers `summarize` prints
        from dpcore.read.report.allreduce import allreduce_text
        with _reader_may_be_gone():
            print(allreduce_text(str(run_dir)), end="", flush=True)
        status = {0: "complete", 130: "interrupted"}.get(code, "failed")
        print(f"\nrun {status}: {run_dir}", file=sys.stderr)
    return code


class _InterruptOnce:
    """A signal handler that raises KeyboardInterrupt the first time only.

    SIGTERM (the dashboard's Stop button, a job scheduler) ends a run like Ctrl-C does:
    finished jobs are kept, the run is marked interrupted and no rank is left behind. Why only
    once: the first interrupt already ends the run; people press Ctrl-C twice, and a second
    KeyboardInterrupt carries no news but lands wherever the ending is (reaping the ranks,
    writing run.json, the interpreter's exit, where torch's and multiprocessing's finalizers
    printed their tracebacks). Later ones are dropped; the process still ends, exit 130."""

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, signum: int, frame: object) -> None:
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt


def run_cli() -> int:
    """``python -m dpcore``: :func:`main` with Ctrl-C and SIGTERM interrupting once
    (:class:`_InterruptOnce`), and none of either while the interpreter exits afterwards: the
    command's outcome (run.json, the exit code) is final by then, and an interrupt inside an
    exit-time finalizer only prints a traceback. (Not in :func:`main`, which tests call in
    their own process, whose Ctrl-C must keep working.)"""
    once = _InterruptOnce()
    signal.signal(signal.SIGINT, once)
    signal.signal(signal.SIGTERM, once)
    code = 130
    try:
        code = main()
    except KeyboardInterrupt:  # landed after main had reported the end: the code says it
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stop_helpers()  # no forkserver or resource tracker left when the command returns
    return code


def _quiet_library_warnings() -> None:
    """The read commands print what a user must know themselves (``warning:`` and ``note:``
    lines naming the file); numpy's and pandas' own warnings (a 0/0 on a damaged run, a
    deprecation) are noise with a source line in it, so they are not shown unless
    DPCORE_DEBUG is set."""
    if not os.environ.get("DPCORE_DEBUG"):
        for category in (RuntimeWarning, FutureWarning, DeprecationWarning, PendingDeprecationWarning):
            warnings.filterwarnings("ignore", category=category)


#: The commands that write a run (an unexpected error may end them with jobs already on disk);
#: the read commands write none, so their errors do not speak of kept jobs.
WRITING = ("profile", "allreduce", "verify", "import")


def main(argv: list[str] | None = None) -> int:
    """Run one command; SIGTERM interrupts it like Ctrl-C (:class:`_InterruptOnce`) while it runs.

    The SIGTERM handler is the command's, not the caller's: an in-process caller (a test, a
    notebook) gets its own handler back when the command returns, so a later SIGTERM does what
    it did before instead of raising a KeyboardInterrupt where no command runs."""
    previous = None  # stays None where run_cli's handler is in place, or off the main thread
    if threading.current_thread() is threading.main_thread() and \
            not isinstance(signal.getsignal(signal.SIGTERM), _InterruptOnce):
        previous = signal.signal(signal.SIGTERM, _InterruptOnce())
    try:
        return _main(argv)
    finally:
        if previous is not None:  # (None also for a handler installed outside Python: kept ours)
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = None
    try:
        args = build_parser().parse_args(argv)
        command = args.command
        if args.command == "verify":
            return _cmd_verify(args)
        if args.command == "profile":
            return _cmd_profile(args, ["python", "-m", "dpcore", *argv])
        if args.command == "allreduce":
            return _cmd_allreduce(args, ["python", "-m", "dpcore", *argv])
        _quiet_library_warnings()  # the read commands (import and those below)
        if args.command == "import":
            from dpcore.read.importer.write_run import import_traces
            from dpcore.read.report.importer import import_text
            print(import_text(import_traces(args.traces, args.out, args.name, iteration=args.iteration,
                                            align=args.align_clocks, command=["python", "-m", "dpcore", *argv],
                                            scale=_scale(args))))
            return 0
        from dpcore.read.report.analyze import analyze
        from dpcore.read.report.summarize import summarize
        from dpcore.read.rundir.load import RunLoadError
        try:
            if args.command == "hang":
                from dpcore.read.report.hang import hang_text
                out = hang_text(args.path, csv=args.csv)
                out = out if args.csv else out.rstrip("\n")
            elif args.command == "stragglers":
                from dpcore.read.report.stragglers import stragglers_text
                out = stragglers_text(args.path, csv=args.csv, scale=_scale(args)).rstrip("\n")
            elif args.command == "gpu":
                from dpcore.read.report.gpu import gpu_tables
                out = gpu_tables(args.path, csv=args.csv, per_step=args.per_step, kernels=args.kernels,
                                 collectives=args.collectives, scale=_scale(args))
                out = out if args.csv else out.rstrip("\n")
            elif args.command == "whatif":
                from dpcore.read.report.whatif import whatif_text
                out = whatif_text(args.run, args.job, args.bucket_mb, args.world_sizes, args.bandwidth_gbps,
                                  args.latency_us, args.algo, args.csv, args.allreduce_run, args.fabric)
                out = out if args.csv else out.rstrip("\n")
            else:
                out = (analyze(args.path, csv=args.csv, scale=_scale(args)) if args.command == "analyze"
                       else summarize(args.run, csv=args.csv, scale=_scale(args)))
            print(out, end="" if args.csv else "\n")
        except (RunLoadError, OSError, ValueError) as exc:
            raise UsageError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        return 0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback (DPCORE_DEBUG=1 for it)
        if os.environ.get("DPCORE_DEBUG"):
            raise
        msg = str(exc).strip().splitlines()
        kept = "; measured jobs were kept in the run directory" if command in WRITING else ""
        print(f"error: {type(exc).__name__}: {msg[0] if msg else ''} (set DPCORE_DEBUG=1 for the "
              f"traceback{kept})", file=sys.stderr)
        return 1
