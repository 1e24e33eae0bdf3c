"""Command line: ``python -m dpcore <command>``.

Commands that run jobs and write a run: ``profile``, ``allreduce``; ``verify`` checks that every
variant trains like ``single``. Commands that read runs and traces: ``analyze``, ``summarize``,
``stragglers``, ``whatif``, ``gpu``; ``import`` turns foreign torch.profiler traces into a run.

Bad input never produces a traceback: :class:`UsageError` becomes ``error: <one line>`` and
exit status 2. The CLI computes nothing itself and knows no command by name: every command is
a declaration in :data:`dpcore.commands.COMMANDS` (name, help, frozen options class, run
function); :func:`build_parser` makes one subparser per declaration from its options class's
fields and :func:`run_command` runs ``run(Options.from_args(args))``. Validation is not here
either: the options objects (:mod:`dpcore.contract.options`) refuse bad values when they are
built, with the one-line message the CLI prints.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import warnings

from dpcore.commands import COMMAND_OPTIONS, COMMANDS, Command, resolve
from dpcore.contract.errors import UsageError
from dpcore.contract.option_fields import field_default, option_fields
from dpcore.contract.options import OptionGroup
from dpcore.contract.procs import stop_helpers


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage + exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def add_options(p: argparse.ArgumentParser, command: str) -> None:
    """Every option of ``command`` (:data:`~dpcore.commands.COMMAND_OPTIONS`) as an argument of
    ``p``: the field's flag, help, metavar and choices, the default as the text the field's
    parser reads back."""
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


def build_parser(prog: str | None = None, commands: tuple[Command, ...] | None = None) -> argparse.ArgumentParser:
    """The parser of every command in ``commands`` (:data:`~dpcore.commands.COMMANDS`): one
    subparser each, its options generated from its options class."""
    ap = _Parser(prog=prog or prog_name(), description="Profile data-parallel training variants.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in COMMANDS if commands is None else commands:
        p = sub.add_parser(command.name, help=command.help, description=command.description)
        for group in command.groups:
            add_group(p, group)
    return ap


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


def main(argv: list[str] | None = None, commands: tuple[Command, ...] | None = None) -> int:
    """Run one command; SIGTERM interrupts it like Ctrl-C (:class:`_InterruptOnce`) while it runs.

    The SIGTERM handler is the command's, not the caller's: an in-process caller (a test, a
    notebook) gets its own handler back when the command returns, so a later SIGTERM does what
    it did before instead of raising a KeyboardInterrupt where no command runs. ``commands``:
    the command table (:data:`~dpcore.commands.COMMANDS`; a test passes its own)."""
    previous = None  # stays None where run_cli's handler is in place, or off the main thread
    if threading.current_thread() is threading.main_thread() and \
            not isinstance(signal.getsignal(signal.SIGTERM), _InterruptOnce):
        previous = signal.signal(signal.SIGTERM, _InterruptOnce())
    try:
        return _main(argv, commands)
    finally:
        if previous is not None:  # (None also for a handler installed outside Python: kept ours)
            signal.signal(signal.SIGTERM, previous)


def run_command(command: Command, args: argparse.Namespace) -> int:
    """Build the command's options from the parsed ``args`` and run it: a job command returns its
    exit code; a read command's text is printed (its bad input, a damaged run included, is one
    line and exit 2); ``import`` prints the run it wrote."""
    if command.prepare is not None:
        resolve(command.prepare)(args)
    options = command.options.from_args(args)
    run = command.function()
    if command.kind == "job":
        return int(run(options))
    _quiet_library_warnings()  # the read commands (import and the others)
    if command.kind == "import":
        print(run(options), end="")
        return 0
    from dpcore.read.rundir.load import RunLoadError
    try:
        out = run(options)
    except (RunLoadError, OSError, ValueError) as exc:
        raise UsageError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    print(out, end="")
    return 0


def _main(argv: list[str] | None, commands: tuple[Command, ...] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    table = COMMANDS if commands is None else commands
    name = None
    try:
        args = build_parser(commands=table).parse_args(argv)
        args.argv = ["python", "-m", "dpcore", *argv]  # the command line a written run records
        name = args.command
        return run_command(next(c for c in table if c.name == name), args)
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
        writes = any(c.name == name and c.writes for c in table)
        kept = "; measured jobs were kept in the run directory" if writes else ""
        print(f"error: {type(exc).__name__}: {msg[0] if msg else ''} (set DPCORE_DEBUG=1 for the "
              f"traceback{kept})", file=sys.stderr)
        return 1
