"""``ring``: flat gradients averaged by the from-scratch ring all-reduce.

Reduce-scatter then all-gather over isend/irecv (Patarasuk & Yuan 2009; ``dpcore.write.dp.comm``, algo
``ring``): each rank sends 2(N-1)/N of the buffer, independent of N, which is why NCCL and
gloo use it for large tensors.
"""
from __future__ import annotations

from dpcore.write.dp.variants.flat import FlatAlgoDP


class RingDP(FlatAlgoDP):
    name = "ring"
    algo = "ring"
