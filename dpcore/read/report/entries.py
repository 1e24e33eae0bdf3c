"""The run functions of the read commands (and ``import``): each takes its command's frozen
options class (:mod:`dpcore.contract.options`) and returns exactly what the CLI prints.

Why here, one call each: the report modules' functions return their tables, which the dashboard
and tests call too; how each command ends its output on stdout (a CSV as is; ``analyze`` and
``summarize`` with a blank line after the table, as tests/data/golden recorded) is the command's.
``whatif``'s report function takes its options object itself (:func:`whatif_text`); the others'
take the fields they read, so a report module is not tied to the command line.
"""
from __future__ import annotations

from dpcore.contract.options import (
    AnalyzeOptions,
    GpuOptions,
    HangOptions,
    ImportOptions,
    StragglersOptions,
    SummarizeOptions,
    WhatifOptions,
)
from dpcore.read.report.resolve import scale_of


def _one_newline(text: str, csv: bool) -> str:
    """A CSV as it is; a text ending in exactly one newline."""
    return text if csv else text.rstrip("\n") + "\n"


def analyze_command(options: AnalyzeOptions) -> str:
    """``analyze``: the overlap per rank."""
    from dpcore.read.report.analyze import analyze

    out = analyze(options.path, csv=options.csv, scale=scale_of(options))
    return out if options.csv else out + "\n"


def summarize_command(options: SummarizeOptions) -> str:
    """``summarize``: the per-job table."""
    from dpcore.read.report.summarize import summarize

    out = summarize(options.run, csv=options.csv, scale=scale_of(options))
    return out if options.csv else out + "\n"


def stragglers_command(options: StragglersOptions) -> str:
    """``stragglers``: who arrives last at the collectives."""
    from dpcore.read.report.stragglers import stragglers_text

    out = stragglers_text(options.path, csv=options.csv, scale=scale_of(options)).rstrip("\n")
    return out if options.csv else out + "\n"


def hang_command(options: HangOptions) -> str:
    """``hang``: every rank's last collectives and the verdict."""
    from dpcore.read.report.hang import hang_text

    return _one_newline(hang_text(options.path, csv=options.csv), options.csv)


def import_command(options: ImportOptions) -> str:
    """``import``: the run written from the traces, as its summary lines."""
    from dpcore.read.importer.write_run import import_traces
    from dpcore.read.report.importer import import_text

    return import_text(import_traces(options.traces, options.out, options.name, iteration=options.iteration,
                                     align=options.align_clocks, command=list(options.command),
                                     scale=scale_of(options))) + "\n"


def gpu_command(options: GpuOptions) -> str:
    """``gpu``: the ledger and the views its switches ask for."""
    from dpcore.read.report.gpu import gpu_tables

    return _one_newline(gpu_tables(options.path, csv=options.csv, per_step=options.per_step,
                                   kernels=options.kernels, collectives=options.collectives,
                                   scale=scale_of(options)), options.csv)


def whatif_command(options: WhatifOptions) -> str:
    """``whatif``: the prediction table (or the fabric presets)."""
    from dpcore.read.report.whatif import whatif_text

    return _one_newline(whatif_text(options), options.csv)
