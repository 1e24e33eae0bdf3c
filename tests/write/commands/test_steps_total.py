"""The steps one profile job reports: the count the hang monitor and the progress bar share."""
from __future__ import annotations

from dpcore.contract.config import TrainConfig
from dpcore.contract.options import ProfileOptions
from dpcore.write.commands.profile import steps_total


def test_warmup_timed_and_traced_steps() -> None:
    opts = ProfileOptions(train=TrainConfig(steps=6, warmup=3, profile_steps=3))
    assert steps_total(opts) == (13, "3 warm-up + 6 timed + 4 under the profiler")


def test_no_warmup_counts_the_extra_memory_step_and_no_trace_none() -> None:
    opts = ProfileOptions(trace=False, train=TrainConfig(steps=6, warmup=0, profile_steps=0))
    assert steps_total(opts) == (7, "0 warm-up + 6 timed + 1 memory")
