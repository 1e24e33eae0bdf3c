"""``dpcore.trace_handler``: a real 2-rank gloo DDP loop under torch.profiler, two profiling
cycles, one run with the steps of both cycles that ``summarize`` and the dashboard open."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

import dpcore
from dpcore.read.rundir import load_run
from tests.integrations.helpers import free_port, opens_everywhere

STEPS = 9  # schedule wait 1, warmup 1, active 2, repeat 2: cycles trace steps 2-3 and 6-7


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    handler = dpcore.trace_handler(out, name="handler")
    sched = schedule(wait=1, warmup=1, active=2, repeat=2)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=handler) as prof:
        for _ in range(STEPS):
            x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    assert handler.cycles == 2 and handler.run_dir is not None
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for attempt in (1, 2):
        out = tmp_path_factory.mktemp("profiles")
        try:
            torch.multiprocessing.spawn(_worker, args=(free_port(), str(out)), nprocs=2, join=True)
            break
        except torch.multiprocessing.ProcessExitedException as exc:
            # Once in three CI runs a rank died inside native code ("malloc(): unsorted double linked
            # list corrupted", SIGABRT) while profiling with gloo; not understood yet (closing note).
            # A rank killed by a signal gets one more try; an exception in a rank fails at once.
            if attempt == 2 or not getattr(exc, "signal_name", None):
                raise
            warnings.warn(f"trace_handler job: a rank died by a signal ({exc}); tried once more", stacklevel=1)
    runs = [d for d in out.iterdir() if d.is_dir()]
    assert len(runs) == 1, runs  # two cycles, one run
    return runs[0]


def test_two_cycles_are_steps_of_one_run(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.meta["kind"] == "trace_handler" and run.meta["status"] == "complete"
    assert run.meta["config"]["cycles"] == 2 and "handler" in run_dir.name
    job = run.meta["jobs"][0]
    assert job["id"] == "imported-ws2" and job["world_size"] == 2 and job["ranks"] == [0, 1]
    st = run.steps
    assert sorted(st["step"].unique()) == [2, 3, 6, 7]  # the loop's own step numbers
    assert len(st) == 8 and sorted(st["rank"].unique()) == [0, 1]
    assert (st["step_ms"] > 0).all() and (st["fwd_ms"] > 0).all()
    assert (st["comm_ops"] >= 1).all()  # DDP's bucket all-reduce, seen in each step's trace
    assert len(run.collectives) == int(st["comm_ops"].sum())
    assert run.traced_steps(job["id"]) == [2, 3, 6, 7]


def test_summarize_and_dashboard_open_it(run_dir: Path, capsys, monkeypatch) -> None:
    csv = opens_everywhere(run_dir, capsys, monkeypatch)
    assert csv.splitlines()[1].startswith("imported-ws2,")


def test_lazy_and_cheap() -> None:
    """``dpcore.trace_handler`` is the integrations module's own function, and asking for it
    never builds a run (nothing is written before the first cycle)."""
    from dpcore.integrations.trace_handler import TraceHandler, trace_handler
    assert dpcore.trace_handler is trace_handler
    h = dpcore.trace_handler("nowhere-yet")
    assert isinstance(h, TraceHandler) and h.run_dir is None and not Path("nowhere-yet").exists()
