"""dpcore.read.analysis: pure pandas/numpy analysis of dpcore runs and torch.profiler traces.

See docs/ANALYSIS_API.md for the contract. Only the loaders (load_run, list_runs, read_trace,
read_trace_dir) touch disk; everything else is DataFrames in, DataFrames out.
"""
from __future__ import annotations

from dpcore.read.analysis.comm import (allreduce_bandwidth, bus_factor, chunk_matrix, message_counts,
                   message_pairs, number_pieces, ring_step_times)
from dpcore.contract.intervals import clip, intersect, intersect_length, merge, subtract, union_length
from dpcore.read.rundir.load import Run, RunLoadError, list_runs, load_run
from dpcore.read.analysis.metrics import job_metrics, rank_metrics, step_metrics, step_ranks
from dpcore.read.analysis.comm_overlap import overlap_by_rank, overlap_from_trace, step_breakdown
from dpcore.read.analysis.stragglers import collective_waits, straggler_summary, stragglers_from_traces
from dpcore.read.analysis.summary import bucket_sweep, job_summary, scaling
from dpcore.read.analysis.timeline import job_trace_events, timeline, trace_step_metrics
from dpcore.contract.tracefile import TraceFormatError
from dpcore.read.traces.reader import KINDS, read_trace, read_trace_dir

__all__ = ["step_metrics", "rank_metrics", "job_metrics", "step_ranks", "trace_step_metrics", "Run", "RunLoadError", "TraceFormatError", "KINDS", "load_run", "list_runs", "read_trace",
           "read_trace_dir", "union_length", "intersect_length", "merge", "intersect", "subtract", "clip",
           "step_breakdown", "overlap_from_trace", "overlap_by_rank", "job_summary", "scaling", "bucket_sweep",
           "allreduce_bandwidth", "bus_factor", "ring_step_times", "chunk_matrix",
           "message_counts", "message_pairs", "number_pieces", "timeline",
           "job_trace_events", "collective_waits", "straggler_summary", "stragglers_from_traces"]
