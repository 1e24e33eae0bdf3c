"""Clock offsets: 0 by construction on rank 0's host, measured over the gloo control plane across
hosts, whatever the job's backend.

The pure rules (who measures for whom, Cristian's minimum round trip) are checked on given
samples. The collective is checked in one real 3-rank job whose default group is
``tests.async_backend`` in its ``stream`` mode: NCCL's semantics, where ``send``/``recv``
return once queued, so a ping-pong over the job's group would read a buffer the peer has not
written yet. Host names are faked per rank (``clock.host_key``): all on one host, then rank 0
alone on one host and ranks 1 and 2 on another.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from dpcore.write.runtime import clock
from dpcore.write.runtime.clock import best_offset, measurers


def test_ranks_on_rank0s_host_need_no_measurement() -> None:
    assert measurers(["a"] * 8) == [None] * 8
    # two hosts of 4: the second host's ranks all take rank 4's measurement
    assert measurers(["a"] * 4 + ["b"] * 4) == [None] * 4 + [4] * 4
    # hosts interleaved by rank: the lowest rank of each host measures for it
    assert measurers(["a", "b", "c", "b", "a", "c"]) == [None, 1, 2, 1, None, 2]


def test_the_sample_with_the_shortest_round_trip_wins() -> None:
    # (t0, rank 0's clock, t1): offset = T - (t0 + t1) // 2 of the tightest sample
    samples = [(100, 1_000, 300), (400, 1_250, 420), (500, 9_999, 900)]
    assert best_offset(samples) == (1_250 - 410, 20)
    assert best_offset([]) == (0, 0)


def test_host_key_is_the_same_for_every_process_of_a_boot() -> None:
    key = clock.host_key()
    assert key and key == clock.host_key()
    if Path("/proc/sys/kernel/random/boot_id").exists():
        assert key.startswith("boot:" + Path("/proc/sys/kernel/random/boot_id").read_text().strip())


def _sync(rank: int, hosts: list[str]) -> dict[str, Any]:
    """measure_offset with faked hosts; every send/recv's group written down."""
    from dpcore.write.runtime.context import DistContext
    clock.host_key = lambda: hosts[rank]  # type: ignore[method-assign]
    used: list[str] = []
    real = {name: getattr(dist, name) for name in ("send", "recv")}

    def spy(name: str) -> Any:
        def call(tensor: Any, *args: Any, group: Any = None, **kwargs: Any) -> Any:
            used.append("default" if group is None or group is dist.group.WORLD
                        else str(dist.get_backend(group)))
            return real[name](tensor, *args, group=group, **kwargs)
        return call

    for name in real:
        setattr(dist, name, spy(name))
    try:
        import torch
        ctx = DistContext(rank, dist.get_world_size(), rank, str(dist.get_backend()),
                          torch.device("cpu"), 1)
        offset, rtt = clock.measure_offset(ctx, rounds=10)
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)
    return {"offset": offset, "rtt": rtt, "used": used}


def _plane(rank: int, n: int) -> dict[str, Any]:
    report: dict[str, Any] = {"backend": str(dist.get_backend())}
    report["one_host"] = _sync(rank, ["a"] * n)
    report["two_hosts"] = _sync(rank, ["a"] + ["b"] * (n - 1))
    dist.destroy_process_group()
    return report


def _worker(rank: int, n: int, tmp: str) -> None:
    from tests import async_backend as ab
    ab.run_rank(rank, n, tmp, 5.0, "stream", _plane)  # NCCL: an op returns once queued; done 5 ms later


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    from tests import async_backend as ab
    return ab.job_reports(_worker, 3, tmp_path_factory.mktemp("clock-plane"))


@pytest.mark.slow
def test_one_host_offsets_are_zero_without_a_message(reports: list[dict]) -> None:
    assert reports[0]["backend"] == "dpcore_async"
    for rep in reports:
        assert (rep["one_host"]["offset"], rep["one_host"]["rtt"]) == (0, 0)
        assert rep["one_host"]["used"] == []  # nothing was measured: nothing to measure


@pytest.mark.slow
def test_cross_host_offsets_are_measured_over_gloo(reports: list[dict]) -> None:
    r0, r1, r2 = (rep["two_hosts"] for rep in reports)
    assert (r0["offset"], r0["rtt"]) == (0, 0)
    # rank 1 measured for its host, on the control plane, never the job's (NCCL-like) group
    assert r1["rtt"] > 0
    assert r0["used"] == ["gloo"] * 20 and r1["used"] == ["gloo"] * 20
    # the ranks really share one clock (one machine), so the measured offset is within
    # Cristian's bound, rtt / 2, of the truth, 0
    assert abs(r1["offset"]) <= r1["rtt"] // 2 + 1, r1
    # rank 2 reads rank 1's clock: it takes rank 1's answer and sends nothing
    assert (r2["offset"], r2["rtt"]) == (r1["offset"], r1["rtt"]) and r2["used"] == []
