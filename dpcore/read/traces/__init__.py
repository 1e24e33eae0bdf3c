"""Reading torch.profiler Chrome traces: files and ranks (reader.py), the byte scanner that turns
a trace into columns (columns.py, bytescan.py), and what each event counts as (kinds.py: compute,
comm, ...). No metric lives here.
"""
from __future__ import annotations

from dpcore.contract.tracefile import TraceFormatError
from dpcore.read.traces.kinds import KINDS
from dpcore.read.traces.reader import read_trace, read_trace_dir, read_trace_files

__all__ = ["read_trace", "read_trace_dir", "read_trace_files", "TraceFormatError", "KINDS"]
