"""Write a hand-made pair of GPU traces: ranks 0 and 1 of an 8-rank NCCL job, with point-to-point
kernels between the collectives, in a different order on each rank.

Why (issue 19, defect 8): ``../shared/traces/hta_trace_filter_2r`` holds 2 of the 128 ranks of a
job whose comm kernels are ``ncclKernel_SendRecv``; matched by order as if they were collectives,
they gave waits longer than the comm they are part of. This pair has the same shape, small and
with known answers:

* ``distributedInfo.world_size`` is 8, only ranks 0 and 1 are here: a partial set;
* each rank runs 3 all-reduces (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``) in ProfilerStep#1;
  rank 1 reaches each 5 ms after rank 0, and both leave 1 ms after rank 1 arrived, so rank 0's
  wait is 5 ms and its comm 6 ms per all-reduce, rank 1's wait 0 and comm 1 ms;
* 4 SendRecv kernels per rank (rank 0 sends to rank 1 while rank 1 receives from rank 7, ...)
  sit between them in a different order on the two ranks, so matching every comm kernel by order
  pairs SendRecv kernels with all-reduces.

Run from the repository root: ``python tests/data/make_partial_sendrecv_trace.py [OUT_DIR]``
(default ``tests/data/partial_sendrecv_2of8``).
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "partial_sendrecv_2of8"
WORLD_SIZE = 8
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
STEP_US = (1_000.0, 100_000.0)  # ProfilerStep#1: start, duration
ALLREDUCE_US = (10_000.0, 40_000.0, 70_000.0)  # rank 0's arrival at each all-reduce
LATE_US, TRANSFER_US = 5_000.0, 1_000.0
#: (start, duration) of each SendRecv kernel; rank 1's come in another place of the order
SENDRECV_US = {0: [(2_000.0, 3_000.0), (20_000.0, 8_000.0), (30_000.0, 2_000.0), (80_000.0, 9_000.0)],
               1: [(2_500.0, 1_000.0), (50_000.0, 4_000.0), (60_000.0, 6_000.0), (90_000.0, 2_000.0)]}


def kernel(rank: int, name: str, ts: float, dur: float, corr: int) -> list[dict]:
    """A kernel on stream 7 and the cudaLaunchKernel that launched it (same correlation id)."""
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": rank, "tid": 10 + rank,
             "ts": ts - 50.0, "dur": 10.0, "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": name, "pid": rank, "tid": 7, "ts": ts, "dur": dur,
             "args": {"correlation": corr, "stream": 7, "device": rank}}]


def trace(rank: int) -> dict:
    """Rank ``rank``'s trace: ProfilerStep#1, a forward range, the all-reduces and SendRecv kernels."""
    main = 10 + rank
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": rank, "tid": main,
           "ts": STEP_US[0], "dur": STEP_US[1]},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": rank, "tid": main, "ts": 1_100.0, "dur": 500.0}]
    corr = 100
    for a in ALLREDUCE_US:
        arrive = a + (LATE_US if rank == 1 else 0.0)
        ev += kernel(rank, ALLREDUCE, arrive, a + LATE_US + TRANSFER_US - arrive, corr)
        corr += 1
    for ts, dur in SENDRECV_US[rank]:
        ev += kernel(rank, SENDRECV, ts, dur, corr)
        corr += 1
    return {"schemaVersion": 1, "traceEvents": sorted(ev, key=lambda e: e["ts"]),
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": WORLD_SIZE}}


def main(out: Path = DEFAULT_OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        body = json.dumps(trace(rank), separators=(",", ":")).encode()
        (out / f"rank{rank}.json.gz").write_bytes(gzip.compress(body, mtime=0))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
