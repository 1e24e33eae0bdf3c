"""Reading torch.profiler Chrome traces: which files are rank traces (files.py), which rank each
is and whether they are one job (world.py), one file into an events frame (reader.py; the byte
scanner that turns a trace into columns: columns.py, bytescan.py), what each event counts as
(kinds.py: compute, comm, ...) and the worker processes a many-rank read uses (workers.py). No
metric lives here, and no reader of every rank's events at once: many ranks are read one rank
at a time into tables (:mod:`dpcore.read.ranks`).
"""
from __future__ import annotations

from dpcore.contract.tracefile import TraceFormatError
from dpcore.read.traces.kinds import KINDS
from dpcore.read.traces.reader import read_trace

__all__ = ["read_trace", "TraceFormatError", "KINDS"]
