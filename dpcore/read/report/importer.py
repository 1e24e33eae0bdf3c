"""What ``python -m dpcore import TRACES`` prints once the run is written: where it is, how the
clocks were aligned and what the traces did not say (the importer itself is
:mod:`dpcore.read.importer`).
"""
from __future__ import annotations

from dpcore.contract.options import ImportOptions
from dpcore.read.importer.write_run import Imported


def import_text(result: Imported) -> str:
    """What ``python -m dpcore import`` prints: where the run is and what the traces lacked."""
    notes = "".join(f"\n  note: {n}" for n in result.notes)
    return (f"imported {len(result.ranks)} rank(s), {result.steps} step rows, {result.collectives} collectives "
            f"into {result.run_dir}\n  clock: {result.alignment}\n  not in the traces (left empty): "
            f"{', '.join(result.missing)}{notes}\n  open it: python -m dpcore summarize {result.run_dir}  |  "
            "streamlit run app.py")


def import_command(options: ImportOptions) -> str:
    """The ``import`` command: the run written from ``options.traces``, as the lines it prints."""
    from dpcore.read.importer.write_run import import_traces
    from dpcore.read.report.resolve import scale_of

    return import_text(import_traces(options.traces, options.out, options.name, iteration=options.iteration,
                                     align=options.align_clocks, command=list(options.command),
                                     scale=scale_of(options))) + "\n"
