"""TraceCapture records the ops' shapes (what a GEMM's FLOPs and MFU are read from) on a GPU
only: on a CPU job they would cost the traced steps without giving a number."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dpcore.write.capture import tracing
from dpcore.write.capture.tracing import TraceCapture


def _trace(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def test_a_cpu_capture_records_no_shapes(tmp_path: Path) -> None:
    cap = TraceCapture(tmp_path, 0, "j", 0, first=1, last=2, warmup_step=0)
    cap.start()
    a = torch.randn(32, 16)
    for _ in range(3):
        torch.mm(a, a.T)
        cap.step()
    cap.stop()
    mm = [e for e in _trace(cap.trace_file)["traceEvents"] if e.get("name") == "aten::mm"]
    assert mm and not any("Input Dims" in e.get("args", {}) for e in mm)


@pytest.mark.parametrize("cuda", [False, True])
def test_shapes_are_asked_for_exactly_on_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    asked: dict[str, Any] = {}
    real = torch.profiler.profile

    def spy(*args: Any, **kwargs: Any) -> Any:
        asked.update(kwargs)
        kwargs["activities"] = [torch.profiler.ProfilerActivity.CPU]  # no GPU here: profile the CPU
        return real(*args, **kwargs)

    monkeypatch.setattr(tracing.torch.profiler, "profile", spy)
    cap = TraceCapture(tmp_path, 0, "j", 0, first=1, last=2, warmup_step=None, cuda=cuda)
    cap.start()
    cap.stop()
    assert asked["record_shapes"] is cuda
