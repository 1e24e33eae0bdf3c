"""dpcore.read.analysis: the metrics of dpcore runs and torch.profiler traces, pure pandas/numpy.

DataFrames in, DataFrames out, nothing else: no disk access and no text. Runs come loaded from
:mod:`dpcore.read.rundir` (``load_run``), a job's traces as per-rank tables from
:mod:`dpcore.read.ranks` (each table declared beside the analysis that reads it);
what the commands print is :mod:`dpcore.read.report`. See docs/ANALYSIS_API.md for the contract.
"""
from __future__ import annotations

from dpcore.contract.intervals import clip, intersect, intersect_length, merge, subtract, union_length
from dpcore.read.analysis.comm import (
                   allreduce_bandwidth,
                   bus_factor,
                   chunk_matrix,
                   message_counts,
                   message_pairs,
                   ring_step_times,
)
from dpcore.read.analysis.comm_hooks import compression
from dpcore.read.analysis.comm_overlap import overlap_from_trace, step_breakdown
from dpcore.read.analysis.metrics import job_metrics, rank_metrics, step_metrics, step_ranks
from dpcore.read.analysis.stragglers import collective_waits, straggler_summary
from dpcore.read.analysis.summary import bucket_sweep, job_summary, scaling
from dpcore.read.analysis.timeline import timeline

__all__ = ["step_metrics", "rank_metrics", "job_metrics", "step_ranks",
           "union_length", "intersect_length", "merge", "intersect", "subtract", "clip",
           "step_breakdown", "overlap_from_trace", "job_summary", "scaling", "bucket_sweep",
           "compression",
           "allreduce_bandwidth", "bus_factor", "ring_step_times", "chunk_matrix",
           "message_counts", "message_pairs", "timeline",
           "collective_waits", "straggler_summary"]
