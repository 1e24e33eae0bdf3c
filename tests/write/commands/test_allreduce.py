"""The `allreduce` command's correctness check: elements that differ from the exact sum."""
from __future__ import annotations

import pytest


def test_correctness_check_counts_wrong_elements() -> None:
    torch = pytest.importorskip("torch")
    from dpcore.write.commands.allreduce import check_input, count_wrong, expected_sum

    for n, numel in [(2, 1), (3, 1031), (4, 4096)]:
        total = sum(check_input(numel, r) for r in range(n))
        assert torch.equal(total, expected_sum(numel, n)) and count_wrong(total, n) == 0
        total[numel // 2] += 1  # one element wrong
        assert count_wrong(total, n) == 1
    swapped = torch.cat([check_input(1024, 0)[512:], check_input(1024, 0)[:512]]) * 2 + 1  # N=2, chunks swapped
    assert count_wrong(swapped, 2) == 1024
