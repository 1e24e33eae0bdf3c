"""TraceCapture settles gloo's collectives at the one moment that matters: after the last
recorded step has ended and before the profiler stops (README, "The SIGABRT over gloo": a
collective's profiler range can still be open on gloo's thread when its future completes, and
stopping the profiler then frees what that thread writes into). The order is checked, not the
race hunted."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dpcore.write.capture.tracing import TraceCapture
from dpcore.write.runtime.launch import settle_collectives


def _events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_settle_runs_once_after_the_last_step_and_before_the_stop(tmp_path: Path) -> None:
    seen: list[tuple[int, bool, bool]] = []
    cap: TraceCapture

    def settle() -> None:
        # what the profiler's state is when settling: still recording, nothing exported yet
        seen.append((steps_done, torch.autograd.profiler._is_profiler_enabled, cap.exported))
        with torch.profiler.record_function("settle-mark"):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))

    cap = TraceCapture(tmp_path, 0, "j", 0, first=1, last=3, warmup_step=0, settle=settle)
    cap.start()
    steps_done = 0
    for _ in range(4):  # the warm-up step, then steps 1..3
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
        cap.step()
        steps_done += 1
    assert cap.exported and not torch.autograd.profiler._is_profiler_enabled
    cap.stop()
    # once, in the step() that ended step 3 (the 4th), profiler on, trace not yet written
    assert seen == [(3, True, False)]
    ev = _events(cap.trace_file)
    steps = {e["name"]: e for e in ev if e.get("name", "").startswith("ProfilerStep#")}
    assert sorted(steps) == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    mark = next(e for e in ev if e.get("name") == "settle-mark")
    last = steps["ProfilerStep#3"]
    assert mark["ts"] >= last["ts"] + last["dur"]  # outside every recorded step


def test_an_early_stop_does_not_settle(tmp_path: Path) -> None:
    """A rank that stops early (an error in a step) must not wait in a barrier the other ranks
    may never reach."""
    asked: list[int] = []
    cap = TraceCapture(tmp_path, 0, "j", 0, first=1, last=3, warmup_step=0, settle=lambda: asked.append(1))
    cap.start()
    for _ in range(2):
        cap.step()
    cap.stop()
    assert asked == [] and cap.exported  # what was recorded is still written


def test_settle_collectives_is_a_barrier_on_gloo_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append("barrier"))
    settle_collectives()  # no process group: nothing to wait for
    assert calls == []
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        settle_collectives()
        assert calls == ["barrier"]
        monkeypatch.setattr(dist, "get_backend", lambda *a, **k: "nccl")
        settle_collectives()
        assert calls == ["barrier"]
    finally:
        dist.destroy_process_group()
