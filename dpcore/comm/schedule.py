"""The pure ring schedule, re-exported next to the code that communicates around it.

It is defined in :mod:`dpcore.ringplan` (torch-free, so the analysis and the dashboard draw the
chunk matrix from the very same plan).
"""
from ..ringplan import PHASES, RingStep, chunk_bounds, owned_chunk, rank_schedule, ring_schedule

__all__ = ["PHASES", "RingStep", "chunk_bounds", "owned_chunk", "rank_schedule", "ring_schedule"]
