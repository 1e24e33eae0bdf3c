"""dpcore.analysis: pure pandas/numpy analysis of dpcore runs and torch.profiler traces.

See docs/ANALYSIS_API.md for the contract. Only the loaders (load_run, list_runs, read_trace,
read_trace_dir) touch disk; everything else is DataFrames in, DataFrames out.
"""
from __future__ import annotations

from .comm import (allreduce_bandwidth, bus_factor, chunk_matrix, collective_bandwidth, message_counts,
                   message_pairs, number_pieces, ring_step_times, stragglers)
from .intervals import clip, intersect, intersect_length, merge, subtract, union_length
from .load import Run, RunLoadError, list_runs, load_run
from .overlap import overlap_by_rank, overlap_from_trace, step_breakdown
from .summary import bucket_sweep, job_summary, scaling
from .timeline import job_trace_events, timeline
from .tracefile import TraceFormatError
from .traces import KINDS, read_trace, read_trace_dir

__all__ = ["Run", "RunLoadError", "TraceFormatError", "KINDS", "load_run", "list_runs", "read_trace",
           "read_trace_dir", "union_length", "intersect_length", "merge", "intersect", "subtract", "clip",
           "step_breakdown", "overlap_from_trace", "overlap_by_rank", "job_summary", "scaling", "bucket_sweep",
           "allreduce_bandwidth", "collective_bandwidth", "bus_factor", "ring_step_times", "chunk_matrix",
           "message_counts", "message_pairs", "number_pieces", "stragglers", "timeline",
           "job_trace_events"]
