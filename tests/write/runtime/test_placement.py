"""Where a run's ranks compute (``--device``) and how they talk (``--backend``), decided once
per run by ``launch.place``. The GPU host is faked: torch.cuda's answers are monkeypatched,
so every branch (one GPU for many ranks, a GPU per rank, none) is checked on a CPU machine."""
from __future__ import annotations

import pytest
import torch

from dpcore.cli import main
from dpcore.contract.errors import UsageError
from dpcore.write.runtime import launch
from dpcore.write.runtime.launch import Placement, place


def fake_gpus(monkeypatch: pytest.MonkeyPatch, n: int) -> list[int]:
    """A host with ``n`` GPUs and NCCL, as torch reports it; returns the set_device calls."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(launch.dist, "is_nccl_available", lambda: True)
    return calls


def test_no_gpu_auto_is_cpu_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 0)
    pl = place("auto", "auto", 4)
    assert (pl.device, pl.backend, pl.gpus_shared(4)) == ("cpu", "gloo", False)
    assert pl.job_fields(2) == {"backend": "gloo", "device": "cpu", "gpus_shared": False}
    assert pl.rank_device(3) == torch.device("cpu")


def test_cuda_without_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 0)
    with pytest.raises(UsageError, match="--device cuda needs a GPU"):
        place("cuda", "auto", 1)
    with pytest.raises(UsageError, match="backend nccl needs GPUs"):
        place("cpu", "nccl", 1)


def test_one_gpu_several_ranks_share_it_over_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fix 3: a 1-GPU host with world sizes 1,2 runs EVERY job on the GPU (not silently on
    the CPU), over gloo, since NCCL cannot put two ranks on one GPU."""
    calls = fake_gpus(monkeypatch, 1)
    pl = place("auto", "auto", 2)
    assert (pl.device, pl.backend, pl.gpus) == ("cuda", "gloo", 1)
    assert pl.job_fields(1) == {"backend": "gloo", "device": "cuda", "gpus_shared": False}
    assert pl.job_fields(2) == {"backend": "gloo", "device": "cuda", "gpus_shared": True}
    assert [pl.rank_device(r) for r in (0, 1)] == [torch.device("cuda", 0)] * 2
    assert calls == [0, 0]
    line = pl.describe([1, 2])
    assert "world size 1: cuda/gloo (1 rank(s), one GPU each)" in line
    assert "world size 2: cuda/gloo (2 rank(s) share 1 GPU(s), rank r on GPU r mod 1)" in line
    assert "found 1 GPU(s)" in line and "NCCL needs its own GPU per rank" in line
    with pytest.raises(UsageError, match="backend nccl needs 2 GPU"):
        place("auto", "nccl", 2)


def test_a_gpu_per_rank_is_nccl_and_ranks_map_r_mod_g(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_gpus(monkeypatch, 4)
    assert (place("auto", "auto", 4).backend, place("cuda", "auto", 1).backend) == ("nccl", "nccl")
    shared = Placement("cuda", "gloo", 2)
    assert [shared.rank_device(r).index for r in range(5)] == [0, 1, 0, 1, 0]
    assert calls == [0, 1, 0, 1, 0]
    pl = place("cuda", "gloo", 4)  # asked for: gloo over CUDA tensors, one GPU each
    assert (pl.device, pl.backend, pl.gpus_shared(4)) == ("cuda", "gloo", False)
    assert place("cpu", "auto", 4).device == "cpu"  # a CPU run on a GPU host, when asked


def test_library_default_device_follows_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 2)
    assert place(None, "gloo", 2).device == "cpu"
    assert (place(None, "auto", 2).device, place(None, "auto", 2).backend) == ("cuda", "nccl")


@pytest.mark.parametrize("command", ["profile", "verify", "allreduce"])
def test_device_cuda_without_gpu_is_one_line_exit_2(command: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    fake_gpus(monkeypatch, 0)
    out = ["--out", str(tmp_path)] if command != "verify" else []
    rc = main([command, "--device", "cuda", *out])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: --device cuda needs a GPU but torch sees none")
    assert not list(tmp_path.iterdir())


def test_ranks_sharing_gpus_over_gloo_skip_what_gloo_lacks_on_cuda() -> None:
    """gloo has no send/recv for CUDA tensors: those variants are skipped with the reason
    before they are built (no collective runs). Its all_gather and reduce_scatter (an
    all_reduce) do take CUDA tensors, so the FSDPs are not refused."""
    from dpcore.contract.config import TrainConfig, gloo_cuda_refusal
    from dpcore.write.runtime.context import DistContext
    from dpcore.write.training.trainer import make_trainer

    ctx = DistContext(0, 2, 0, "gloo", torch.device("cuda", 0), 1)
    cfg = TrainConfig(model="toy", batch_size=4, steps=1, warmup=0, profile_steps=0)
    for variant, needs in (("ring", "send/recv"), ("naive", "send/recv"), ("central", "send/recv")):
        reason = make_trainer(variant, ctx, cfg).skip_reason
        assert reason is not None and needs in reason and "--device cpu" in reason
    for variant in ("bucketed", "fsdp", "torch_fsdp", "zero1", "torch_zero1"):
        assert gloo_cuda_refusal(variant, "gloo", "cuda") is None
    assert gloo_cuda_refusal("ring", "nccl", "cuda") is None
    assert gloo_cuda_refusal("ring", "gloo", "cpu") is None
