"""The GPU recommendation by cause (dpcore.read.analysis.advice): each host-idle cause gets its own
remedy and reason, not launch-overhead advice for every host-bound window. Checked on made ledger
rows (one per table entry) and on the foreign and shared traces, whose top causes are a gloo
collective over CUDA tensors, a DataLoader, an aten::to copy and launch-bound user ranges."""
from __future__ import annotations

from pathlib import Path

import pytest

from dpcore.read.analysis import gpu_time
from dpcore.read.analysis.advice import DEVICE_REMEDIES, HOST_REMEDIES, LAUNCH_REMEDY, advice, remedy_for
from dpcore.read.analysis.gpu_time import TRACE_STEP
from dpcore.read.dashboard.pages import gpu as gpu_page
from dpcore.read.report import gpu as gpu_report
from dpcore.read.tables import folder_gpu

SHARED = Path(__file__).resolve().parents[3].parent / "shared"


def row(cause: str, cause_ms: float, host_ms: float, span: float = 100.0, device_ms: float = 0.0) -> dict:
    return {"span_ms": span, "idle_host_ms": host_ms, "idle_device_ms": device_ms,
            "host_bound": host_ms > 0.5 * span, "top_idle_cause": cause, "top_idle_cause_ms": cause_ms}


@pytest.mark.parametrize("cause, what, says", [
    ("gloo:all_reduce", "a host-side collective (gloo)", "NCCL with one GPU per rank"),
    ("c10d::allreduce_", "a collective the CPU waited in", "async_op=True"),
    ("nccl:all_reduce", "a collective the CPU waited in", "dpcore stragglers"),
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "the data loader", "num_workers"),
    ("aten::item", "a host-device synchronisation", "no .item()"),
    ("aten::_local_scalar_dense", "a host-device synchronisation", "no .item()"),
    ("cudaStreamSynchronize", "a host-device synchronisation", "no .item()"),
    ("aten::to", "a host-device copy", "non_blocking=True"),
    ("aten::copy_", "a host-device copy", "pin_memory=True"),
    ("Optimizer.step#AdamW.step", "the optimizer", "fused=True"),
    ("## optimizer ##", "the optimizer", "fused=True"),
    ("Optimizer.zero_grad#SGD.zero_grad", "the optimizer", "set_to_none"),
    ("python", "launch overhead", "CUDA graphs"),
    ("aten::broadcast_tensors", "launch overhead", "CUDA graphs"),  # an aten op, not a collective
    ("## forward ##", "launch overhead", "torch.compile"),
])
def test_each_cause_has_its_remedy(cause: str, what: str, says: str) -> None:
    r = remedy_for(cause)
    assert r.what == what and says in r.remedy and r.reason
    tip = advice(row(cause, 60.0, 80.0))
    assert tip == (f"host-bound: the GPU waited 80 ms (80 % of the span) for the CPU; the top cause is {cause} "
                   f"(60 ms), {what}: {r.remedy}. Why: {r.reason}.")
    # the gpu command and page call this one function, with no pass-through in between
    assert gpu_report.advice is advice and gpu_page.advice is advice
    assert not hasattr(gpu_time, "advice")


def test_a_large_cause_is_named_below_host_bound_and_noise_is_not() -> None:
    tip = advice(row("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 29.0, 35.0))
    assert tip.startswith("the GPU waited 29 ms (29 % of the span) for the CPU; the top cause is enumerate(")
    assert advice(row("aten::to", 10.0, 15.0)) == ""  # 10 % in one cause, not host-bound: nothing clear
    device = advice(row("python", 1.0, 2.0, device_ms=40.0))
    assert device.startswith("the GPU idles 40 ms (40 % of the span) with work already queued (a dependency): ")
    assert advice(row("", 0.0, 0.0)) == "" and advice({**row("x", 0, 0), "span_ms": 0.0}) == ""


def test_every_table_row_is_complete() -> None:
    for r in (*HOST_REMEDIES, LAUNCH_REMEDY, *DEVICE_REMEDIES):
        assert r.what and r.remedy and r.reason
    assert LAUNCH_REMEDY.pattern == "" and not LAUNCH_REMEDY.matches("python")


def _whole_trace_tips(folder: Path) -> list[str]:
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent (a fresh clone): the foreign traces are checked where they exist")
    ledger = folder_gpu(folder)[0]
    return [advice(r) for _, r in ledger[ledger["step"] == TRACE_STEP].sort_values("rank").iterrows()]


def test_gloo_over_cuda_gets_nccl_not_cuda_graphs() -> None:
    tips = _whole_trace_tips(SHARED / "gpu" / "traces" / "h200_ddp_gloo_cuda_2r")
    assert len(tips) == 2
    for tip in tips:
        assert tip.startswith("host-bound: the GPU waited 16")
        assert "the top cause is gloo:all_reduce (159 ms), a host-side collective (gloo): NCCL with one GPU per " \
               "rank" in tip and "CUDA graphs" not in tip


@pytest.mark.parametrize("folder, cause, says", [
    ("kineto_resnet50_1gpu", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ (285 ms), the data loader",
     "num_workers"),
    ("tl_h100_owlv2_1r", "aten::to (500 ms), a host-device copy", "non_blocking=True"),
    ("tracelens_b200_eager_1r", "launch overhead", "CUDA graphs"),
])
def test_foreign_traces_get_their_causes_remedy(folder: str, cause: str, says: str) -> None:
    tip = _whole_trace_tips(SHARED / "traces" / folder)[0]
    assert cause in tip and says in tip, tip
