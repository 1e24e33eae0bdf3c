"""Pure tests of the ring all-reduce schedule: no processes, simulated with numpy."""
from __future__ import annotations

import numpy as np
import pytest

from dpcore.contract.ringplan import PHASES, RingStep, chunk_bounds, owned_chunk, rank_schedule, ring_schedule


@pytest.mark.parametrize("numel", [0, 1, 2, 3, 7, 13, 100, 1000003])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_chunk_bounds_cover_and_balance(numel: int, n: int) -> None:
    b = chunk_bounds(numel, n)
    assert len(b) == n
    assert b[0][0] == 0 and b[-1][1] == numel
    assert all(b[i][1] == b[i + 1][0] for i in range(n - 1))  # contiguous, no gaps
    sizes = [e - s for s, e in b]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # bigger chunks first
    if numel < n:
        assert sizes.count(0) == n - numel


def test_chunk_bounds_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        chunk_bounds(10, 0)
    with pytest.raises(ValueError):
        chunk_bounds(-1, 2)


def test_ring_step_is_frozen() -> None:
    s = RingStep("reduce_scatter", 0, 0, 0, 1, 1, 1)
    with pytest.raises(AttributeError):
        s.rank = 3  # type: ignore[misc]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7])
def test_schedule_shape_and_matching(n: int) -> None:
    plan = ring_schedule(n)
    assert len(plan) == n * 2 * (n - 1)
    for r in range(n):
        mine = rank_schedule(n, r)
        assert len(mine) == 2 * (n - 1)  # 2(N-1) steps per rank
        assert [s.phase for s in mine] == [PHASES[0]] * (n - 1) + [PHASES[1]] * (n - 1)
        assert all(s.dst == (r + 1) % n and s.src == (r - 1) % n for s in mine)
    by_key = {(s.phase, s.ring_step, s.rank): s for s in plan}
    for s in plan:  # what r sends at a step is what r+1 expects at that step
        assert by_key[(s.phase, s.ring_step, s.dst)].recv_chunk == s.send_chunk
        assert by_key[(s.phase, s.ring_step, s.dst)].src == s.rank


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("numel", [0, 1, 5, 13, 64])
def test_simulated_ring_all_reduce(n: int, numel: int) -> None:
    """Run the schedule on numpy arrays, all ranks of a step simultaneously."""
    rng = np.random.default_rng(n * 1000 + numel)
    data = [rng.integers(-50, 50, numel).astype(np.float64) for _ in range(n)]
    total = np.sum(data, axis=0) if n else None
    bufs = [d.copy() for d in data]
    # contrib[r][c] = set of ranks whose data chunk c of rank r contains
    contrib = [[{r} for _ in range(n)] for r in range(n)]
    bounds = chunk_bounds(numel, n)
    plan = ring_schedule(n)
    sent = [0] * n
    for phase in PHASES:
        for k in range(n - 1):
            steps = [s for s in plan if s.phase == phase and s.ring_step == k]
            assert len(steps) == n
            # snapshot what is sent (simultaneous exchange)
            msgs = {s.dst: (s.send_chunk, bufs[s.rank][slice(*bounds[s.send_chunk])].copy(),
                            set(contrib[s.rank][s.send_chunk])) for s in steps}
            for s in steps:
                sent[s.rank] += bounds[s.send_chunk][1] - bounds[s.send_chunk][0]
                c, payload, who = msgs[s.rank]
                assert c == s.recv_chunk
                sl = slice(*bounds[c])
                if phase == "reduce_scatter":
                    assert not (who & contrib[s.rank][c]), "contribution counted twice"
                    bufs[s.rank][sl] += payload
                    contrib[s.rank][c] |= who
                else:
                    bufs[s.rank][sl] = payload
                    contrib[s.rank][c] = who
        if phase == "reduce_scatter":
            for r in range(n):  # documented convention: rank r owns chunk (r+1) % n
                c = owned_chunk(n, r)
                assert c == (r + 1) % n
                assert contrib[r][c] == set(range(n))
                np.testing.assert_array_equal(bufs[r][slice(*bounds[c])],
                                              total[slice(*bounds[c])])
    for r in range(n):
        np.testing.assert_array_equal(bufs[r], total)
        assert all(contrib[r][c] == set(range(n)) for c in range(n))
        # bandwidth optimality: 2(N-1) chunks, i.e. 2(N-1)/N of the tensor up to rounding
        assert abs(sent[r] - 2 * (n - 1) * numel / n) <= 2 * (n - 1)
