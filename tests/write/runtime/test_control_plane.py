"""dpcore's own messages (run folder name, gathered rows, run-level barriers, clock sync) go over
the gloo control group in every module that sends them, never the job's group.

Checked two ways: by reading the code (no module that runs a run's life cycle calls an object
collective or a barrier of ``torch.distributed`` itself: only :mod:`dpcore.write.runtime.control`
does), and by running the paths against a faked NCCL job (:mod:`tests.fake_cuda`).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fake_cuda import FakeHost, torchrun_env

ROOT = Path(__file__).resolve().parents[3]
#: the modules that carry dpcore's own messages; each must send them through control
CARRIERS = ("dpcore/write/runtime/world.py", "dpcore/write/runtime/clock.py",
            "dpcore/write/capture/run_lifecycle.py", "dpcore/write/commands/record.py",
            "dpcore/integrations/trace_handler.py")
OWN_MESSAGES = {"broadcast_object_list", "gather_object", "all_gather_object", "barrier",
                "scatter_object_list"}


def _calls_without_group(path: Path) -> list[str]:
    """``dist.<object collective or barrier>(...)`` calls that name no ``group=``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in OWN_MESSAGES and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "dist"
                and not any(k.arg == "group" for k in node.keywords)):
            out.append(f"{path.name}:{node.lineno}: dist.{node.func.attr}")
    return out


def test_no_carrier_sends_dpcores_messages_on_the_jobs_group() -> None:
    found = [c for rel in CARRIERS for c in _calls_without_group(ROOT / rel)]
    assert found == [], "dpcore's own messages must go over runtime.control: " + ", ".join(found)


def test_the_checker_sees_such_a_call(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text("import torch.distributed as dist\ndist.barrier()\n"
                   "dist.gather_object(1, None, group=g)\n")
    assert _calls_without_group(src) == ["x.py:2: dist.barrier"]


def test_trace_handler_names_its_run_over_the_control_group(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    """Rank 1 of an NCCL job learns the run's folder from rank 0 over gloo, on no GPU."""
    from dpcore.integrations.trace_handler import TraceHandler
    host = FakeHost(monkeypatch, gpus=2, rank=1, world_size=2, box=["trace-run-1"])
    torchrun_env(monkeypatch, 1, 1, 2, 2)
    import torch.distributed as dist
    dist.init_process_group("nccl")
    handler = TraceHandler(tmp_path, None)
    assert handler._open(1, 2) == tmp_path / "trace-run-1"
    (call,) = host.collectives()
    assert (call.name, call.args["backend"]) == ("broadcast_object_list", "gloo")
    assert call.args["group"] is not host.world


def test_record_binds_the_models_gpu_while_it_records(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """A loop whose model is on cuda:3 and which never called set_device: while recording, GPU 3
    is current (the phase timer's CUDA events and synchronize act on it); after, GPU 0 again."""
    import dpcore
    host = FakeHost(monkeypatch, gpus=4, rank=0, world_size=1)
    rec: Any = dpcore.record(tmp_path)
    rec._bind(torch.device("cuda", 3))
    assert host.current == 3
    for undo in reversed(rec._undo):
        undo()
    assert host.current == 0
    rec._bind(torch.device("cpu"))  # a CPU model: nothing to bind
    assert [c.args["index"] for c in host.calls if c.name == "set_device"] == [3, 0]
