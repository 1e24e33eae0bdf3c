"""Backward's end is where its computation ended, not after DDP's wait for its buckets; the phase
timer and the recorder are one clock with one anchor.

On CUDA, DDP's reducer waits for each bucket's all-reduce in an autograd final callback it
queues once the last bucket is ready; NCCL's wait makes the *current stream* wait for the
collective, so an event recorded after ``loss.backward()`` returns completes only once every
all-reduce did: a "backward" that holds communication. The distributed checks reproduce that on
2 ranks of ``tests/async_backend`` (NCCL's semantics on CPU: a call returns at enqueue, an op
ends DELAY_MS later on the group's stream; marks on a current stream of their own, a wait that
returns once the op ended) with a model whose parameters' gradient-accumulator nodes carry
DDP's kind of hook: a node post hook that queues a final callback waiting on every unfinished
collective, as the reducer's ``finalize_backward`` does on NCCL. The marks are
:class:`tests.async_backend.StreamEventClock` events on the current stream (CUDA events' stand-in).
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.autograd import Variable

from dpcore.write.capture import comm_log
from dpcore.write.capture.backward_end import BackwardEnd
from dpcore.write.capture.comm_log import EventClock, Recorder
from tests.calibration_clock import rank_reports

DELAY_MS = 300.0
WIDTH = 64


# ------------------------------------------------------------------ no processes
class _HostEvent:
    """An event that completed when it was made (host time), with CUDA's event calls."""

    def __init__(self) -> None:
        self.t = time.perf_counter_ns()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.t - self.t) / 1e6


class _HostEventClock(EventClock):
    """An event clock of host events that counts its marks and anchors; ``drains``: whether it
    says it drained the device (as CUDA's and the test backend's clocks do)."""

    def __init__(self, drains: bool = True, log: list[str] | None = None) -> None:
        self.drains, self.log, self.anchors = drains, log, 0

    def event(self) -> _HostEvent:
        return _HostEvent()

    def mark(self) -> Any:
        if self.log is not None:
            self.log.append("end")
        return super().mark()

    def anchor(self) -> _HostEvent:
        self.anchors += 1
        return _HostEvent()

    def drain(self) -> bool:
        return self.drains


def _reducer_like(params: list[torch.nn.Parameter], log: list[str]) -> list[Any]:
    """DDP's way into backward: a post hook on each parameter's gradient accumulator node that
    queues one final callback per backward (the reducer's ``finalize_backward``). Returns the
    nodes (they must stay alive, as the reducer keeps them)."""
    state = {"queued": False}

    def final() -> None:
        state["queued"] = False
        log.append("ddp wait")

    def post(_grad_inputs: Any, _grad_outputs: Any) -> None:
        if not state["queued"]:
            state["queued"] = True
            Variable._execution_engine.queue_callback(final)

    nodes = []
    for p in params:
        node = p.view_as(p).grad_fn.next_functions[0][0]  # the AccumulateGrad node
        node.register_hook(post)
        nodes.append(node)
    return nodes


def test_the_event_mark_comes_before_ddps_final_callback() -> None:
    """On torch's real autograd engine: the one mark per backward is made in a final callback
    that runs before the one a DDP-style node post hook queues, also when that hook was
    registered first (a model hooked before DDP wraps it), for every backward."""
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    log: list[str] = []
    nodes = _reducer_like(list(net.parameters()), log)
    end = BackwardEnd(_HostEventClock(log=log))
    handles = end.attach(net.parameters())
    for _ in range(2):
        net(torch.randn(4, 8)).sum().backward()
        assert isinstance(end.take(), _HostEvent)
    assert log == ["end", "ddp wait"] * 2, log  # one mark per backward, ahead of the wait
    assert end.take() is None  # taken: no stale end for the next step
    for h in handles:
        h.remove()
    assert nodes


def test_a_backward_that_raised_leaves_the_next_one_marked() -> None:
    """A backward that raises after the first gradient queued the callback never runs it; the
    take before the next backward clears that, so the next one is marked again."""
    net = torch.nn.Linear(4, 1)
    end = BackwardEnd(_HostEventClock())
    end.attach(net.parameters())

    def boom(_p: torch.Tensor) -> None:
        raise RuntimeError("boom")

    h = net.bias.register_post_accumulate_grad_hook(boom)
    with pytest.raises(RuntimeError, match="boom"):
        net(torch.randn(2, 4)).sum().backward()
    h.remove()
    assert end.take() is None
    net(torch.randn(2, 4)).sum().backward()
    assert isinstance(end.take(), _HostEvent)


def test_host_clock_end_is_the_last_gradient() -> None:
    """CPU jobs: the last gradient's accumulation, after ``since``; None when none came after it."""
    net = torch.nn.Linear(4, 1)
    end = BackwardEnd(None)
    end.attach(net.parameters())
    t0 = time.perf_counter_ns()
    net(torch.randn(2, 4)).sum().backward()
    t1 = time.perf_counter_ns()
    got = end.take(t0)
    assert got is not None and t0 < got < t1
    assert end.take(t0) is None


def test_batches_without_a_mark_between_share_one_anchor() -> None:
    """The phase timer's marks and the recorder's edges of a step, resolved one after the
    other on one clock that drained the device, are placed by one anchor; a mark in between or
    a clock that cannot drain gets a new one."""
    clock = _HostEventClock()
    rec = Recorder("j", 0, clock=clock)
    timer = rec.phase_timer()
    assert timer.clock is clock and timer.offset_ns == rec.offset_ns
    timer.start()
    idx = rec.launch("all_reduce", "native", 8)
    rec.done(idx)
    timer.mark("fwd")
    timer.finish()
    rec.resolve()
    assert clock.anchors == 1
    rec.done(rec.launch("all_reduce", "native", 8))  # a mark after the anchor: a new one
    rec.resolve()
    assert clock.anchors == 2
    lone = _HostEventClock(drains=False)
    lone.resolve([lone.mark()])
    lone.resolve([lone.mark()])
    lone.resolve([lone.event()])
    assert lone.anchors == 3


def test_phase_timer_takes_an_earlier_end_of_its_own_clock_only() -> None:
    """``mark(at=...)`` ends the phase at an earlier reading of the timer's own clock; a value of
    the other kind (an event on the host clock, ns on an event clock) or none marks now."""
    from dpcore.write.capture.comm_log import PhaseTimer

    host = PhaseTimer()
    host.start()
    t0 = host.t_start_ns
    time.sleep(0.002)
    host.mark("fwd", at=t0 + 1_000)
    host.mark("bwd", at=_HostEvent())  # not this clock's: now
    got = host.finish()
    assert got["fwd_ms"] == 0.001 and got["bwd_ms"] >= 1.5, got
    clock = _HostEventClock()
    ev = PhaseTimer(clock=clock)
    ev.start()
    early = clock.mark()
    time.sleep(0.02)
    ev.mark("fwd", at=early)
    ev.mark("bwd", at=123)  # ns on an event clock: now
    got = ev.finish()
    assert got["fwd_ms"] < 10.0 and got["bwd_ms"] >= 15.0, got


def test_record_times_its_phases_on_the_recorders_clock(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Any) -> None:
    """``dpcore.record`` on an event clock (the clock a CUDA device gets, faked here on the
    CPU): its phase timer is the recorder's clock object, not a second clock of its own."""
    from dpcore.write.commands.record import record

    monkeypatch.setattr(comm_log, "clock_for", lambda device: _HostEventClock())
    with record(tmp_path, warmup=0, trace=False) as rec:
        for _ in range(2):
            with rec.step():
                torch.randn(8, 8) @ torch.randn(8, 8)
        assert rec._timer.clock is rec.rec.clock is not None
    assert [r["step"] for r in rec._rows] == [0, 1]


# ------------------------------------------------------------------ 2 ranks, NCCL's semantics
class WaitsLikeDDPOnNCCL(torch.nn.Module):
    """An MLP whose gradient accumulators carry a DDP-like node post hook: its final callback
    waits on every collective not finished yet, so a mark made after it reads no earlier than
    their ends, as the reducer's ``finalize_backward`` does to the stream on NCCL."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH))
        self._nodes: list[Any] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._nodes:  # hooked once, before the first backward (DDP is built by then)
            self._nodes = [p.view_as(p).grad_fn.next_functions[0][0] for p in self.parameters()]
            for node in self._nodes:
                node.register_hook(self._queue_wait)
        return self.body(x)

    def _queue_wait(self, _gi: Any, _go: Any) -> None:
        if not getattr(self, "_queued", False):
            self._queued = True
            Variable._execution_engine.queue_callback(self._wait)

    def _wait(self) -> None:
        from tests import async_backend as ab
        self._queued = False
        for w in list(ab.group_of().works):
            if not w.is_completed():
                w.wait()


def wait_workload() -> Any:
    """``--model tests.write.capture.test_backward_end:wait_workload``."""
    from dpcore.write.training.workload import Workload

    def batch(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, WIDTH, generator=g), torch.randn(n, WIDTH, generator=g)

    return Workload(WaitsLikeDDPOnNCCL(), batch, torch.nn.functional.mse_loss)


def _both_paths(rank: int, n: int) -> dict:
    """A profile step of torch_ddp (trainer + phase timer) and a recording's calibration, each
    with the real ends of the all-reduces it issued (the backend's stream stamps them)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from dpcore.contract.config import TrainConfig
    from dpcore.write.commands.record_hooks import HookState, calibrate_recording, recording_allreduce_hook
    from dpcore.write.runtime.context import DistContext
    from dpcore.write.training.trainer import make_trainer
    from tests import async_backend as ab

    # groups made from now on: marks on a current stream of their own (they do not queue behind
    # the collectives); a wait blocks until the op ended, so a mark made after it reads no
    # earlier than the op's end, as a CUDA event recorded after NCCL's wait does (DDP's
    # construction reads its all-gathers' results on the host, so stream-only waits won't do)
    ab.configure(DELAY_MS, "blocking", streams=2)
    world = ab.group_of(dist.new_group(backend=ab.BACKEND))
    dist.distributed_c10d._update_default_pg(world)  # DDP and the trainer use the default group
    ctx = DistContext(rank=rank, world_size=n, local_rank=rank, backend=ab.BACKEND,
                      device=torch.device("cpu"), threads=1)
    cfg = TrainConfig(model=f"{__name__}:wait_workload", batch_size=8, steps=1, warmup=0, profile_steps=0)

    # the profile path: Trainer.step's bwd mark, on the recorder's clock
    rec = Recorder("t", rank, clock=ab.StreamEventClock(world))
    trainer = make_trainer("torch_ddp", ctx, cfg, recorder=rec, bucket_mb=25.0)
    world.synchronize()
    timer = rec.phase_timer()
    out: dict[str, Any] = {"same_clock": timer.clock is rec.clock}
    x, y = trainer.batch(0)
    first = len(world.works)
    rec.step = 0
    trainer.step(x, y, timer)
    rec.step = -1
    timing = timer.finish()
    world.synchronize()
    out["trainer"] = {"bwd_end_ns": timing["t_start_ns"] + (timing["fwd_ms"] + timing["bwd_ms"]) * 1e6,
                      "sync_ms": timing["sync_ms"],
                      "ar_end_ns": [w.end_ns for w in world.works[first:]]}

    # the recording's calibration: backward's window of each step
    torch.manual_seed(0)
    rec2 = Recorder("c", rank, clock=ab.StreamEventClock(world))
    recording = SimpleNamespace(rec=rec2, ctx=SimpleNamespace(rank=rank, device=torch.device("cpu")),
                                _tracing=False)
    model = DistributedDataParallel(WaitsLikeDDPOnNCCL(), bucket_cap_mb=25.0, process_group=world)
    model.register_comm_hook(HookState(world, recording), recording_allreduce_hook)
    xc = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(rank))
    first = len(world.works)
    cal = calibrate_recording(recording, model, lambda m: m(xc).pow(2).mean(), 25.0, 1)
    world.synchronize()
    out["calibration"] = {"cal": cal, "ends_ns": [w.end_ns for w in world.works[first:]]}
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return rank_reports(_both_paths, tmp_path_factory.mktemp("backward-end"))


@pytest.mark.slow
def test_trainer_backward_ends_before_the_all_reduce_does(reports: list[dict]) -> None:
    """The bwd phase ends before its bucket's all-reduce ended on the stream, and the wait for
    it (DELAY_MS at least) is grad sync. Fails on the old code: the bwd mark was taken after
    backward() returned, behind the wait, so it came after the all-reduce's end and sync_ms
    held none of it."""
    for rep in reports:
        tr = rep["trainer"]
        assert rep["same_clock"]
        assert tr["ar_end_ns"] and min(tr["ar_end_ns"]) > 0, tr
        assert tr["bwd_end_ns"] < max(tr["ar_end_ns"]), tr
        assert tr["sync_ms"] >= DELAY_MS * 0.75, tr


@pytest.mark.slow
def test_calibration_backward_window_leaves_out_ddps_wait(reports: list[dict]) -> None:
    """The recording's calibration: each step's backward window ends before that step's
    all-reduce ended on the stream (the window used to end after DDP's wait for it)."""
    for rep in reports:
        cal, ends = rep["calibration"]["cal"], rep["calibration"]["ends_ns"]
        steps = [st for plan in cal["plans"] for st in plan["steps"]]
        assert len(steps) == 2, cal
        for st in steps:
            assert st["end_ms"] and None not in st["end_ms"], st
            # this step's all-reduces' real ends: the first op the stream ended after the window began
            mine = [e / 1e6 for e in ends if e / 1e6 > st["bwd_start_ms"]]
            assert mine, (st, ends)
            assert st["bwd_end_ms"] < min(mine), (st, mine)
