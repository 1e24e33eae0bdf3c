"""Bind first, then the group; dpcore's own messages on the gloo control plane. Proven on a CPU
machine against a faked 8-GPU host (:mod:`tests.fake_cuda`), one rank at a time.

What NCCL needs, and what each test pins down:

- a rank's GPU is current (``set_device(LOCAL_RANK)``) before ``init_process_group``: NCCL makes
  the rank's communicator on the current device, GPU 0 on every rank until then ("Duplicate GPU
  detected", or a hang);
- ``init_process_group(..., device_id=cuda:LOCAL_RANK)`` on NCCL: the group is bound to the
  rank's GPU, and none of its later calls guesses a device;
- dpcore's object broadcasts, gathers and run-level barriers go over a gloo side group (CPU
  tensors), never the job's NCCL group, whose object collectives run on the current device.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dpcore.write.capture.run_lifecycle import open_run
from dpcore.write.runtime import launch as launch_mod
from dpcore.write.runtime.world import TorchrunWorld, UserWorld, world_context
from tests.fake_cuda import FakeGroup, FakeHost, torchrun_env

LOCAL = 8


class _Writer:
    run_dir = Path("/tmp/dpcore-fake-run")


def _device_of(ctx: Any) -> torch.device:
    return ctx.device


@pytest.mark.parametrize("local_rank", range(LOCAL))
def test_torchrun_rank_binds_its_gpu_before_any_group(monkeypatch: pytest.MonkeyPatch,
                                                     local_rank: int) -> None:
    """8 ranks of `torchrun --nproc-per-node 8 -m dpcore profile --backend nccl`, each built as
    its own process would build it: its GPU is bound before the group exists, the group gets
    ``device_id``, and the first job runs on the rank's GPU."""
    host = FakeHost(monkeypatch, gpus=LOCAL, rank=local_rank, world_size=LOCAL,
                    box=[str(_Writer.run_dir), "", False])
    torchrun_env(monkeypatch, local_rank, local_rank, LOCAL, LOCAL)
    world = TorchrunWorld("nccl", device="auto", timeout_s=60, pin=False)
    init = host.first("init_process_group")
    # the rank's own GPU was current before the group was made, and nothing collective came first
    assert host.calls[init].device == local_rank
    assert "set_device" in host.names()[:init]
    assert not host.collectives()[:1] or host.calls.index(host.collectives()[0]) > init
    assert host.calls[init].args["backend"] == "nccl"
    assert host.calls[init].args.get("device_id") == torch.device("cuda", local_rank)
    # the first job: its context is on the rank's GPU, which stays current
    out = world.run(_device_of, LOCAL, ())
    assert host.current == local_rank
    if local_rank == 0:
        assert out is not None and out[0] == torch.device("cuda", 0)
    else:
        assert out is None


@pytest.mark.parametrize("rank", [0, 5])
def test_torchrun_run_messages_go_over_the_gloo_control_group(monkeypatch: pytest.MonkeyPatch,
                                                             rank: int) -> None:
    """open_run's broadcast, the gather after a job and finish's barrier are dpcore's own: they
    go over one gloo group made beside the NCCL one, never the NCCL group itself."""
    host = FakeHost(monkeypatch, gpus=LOCAL, rank=rank, world_size=LOCAL,
                    box=[str(_Writer.run_dir), "", False])
    torchrun_env(monkeypatch, rank, rank, LOCAL, LOCAL)
    world = TorchrunWorld("nccl", device="auto", timeout_s=60, pin=False)
    writer, run_dir = open_run(world, lambda: _Writer())  # type: ignore[arg-type, return-value]
    assert run_dir == _Writer.run_dir
    world.run(_device_of, LOCAL, ())
    world.finish("complete")
    gloo = [g for g in host.groups if g.backend == "gloo"]
    assert len(gloo) == 1, f"one gloo control group, got {host.groups}"
    made = host.calls[host.first("new_group")]
    assert made.args["backend"] == "gloo" and made.args["timeout"] is not None
    used = [(c.name, c.args["backend"]) for c in host.collectives()]
    assert used == [("broadcast_object_list", "gloo"), ("gather_object", "gloo"),
                    ("barrier", "gloo")]
    assert all(c.args["group"] is gloo[0] for c in host.collectives())
    assert host.names()[-1] == "destroy_process_group"


def test_spawned_nccl_rank_binds_then_passes_device_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank dpcore spawns for an NCCL job (launch's worker body), run in this process: its
    GPU is current when the group is made, and the group is bound to it."""
    host = FakeHost(monkeypatch, gpus=4, rank=3, world_size=4)
    monkeypatch.setattr(launch_mod, "exit_with", lambda pid: None)
    monkeypatch.setattr(launch_mod.dist, "TCPStore", lambda *a, **k: object(), raising=False)
    got: list[Any] = []

    class _Queue:
        def put(self, item: Any) -> None:
            got.append(item)

    placement = launch_mod.Placement("cuda", "nccl", 4)
    launch_mod._worker(3, 4, placement, 1, 1, 60.0, _device_of, (), _Queue(), 0, False)
    assert got == [(3, "ok", torch.device("cuda", 3))], got
    init = host.calls[host.first("init_process_group")]
    assert init.device == 3 and init.args.get("device_id") == torch.device("cuda", 3)


def test_users_nccl_loop_without_set_device_is_on_its_local_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's loop under torchrun that made an NCCL group without ``set_device`` or
    ``device_id`` (its model on cuda:LOCAL_RANK): dpcore's context is on the rank's GPU, not the
    current device (GPU 0 on every rank)."""
    host = FakeHost(monkeypatch, gpus=LOCAL, rank=11, world_size=16)
    torchrun_env(monkeypatch, 11, 3, 16, LOCAL)
    import torch.distributed as dist
    dist.init_process_group("nccl")
    assert host.current == 0
    assert world_context().device == torch.device("cuda", 3)
    # a group bound to its GPU says which GPU is the rank's
    host.world = FakeGroup("nccl", torch.device("cuda", 5))
    assert world_context().device == torch.device("cuda", 5)


def test_users_world_broadcast_goes_over_the_control_group(monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(monkeypatch, gpus=LOCAL, rank=1, world_size=2, box=["/runs/x", "", False])
    torchrun_env(monkeypatch, 1, 1, 2, 2)
    import torch.distributed as dist
    dist.init_process_group("nccl")
    world = UserWorld(device=torch.device("cuda", 1))
    assert world.ctx.device == torch.device("cuda", 1)
    box: list[Any] = [None, "", False]
    world.broadcast(box)
    assert box[0] == "/runs/x"
    (call,) = host.collectives()
    assert call.args["backend"] == "gloo" and call.args["group"] is not host.world


def test_device_id_only_on_nccl_and_only_where_torch_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpcore.write.runtime import placement
    gpu = torch.device("cuda", 2)
    assert placement.TAKES_DEVICE_ID  # this torch (the floor, 2.4, has it too: since 2.3)
    assert placement.init_options("nccl", gpu) == {"device_id": gpu}
    # gloo over CUDA tensors: a bound gloo group would make torch try to split it
    assert placement.init_options("gloo", gpu) == {}
    assert placement.init_options("gloo", torch.device("cpu")) == {}
    monkeypatch.setattr(placement, "TAKES_DEVICE_ID", False)  # a torch without the parameter
    assert placement.init_options("nccl", gpu) == {}


@pytest.mark.parametrize(("version", "off"), [("2.7.0+cu126", "0"), ("2.7.1+cu126", None),
                                              ("2.4.1", None), ("2.13.0", None)])
def test_torch_2_7_0_opts_out_of_the_hanging_nonblocking_mode(monkeypatch: pytest.MonkeyPatch,
                                                              version: str, off: str | None) -> None:
    from dpcore.write.runtime import placement
    monkeypatch.delenv("TORCH_NCCL_USE_COMM_NONBLOCKING", raising=False)
    monkeypatch.setattr(torch, "__version__", version)
    placement.init_options("nccl", torch.device("cuda", 0))
    import os
    assert os.environ.get("TORCH_NCCL_USE_COMM_NONBLOCKING") == off
    monkeypatch.setenv("TORCH_NCCL_USE_COMM_NONBLOCKING", "1")  # the user's choice wins
    placement.init_options("nccl", torch.device("cuda", 0))
    assert os.environ["TORCH_NCCL_USE_COMM_NONBLOCKING"] == "1"
