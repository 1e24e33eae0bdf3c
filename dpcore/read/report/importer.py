"""What ``python -m dpcore import TRACES`` prints once the run is written: where it is, how the
clocks were aligned and what the traces did not say (the importer itself is
:mod:`dpcore.read.importer`).
"""
from __future__ import annotations

from dpcore.read.importer.write_run import Imported


def import_text(result: Imported) -> str:
    """What ``python -m dpcore import`` prints: where the run is and what the traces lacked."""
    notes = "".join(f"\n  note: {n}" for n in result.notes)
    return (f"imported {len(result.ranks)} rank(s), {result.steps} step rows, {result.collectives} collectives "
            f"into {result.run_dir}\n  clock: {result.alignment}\n  not in the traces (left empty): "
            f"{', '.join(result.missing)}{notes}\n  open it: python -m dpcore summarize {result.run_dir}  |  "
            "streamlit run app.py")
