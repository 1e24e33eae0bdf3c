"""``dpcore.record`` settles gloo's collectives before its profiler stops (README, "The SIGABRT
over gloo"): gloo completes a collective's future (what DDP waits on) before its worker thread
ends the collective's profiler range, and a profiler stopped in between frees the event list
that thread then writes into. A CI run lost a rank of ``test_record_comm_hook``'s job to
SIGABRT ("terminate called without an active exception") while record's capture stopped
unsettled.

The window is made wide instead of hunted: the user's comm hook keeps gloo's thread ``HOLD_S``
after each all-reduce's future has completed (DDP's wait has returned by then), as
``scripts/repro_profiler_gloo_abort.py --hold-ms`` does. Known answer: settled, the traced
step's all-reduce range lasts the whole hold; unsettled, the stop cuts it short (the write into
freed memory that valgrind reports). The hook orders rank 0's hold onto gloo's thread
(:func:`_held_allreduce`), and each rank leaves without interpreter teardown
(:mod:`tests.spawned`: the SIGABRT one later CI run saw here came from that teardown, after the
trace was written).
"""
from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from dpcore.contract import runformat
from dpcore.write.commands.record import record
from tests import spawned

HOLD_S = 0.3
WARMUP, PROFILED, STEPS = 1, 1, 3


class _Hold:
    """The comm hook's state: the hold, and a side store that orders rank 0's callbacks first."""

    def __init__(self, hold_s: float, side: dist.Store, rank: int) -> None:
        self.hold_s, self.side, self.rank, self.calls = hold_s, side, rank, 0


def _held_allreduce(state, bucket):  # no annotations: DDP checks them, and they are strings here
    """DDP's default all-reduce, then ``hold_s`` more on gloo's thread, its range still open.

    Rank 1 enters each all-reduce only once rank 0's callbacks are on its future, so rank 0's
    all-reduce cannot complete before they are: its hold always runs on gloo's thread. Unordered,
    a rank descheduled between the call and ``then`` finds the future complete, and the hold
    runs at once on its own thread, inside the step, with nothing left open (seen: a 0.3 ms
    range in a 303 ms step, about one run in twenty here). Rank 1's own future may complete
    first, so only rank 0's range is the known answer."""
    n, state.calls = state.calls, state.calls + 1
    if state.rank == 1:
        state.side.get(f"attached{n}")  # blocks until rank 0's callbacks are attached
    buf = bucket.buffer().div_(dist.get_world_size())
    fut = dist.all_reduce(buf, async_op=True).get_future()
    done = fut.then(lambda f: f.value()[0])  # DDP waits on this one: it runs first
    fut.then(lambda _f: time.sleep(state.hold_s))
    if state.rank == 0:
        state.side.set(f"attached{n}", "1")
    return done


def _rank(rank: int, store: str, out: str, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)))
        side = dist.FileStore(f"{store}.side", 2)
        model.register_comm_hook(_Hold(HOLD_S, side, rank), _held_allreduce)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with record(out, name="held", model=model, warmup=WARMUP, profile_steps=PROFILED) as rec:
            for _ in range(steps):
                with rec.step():
                    nn.functional.cross_entropy(model(torch.randn(16, 64)), torch.randint(0, 8, (16,))).backward()
                    opt.step()
                    opt.zero_grad()
        dist.barrier()  # the last held callbacks end before the group goes
    finally:
        dist.destroy_process_group()
    spawned.leave()


def _allreduce_ranges(trace: Path, step: int) -> list[float]:
    """The durations (ms) of the gloo all-reduce ranges that start inside ``ProfilerStep#step``."""
    ev = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    st = next(e for e in ev if e.get("name") == f"ProfilerStep#{step}")
    return [e["dur"] / 1e3 for e in ev
            if e.get("ph") == "X" and "all_reduce" in e.get("name", "") and "gloo" in e.get("name", "")
            and st["ts"] <= e["ts"] <= st["ts"] + st["dur"]]


@pytest.mark.parametrize("steps", [STEPS, WARMUP + 1], ids=["after-last-traced-step", "loop-ends-early"])
def test_the_held_allreduce_range_outlives_the_hold(tmp_path: Path, steps: int) -> None:
    """``after-last-traced-step``: the profiler stops in the step after the traced one;
    ``loop-ends-early``: the loop ends on the traced step itself, so the profiler stops at the
    block's exit (settled there too: every rank left the loop cleanly)."""
    out = tmp_path / "profiles"
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(out), steps), nprocs=2, join=True)
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    job = json.loads((run / "run.json").read_text())["jobs"][0]
    assert job["status"] == "complete", job
    for r in range(2):
        trace = runformat.trace_dir(run, job["id"]) / runformat.rank_trace_name(r)
        durs = _allreduce_ranges(trace, WARMUP)
        assert durs, f"rank {r}: no gloo all-reduce range in the traced step"
        if r == 0:  # each bucket's range holds gloo's thread HOLD_S after DDP's wait returned
            assert min(durs) >= HOLD_S * 1e3 * 0.95, (r, durs)
