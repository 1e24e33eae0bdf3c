"""Reading many ranks: each rank's trace reduced once to compact tables (reduce.py), kept beside
the run in ``cache/`` (cache.py), and the misses reduced in worker processes or on a Dask cluster
(pool.py). Every read command and the dashboard go through :func:`rank_tables` (the Timeline
page's lanes through :func:`job_lanes`); the cross-rank work (stragglers' matching, per-job
metrics) then runs on the compact tables, never on events.
"""
from __future__ import annotations

from dpcore.read.ranks.pool import (
    EAGER,
    GPU_TABLES,
    Scale,
    folder_gpu,
    folder_tables,
    job_lane_events,
    job_lanes,
    job_rank_tables,
    rank_tables,
    run_gpu,
    run_steps_gpu,
    run_trace_steps,
)
from dpcore.read.ranks.reduce import RankTables, reduce_trace

__all__ = ["EAGER", "GPU_TABLES", "RankTables", "Scale", "folder_gpu", "folder_tables", "job_lane_events",
           "job_lanes", "job_rank_tables", "rank_tables", "reduce_trace", "run_gpu", "run_steps_gpu", "run_trace_steps"]
