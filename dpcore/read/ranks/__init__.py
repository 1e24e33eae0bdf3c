"""Reading many ranks: each rank's trace reduced once to compact tables (reduce.py), kept beside
the run in ``cache/`` (cache.py), and the misses reduced in worker processes or on a Dask cluster
(pool.py). Generic: a read is handed the tables its caller declared (``need``, and the ``eager``
ones a miss builds too) and knows none of them by name; it imports no analysis. Which tables
dpcore's readers declare, and the reads that combine them (the overlap rows, the GPU ledger, the
Timeline's lanes), are :mod:`dpcore.read.tables`'s. The cross-rank work (stragglers' matching,
per-job metrics) then runs on the compact tables, never on events.
"""
from __future__ import annotations

from dpcore.read.ranks.pool import Scale, folder_tables, job_rank_tables, rank_tables
from dpcore.read.ranks.reduce import RankTables, reduce_trace

__all__ = ["RankTables", "Scale", "folder_tables", "job_rank_tables", "rank_tables", "reduce_trace"]
