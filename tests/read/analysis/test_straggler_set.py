"""Stragglers as a set (``stragglers.straggler_set``): two slow ranks of 8 that arrive last
together split "last" between them, so neither reaches the one-rank threshold (56 % at N = 8);
the verdict names the pair. One slow rank is still named alone; no slow rank names nobody.

The made table mirrors a Megatron 8-rank job: ranks 0 and 6 were the last two to arrive in 61
of 84 all-reduces (73 %), rank 0 alone last in 38 %; they waited ~200 ms, the others ~400 ms."""
from __future__ import annotations

import pandas as pd
import pytest

from dpcore.read.analysis.stragglers import (
    collective_waits,
    rank_host_idle_pct,
    straggler_set,
    straggler_summary,
    straggler_threshold_pct,
    straggler_verdict,
)

MS = 1_000_000
N = 8
SEEN = 84


def table(slow: tuple[int, ...], together: int = 61, late_ms: float = 400.0) -> pd.DataFrame:
    """84 all-reduces of 8 ranks. In the first ``together`` the ``slow`` ranks arrive last,
    ``late_ms`` after the others (among themselves: the first of them last in the first 32, the
    next one after); in the rest a rotating fast rank (1, 2, 3, 4, 5, 7) arrives 300 ms late and
    the slow ranks arrive first. Every collective ends 5 ms after its last arrival."""
    fast = [r for r in range(N) if r not in slow]
    rows = []
    for k in range(SEEN):
        t0 = 10_000 * MS + k * 1000 * MS
        arrive = {r: t0 + r * 100_000 for r in range(N)}  # 0.1 ms apart: launch jitter
        if k < together and slow:
            for i, r in enumerate(slow):  # who of the slow ranks is last rotates: the first in 32
                lead = 1 if (k < 32) == (i == 0) else 0
                arrive[r] = t0 + int((late_ms + 10 * lead) * MS)
        else:
            arrive[fast[k % len(fast)]] = t0 + 300 * MS
        end = max(arrive.values()) + 5 * MS
        rows += [dict(job_id="megatron-ws8", rank=r, step=k // 4, seq=k, op="all_reduce", bytes=1 << 20,
                      t_launch_ns=a, t_start_ns=None, t_end_ns=end) for r, a in arrive.items()]
    return pd.DataFrame(rows)


def test_two_slow_ranks_of_eight_are_named_as_a_set() -> None:
    waits = collective_waits(table((0, 6)))
    s = straggler_summary(waits)
    by = s.set_index("rank")
    assert by.at[0, "last_arrival_pct"] == pytest.approx(100 * 32 / 84)  # 38 %: below the one-rank bar
    assert straggler_threshold_pct(8) == pytest.approx(56.25)
    assert straggler_threshold_pct(8, 2) == pytest.approx((100 / 28 + 100) / 2)
    found = straggler_set(waits, s)
    assert found is not None and found["ranks"] == [0, 6] and found["k"] == 2
    assert found["pct"] == pytest.approx(100 * 61 / 84) and found["collectives"] == 84
    assert by.loc[[0, 6], "mean_wait_ms"].max() < by.drop([0, 6])["mean_wait_ms"].min()
    verdict = straggler_verdict(s, 8, waits)
    assert verdict.startswith("ranks 0 and 6 are the stragglers: they were the last 2 to arrive in 73% of 84 "
                              "collectives; the others waited ")
    assert "(no one rank dominates: rank 0 was last in 38%)" in verdict
    # without the per-collective rows the verdict stays the one-rank rule's
    assert straggler_verdict(s, 8).startswith("no consistent straggler (most often last: rank 0, 38%")


def test_host_idle_corroborates_the_set() -> None:
    waits = collective_waits(table((0, 6)))
    s = straggler_summary(waits)
    ledger = pd.DataFrame({"rank": range(N), "window": "trace", "span_ms": 1000.0,
                           "idle_host_ms": [410.0, 20, 30, 25, 15, 10, 380, 40]})
    idle = rank_host_idle_pct(ledger)
    assert idle.to_dict() == {0: 41.0, 1: 2.0, 2: 3.0, 3: 2.5, 4: 1.5, 5: 1.0, 6: 38.0, 7: 4.0}
    assert straggler_verdict(s, 8, waits, idle).endswith(
        "; their GPUs waited most for the host (41 and 38% host idle against at most 4% for the others): "
        "a slow host, not the network")
    flat = pd.Series(5.0, index=range(N))
    assert "did not wait most for the host" in straggler_verdict(s, 8, waits, flat)


def test_one_slow_rank_is_named_alone() -> None:
    waits = collective_waits(table((3,), together=70))
    s = straggler_summary(waits)
    verdict = straggler_verdict(s, 8, waits)
    assert verdict.startswith("rank 3 arrived last in 83% of 84 collectives; others waited ")


def test_no_slow_rank_names_nobody() -> None:
    waits = collective_waits(table((), together=0))  # the late rank rotates over 6 ranks
    s = straggler_summary(waits)
    assert straggler_set(waits, s) is None
    assert straggler_verdict(s, 8, waits).startswith("no consistent straggler (most often last: rank ")


def test_a_set_must_wait_least() -> None:
    """Ranks 0 and 6 last together in most collectives but waiting as long as the others (they
    were the ones kept waiting in the rest) are not stragglers: the rule's second condition."""
    c = table((0, 6), together=50)
    late = c["seq"] >= 50
    c.loc[late & c["rank"].isin([0, 6]), "t_launch_ns"] -= 2000 * MS  # the pair early by 2 s elsewhere
    c["t_end_ns"] = c.groupby("seq")["t_launch_ns"].transform("max") + 5 * MS
    waits = collective_waits(c)
    s = straggler_summary(waits).set_index("rank")
    assert s.loc[[0, 6], "mean_wait_ms"].min() > s.drop([0, 6])["mean_wait_ms"].max()
    assert straggler_set(waits) is None
