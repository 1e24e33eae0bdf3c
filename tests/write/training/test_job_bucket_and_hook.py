"""A profile job's bucket size and DDP comm hook have one home, its ``JobSpec``, and reach the
rank's trainer by one route (``make_trainer(bucket_mb=, comm_hook=)``): the run's
``TrainConfig`` keeps ``--bucket-mb`` only as the base the jobs are planned from, and has no
comm hook. Known answers: the wrapper holds the job's bucket size and hook, not the config's."""
from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from dpcore.contract.config import TrainConfig
from dpcore.contract.errors import UsageError
from dpcore.contract.options import ProfileOptions
from dpcore.write.capture.run_lifecycle import JobSpec
from dpcore.write.commands.profile import plan_jobs
from dpcore.write.runtime.launch import launch
from dpcore.write.training.trainer import make_trainer

CFG = TrainConfig(model="toy", batch_size=4, steps=1, warmup=0, profile_steps=0, bucket_mb=25.0)


def test_the_comm_hook_lives_in_the_job_spec_only() -> None:
    assert "comm_hook" not in {f.name for f in fields(TrainConfig)}
    assert "comm_hook" in {f.name for f in fields(JobSpec)}


def test_plan_jobs_puts_each_jobs_bucket_and_hook_in_its_spec() -> None:
    opts = ProfileOptions(variants=("torch_ddp",), world_sizes=(2,), bucket_sweep=(4.0,),
                          comm_hooks=("fp16",), train=TrainConfig(model="mlp", width=8, bucket_mb=25.0))
    got = [(j.job_id, j.bucket_mb, j.comm_hook) for j in plan_jobs(opts, None)]
    assert got == [("torch_ddp-ws2-b4", 4.0, "none"), ("torch_ddp-ws2-b4-fp16", 4.0, "fp16"),
                   ("torch_ddp-ws2-b25", 25.0, "none"), ("torch_ddp-ws2-b25-fp16", 25.0, "fp16")]


def _built(ctx: Any) -> dict[str, Any]:
    job = make_trainer("torch_ddp", ctx, CFG, bucket_mb=4.0, comm_hook="fp16").model
    plain = make_trainer("bucketed", ctx, CFG).model
    try:
        make_trainer("torch_ddp", ctx, CFG, comm_hook="zip")
        refused = ""
    except UsageError as exc:
        refused = str(exc)
    return {"job": (job.bucket_bytes_cap / 2**20, job.comm_hook), "plain": plain.bucket_mb, "refused": refused}


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return launch(_built, 1, backend="gloo", timeout_s=240)[0]


def test_the_trainer_takes_the_jobs_bucket_and_hook(built: dict[str, Any]) -> None:
    assert built["job"] == (4.0, "fp16")  # the job's, not CFG's 25 MiB and no hook
    assert built["plain"] == 25.0  # no job: the config's --bucket-mb


def test_an_unknown_hook_is_refused_with_the_choices(built: dict[str, Any]) -> None:
    assert "comm hook" in built["refused"] and "fp16" in built["refused"] and "zip" in built["refused"]
