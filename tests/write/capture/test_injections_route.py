"""``profile --inject-delay`` and ``--inject-hang`` are options of the same dataclass
(``ProfileOptions``) and reach a job's ranks by one route, one :class:`Injections` value per
job: the delayed rank's trainer sleeps in its forward, the hang's rank hangs one all-reduce.
The run's ``TrainConfig`` carries neither."""
from __future__ import annotations

from dataclasses import fields

from dpcore.cli import build_parser
from dpcore.contract.config import TrainConfig
from dpcore.contract.option_fields import option_values
from dpcore.contract.options import ProfileOptions
from dpcore.write.capture.comm_log import PhaseTimer
from dpcore.write.capture.inject import HangInjection, Injections
from dpcore.write.training.trainer import local_context, make_trainer


def test_both_injections_are_profile_options_parsed_alike() -> None:
    args = build_parser().parse_args(["profile", "--inject-delay", "1:20", "--inject-hang", "1:2:sleep"])
    values = option_values(args, ProfileOptions)
    assert values["inject_delay"] == (1, 20.0) and values["inject_hang"] == (1, 2, "sleep")
    assert not {"delay_rank", "delay_ms", "inject_hang"} & {f.name for f in fields(TrainConfig)}


def test_one_value_carries_both_to_the_ranks() -> None:
    got = Injections.of((1, 20.0), (0, 2, "skip"))
    assert got.hang == HangInjection(0, 2, "skip")
    assert [got.delay_s(r) for r in range(3)] == [0.0, 0.02, 0.0]
    none = Injections.of(None, None)
    assert none.hang is None and none.delay_s(0) == 0.0 and none.delay_s(-1) == 0.0


def test_the_delayed_ranks_trainer_sleeps_in_its_forward() -> None:
    cfg = TrainConfig(model="toy", batch_size=4, steps=1, warmup=0, profile_steps=0)
    ctx = local_context("cpu")
    phases = []
    for delay_s in (0.0, 0.2):
        tr = make_trainer("single", ctx, cfg, delay_s=delay_s)
        timer = PhaseTimer(ctx.device)
        x, y = tr.batch(0)
        tr.step(x, y, timer)
        phases.append(timer.finish()["fwd_ms"])
    assert phases[1] >= 200.0 > phases[0]
