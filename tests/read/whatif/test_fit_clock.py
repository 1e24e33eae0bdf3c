"""The what-if's source timelines compare like with like on a GPU job recorded with events.

There the step's start (steps.csv ``t_start_ns``), its phases and the collectives' ends are the
stream's times, resolved onto the shared clock, while ``t_launch_ns`` and grads.csv's
``t_ready_ns`` are host times, and the host runs ahead of the stream. Measured from the stream's
step start, a host launch can read before backward even began on the device. The tables here are
built by hand as such a job writes them: the host queued forward and backward in a few ms, the
stream ran forward for 10 ms and backward for 20 ms after the step's start, and each bucket's
all-reduce began on the stream when backward's hook launched it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.read.whatif.fit import GRADS_FROM_STREAM, job_timelines, stream_timed

JOB = "bucketed-ws2-b1"
MS = 1_000_000
MIB = 1024 * 1024
T0 = 5_000 * MS           # each step starts on the stream at T0 + 100 ms * step
FWD, BWD = 10.0, 20.0     # ms on the stream


def _steps() -> pd.DataFrame:
    rows = [{"job_id": JOB, "variant": "bucketed", "world_size": 2, "bucket_mb": 2.0, "rank": r, "step": s,
             "profiled": False, "t_start_ns": T0 + 100 * MS * s, "step_ms": 50.0, "fwd_ms": FWD, "bwd_ms": BWD,
             "sync_ms": 12.0, "opt_ms": 3.0} for r in range(2) for s in range(2)]
    return pd.DataFrame(rows)


def _collectives(stream: bool) -> pd.DataFrame:
    """Two buckets of 2 MiB a rank-step. Host launches at 2 and 4 ms after the step's start (the
    host is far ahead); on the stream they begin at 20 and 30 ms (inside backward, 10-30 ms) and
    end at 35 and 45 ms. ``stream`` False: the same rows as a CPU job writes them, no start."""
    rows = []
    for r in range(2):
        for s in range(2):
            t0 = T0 + 100 * MS * s
            for seq, (host, dev, end) in enumerate([(2, 20, 35), (4, 30, 45)]):
                rows.append({"job_id": JOB, "rank": r, "step": s, "seq": seq, "op": "all_reduce", "algo": "native",
                             "bytes": 2 * MIB, "t_launch_ns": t0 + host * MS,
                             "t_start_ns": t0 + dev * MS if stream else np.nan, "t_end_ns": t0 + end * MS,
                             "bucket": seq})
    return pd.DataFrame(rows)


def _grads() -> pd.DataFrame:
    """Four 1 MiB gradients, ready on the host 1.0-2.5 ms after the step began (host times)."""
    rows = []
    for r in range(2):
        for s in range(2):
            t0 = T0 + 100 * MS * s
            for param, ready in zip(range(4), (2.5, 2.0, 1.5, 1.0)):
                rows.append({"job_id": JOB, "rank": r, "step": s, "param": param, "name": f"p{param}",
                             "bytes": MIB, "t_ready_ns": t0 + int(ready * MS)})
    return pd.DataFrame(rows)


def test_a_stream_timed_job_is_recognised_by_its_collectives_start_times() -> None:
    assert stream_timed(_collectives(stream=True))
    assert not stream_timed(_collectives(stream=False))   # CPU, or a GPU run from before events
    assert not stream_timed(_collectives(stream=False).drop(columns="t_start_ns"))
    assert not stream_timed(_collectives(stream=True).iloc[0:0])


def test_gpu_job_launches_are_the_streams_and_lie_inside_backward() -> None:
    """Fails on the old fit: it measured the host launches (2 and 4 ms) from the stream's step
    start, before backward began (10 ms), and the host ready times (1-2.5 ms) with them."""
    src = job_timelines(_steps(), _collectives(stream=True), _grads(), JOB)
    assert len(src.timelines) == 4
    for tl in src.timelines:
        np.testing.assert_allclose(tl.comm_start, [20.0, 30.0])
        np.testing.assert_allclose(tl.comm_end, [35.0, 45.0])
        assert np.all(tl.comm_start >= tl.fwd_ms) and np.all(tl.comm_start <= tl.fwd_ms + tl.bwd_ms)
        # host ready times are not measured from the stream's start: the buckets' stream launches
        # stand in (each 2 MiB bucket in two 1 MiB pieces spread over the time since the last one)
        np.testing.assert_allclose(tl.ready_ms, [30.0, 25.0, 20.0, 15.0])
        assert np.all(tl.ready_ms >= tl.fwd_ms)
    np.testing.assert_allclose(src.sizes, [MIB] * 4)
    assert src.grads_source == GRADS_FROM_STREAM


def test_cpu_job_keeps_host_launches_and_grads_ready_times() -> None:
    """The same tables without start times (a CPU job: one host clock) read as they always did."""
    src = job_timelines(_steps(), _collectives(stream=False), _grads(), JOB)
    assert src.grads_source == "grads.csv" and len(src.timelines) == 4
    for tl in src.timelines:
        np.testing.assert_allclose(tl.comm_start, [2.0, 4.0])
        np.testing.assert_allclose(tl.comm_end, [35.0, 45.0])
        # bucket 0 holds params 2, 3 (reverse order), launched at 2 ms: ready 1.5, 1.0 stay;
        # bucket 1 holds 0, 1, launched at 4 ms: 2.5, 2.0 stay (no cap bites)
        np.testing.assert_allclose(tl.ready_ms, [2.5, 2.0, 1.5, 1.0])
    np.testing.assert_allclose(src.sizes, [MIB] * 4)
