"""``dpcore.trace_handler``: a real 2-rank gloo DDP loop under torch.profiler, two profiling
cycles, one run with the steps of both cycles that ``summarize`` and the dashboard open; and
``handler.schedule``, which keeps the profiler from stopping while gloo's thread still owes a
collective's profiler range its end (the use-after-free behind the SIGABRT: README)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

import dpcore
from dpcore.read.rundir import load_run
from tests import spawned
from tests.integrations.helpers import free_port, opens_everywhere

STEPS = 9  # schedule wait 1, warmup 1, active 2, repeat 2: cycles trace steps 2-3 and 6-7


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    handler = dpcore.trace_handler(out, name="handler")
    sched = handler.schedule(wait=1, warmup=1, active=2, repeat=2)
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
    spawned.leave()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profiles")
    torch.multiprocessing.spawn(_worker, args=(free_port(), str(out)), nprocs=2, join=True)
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


def test_schedule_settles_exactly_where_the_profiler_stops(monkeypatch) -> None:
    """``handler.schedule`` answers like torch's schedule and settles once per cycle, when asked
    about the step after a RECORD_AND_SAVE step (the call after which torch.profiler stops)."""
    from torch.profiler import ProfilerAction, schedule

    import dpcore.integrations.trace_handler as th
    asked: list[int] = []
    monkeypatch.setattr(th, "settle_collectives", lambda: asked.append(step))
    mine = dpcore.trace_handler("nowhere-yet").schedule(wait=1, warmup=1, active=2, repeat=2)
    torch_s = schedule(wait=1, warmup=1, active=2, repeat=2)
    for step in range(STEPS):
        assert mine(step) == torch_s(step)
    assert asked == [4, 8]
    assert [n for n in range(STEPS) if torch_s(n) == ProfilerAction.RECORD_AND_SAVE] == [3, 7]


HOLD_S = 0.3  # gloo's thread held this long after each all-reduce's future completes


def _held_worker(rank: int, port: int, side_port: int, out: str) -> None:
    """rank 1 enters each all-reduce only after rank 0 has attached, to the all-reduce's future,
    a callback that holds gloo's thread after DDP-style waiting on the future has returned: the
    collective's profiler range is still open when the cycle's last prof.step() comes. The order
    is forced through a side store, not a sleep: on a loaded machine rank 0 can be descheduled
    past any sleep, the future is then complete when the callback is attached, and the callback
    runs on rank 0's own thread, holding nothing open."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    side = dist.TCPStore("127.0.0.1", side_port, 2, is_master=rank == 0)
    handler = dpcore.trace_handler(out, name="held")
    t = torch.ones(1024)
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=handler,
                 schedule=handler.schedule(wait=0, warmup=0, active=1, repeat=2)) as prof:
        for i in range(3):
            if rank == 1:
                side.get(f"attached{i}")  # blocks until rank 0's callback is on the future
            fut = dist.all_reduce(t, async_op=True).get_future()
            if rank == 0:
                fut.then(lambda _f: time.sleep(HOLD_S))
                side.set(f"attached{i}", "1")
            fut.wait()
            prof.step()
    dist.barrier()  # the last held callback ends before the group is destroyed
    dist.destroy_process_group()


def test_settled_schedule_waits_for_the_open_range(tmp_path: Path) -> None:
    """With the range still open at the cycle's end, ``handler.schedule`` holds the profiler
    until gloo's thread has ended it: rank 0's traced all-reduces last the whole hold. (Without
    it the profiler stops first and the range's end is written into freed memory later; the
    trace then shows it ending at the stop, well before the hold is over: README.)"""
    from dpcore.contract.tracefile import load_trace
    torch.multiprocessing.spawn(_held_worker, args=(free_port(), free_port(), str(tmp_path)), nprocs=2, join=True)
    (run,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    _, events = load_trace(run / "traces" / "imported-ws2" / "rank0.json.gz")
    spans = [e["dur"] for e in events if e.get("name") == "gloo:all_reduce" and "dur" in e]
    assert len(spans) == 2  # one per cycle
    assert min(spans) >= HOLD_S * 1e6, spans
