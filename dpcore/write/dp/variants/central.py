"""``central``: flat gradients averaged by the from-scratch central algorithm.

Gather every rank's buffer to rank 0, reduce there, broadcast back (``dpcore.write.dp.comm``, algo
``central``): rank 0's link carries 2(N-1) buffers per step, the bottleneck that the ring
all-reduce (Patarasuk & Yuan 2009) removes. Kept to show *why* DDP uses ring/tree algorithms.
"""
from __future__ import annotations

from dpcore.write.dp.variants.flat import FlatAlgoDP


class CentralDP(FlatAlgoDP):
    name = "central"
    algo = "central"
