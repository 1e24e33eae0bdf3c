"""What a command's PATH argument is: a run directory, or torch.profiler traces.

Why one place: ``analyze`` and ``stragglers`` take either a run directory (it has run.json) or a
folder of traces (searched recursively) or one trace file, and must answer the same way for the
same path; every run a command opens goes through :func:`load_run_reporting`, so what the loader
worked around is reported the same way by every command.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import pandas as pd

from dpcore.contract.errors import UsageError
from dpcore.contract.options import ScaleOptions
from dpcore.contract.runformat import RUN_JSON
from dpcore.read.ranks import Scale
from dpcore.read.rundir.load import Run, load_run
from dpcore.read.tables import run_trace_steps

#: What :func:`resolve` says a path is.
PathKind = Literal["run", "traces"]


def refuse_empty(path: str | Path, valid: str) -> None:
    """ValueError for an empty PATH: ``Path("")`` is ``.``, so ``analyze ''`` (an unset shell
    variable) would read, and cache, whatever folder the command runs in."""
    if not str(path).strip():
        raise ValueError(f"the path is empty; give {valid}")


def resolve(path: str | Path) -> tuple[Path, PathKind]:
    """(path, "run") for a folder with run.json, (path, "traces") for anything else that exists
    (a folder of traces or one trace file). ValueError with one line when nothing is there."""
    refuse_empty(path, "a run directory, a folder of traces or one trace file")
    p = Path(path)
    if not p.exists():
        raise ValueError(f"no such file or directory: {p}")
    if not p.is_dir() and not p.is_file():  # a FIFO would block a reader; say what it is instead
        raise ValueError(f"not a regular file or folder (a pipe, device or socket): {p}")
    return p, "run" if p.is_dir() and (p / RUN_JSON).exists() else "traces"


def load_run_reporting(path: str | Path) -> Run:
    """:func:`load_run` for the CLI: what the loader worked around (rows with unreadable numbers
    it skipped) goes to stderr, one line each, so ``--csv`` output on stdout stays clean."""
    refuse_empty(path, "a run directory")
    run = load_run(Path(path))
    warn(run.warnings)
    return run


def warn(lines: Iterable[str]) -> None:
    """One ``warning:`` line per problem on stderr (stdout stays the table, ``--csv`` clean)."""
    for w in lines:
        print(f"warning: {w}", file=sys.stderr)


def trace_steps_reporting(run: Run, scale: Scale | None = None) -> pd.DataFrame:
    """:func:`dpcore.read.tables.run_trace_steps` for the CLI (the per-rank tables from the
    cache): each job whose rank traces were missing, unreadable or refused is named on stderr
    (its numbers then come from the recorded intervals), so no number changes silently."""
    problems: list[str] = []
    out = run_trace_steps(run, scale, problems)
    warn(problems)
    return out


def scale_of(options: ScaleOptions) -> Scale:
    """How a read command's ``--workers`` / ``--scheduler`` / ``--no-cache`` read the rank traces;
    UsageError (one line) for a scheduler address Scale refuses."""
    try:
        return Scale(workers=options.workers, scheduler=options.scheduler or None, cache=options.cache)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
