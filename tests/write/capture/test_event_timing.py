"""Device-timed intervals: collectives, the DDP hook, the tap, from-scratch messages and phases
end when the work completed, not when an NCCL-like backend returned.

The ranks run on ``tests/async_backend`` (``dpcore_async``): NCCL's semantics on CPU, every op
taking DELAY_MS on the group's stream after its math, its future completed at enqueue. On it,
the host clock (today's CPU path, and what the recorder did on CUDA before it timed with
events) stamps ~0 ms; the recorder's :class:`EventClock`, fed by the backend's stream events
(:class:`tests.async_backend.StreamEventClock`, the stand-in for CUDA events), stamps >= DELAY.
Every end is also checked against the backend's own record of when the op completed.

The resolution arithmetic itself (anchor, elapsed_time) is checked without processes.
One spawn of 2 ranks runs every distributed check; a failing check is reported with its name.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dpcore.write.capture import comm_log
from dpcore.write.capture.comm_log import EventClock, PhaseTimer, Recorder

DELAY_MS = 200.0
#: what "~0" means for a host stamp of a call that returns at enqueue, and how far an event end
#: may sit from the backend's own completion stamp (the test backend's stream thread and the
#: anchor's two host reads wait for the GIL: tens of ms on a loaded box); half of DELAY_MS, so
#: both still tell a completion from a launch
ZERO_MS = DELAY_MS / 2
SPAWN_TIMEOUT_S = 240.0


# ------------------------------------------------------------------ resolution, no processes
class _FakeEvent:
    """An event whose device time is known: elapsed_time as CUDA's (ms, end - start)."""

    def __init__(self, device_ns: int) -> None:
        self.device_ns = device_ns
        self.synced = False

    def synchronize(self) -> None:
        self.synced = True

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.device_ns - self.device_ns) / 1e6


class _ScriptedClock(EventClock):
    """The device clock runs 7 s ahead of the host; the anchor is taken at host time 1000 ns
    after the first host read (a 2000 ns window: t0 = 10_000, t1 = 12_000)."""

    def __init__(self) -> None:
        self.device_now = 0

    def event(self) -> _FakeEvent:
        return _FakeEvent(self.device_now)


def test_resolve_places_events_on_the_host_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _ScriptedClock()
    reads = iter([10_000, 12_000])
    monkeypatch.setattr(comm_log, "_perf_ns", lambda: next(reads))
    ahead = 7_000_000_000
    events = [_FakeEvent(ahead + t) for t in (1_000, 4_500, 9_000)]
    clock.device_now = ahead + 11_000  # the anchor executes at host 11_000 (mid of t0, t1)
    got = clock.resolve(events)
    assert got == [1_000, 4_500, 9_000]
    assert all(ev.synced for ev in events)


def test_recorder_rows_hold_resolved_shared_clock_ns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pending events in collective and message rows become ns + the rank's offset at export."""
    clock = _ScriptedClock()
    rec = Recorder("j", 1, offset_ns=500, clock=clock)
    rec.step = 3
    clock.device_now = 100
    idx = rec.launch("all_reduce", "native", 64)   # start event at device 100
    clock.device_now = 40_100
    rec.done(idx)                                  # end event at device 40_100
    t_post = rec.mark()
    clock.device_now = 90_100
    rec.message("ring", 0, "reduce_scatter", 0, 1, 0, 1, 32, t_post, rec.mark(), "send")
    clock.device_now = 100_100  # anchor
    reads = iter([200_000, 200_000])
    monkeypatch.setattr(comm_log, "_perf_ns", lambda: next(reads))
    coll = rec.collective_rows()
    msgs = rec.message_rows()
    # anchor at host 200_000 = device 100_100: device d -> host d + 99_900, + offset 500
    assert coll[0]["t_start_ns"] == 100_500
    assert coll[0]["t_end_ns"] == 140_500
    assert (msgs[0]["t_post_ns"], msgs[0]["t_done_ns"]) == (140_500, 190_500)


def test_host_clock_recorder_is_unchanged() -> None:
    """Without an event clock (CPU jobs) nothing is pending and t_start stays unknown."""
    rec = Recorder("j", 0, offset_ns=10)
    idx = rec.launch("all_reduce", "native", 8)
    rec.done(idx)
    row = rec.collective_rows()[0]
    assert rec.clock is None and isinstance(row["t_end_ns"], int) and row["t_end_ns"] >= row["t_launch_ns"]
    assert rec.mark() <= rec.now()


def test_the_device_picks_the_clock() -> None:
    """CUDA events on a CUDA device (the trainer's and allreduce's ``time_on``, the phase
    timer), the host clock on CPU; an injected clock is kept. Nothing here touches a GPU."""
    from dpcore.write.capture.comm_log import CudaEventClock, clock_for
    assert clock_for("cpu") is None and clock_for(None) is None
    cuda = clock_for("cuda:1")
    assert isinstance(cuda, CudaEventClock) and cuda.device == torch.device("cuda:1")
    rec = Recorder("j", 0)
    rec.time_on(torch.device("cpu"))
    assert rec.clock is None
    rec.time_on(torch.device("cuda", 0))
    assert isinstance(rec.clock, CudaEventClock)
    mine = _ScriptedClock()
    kept = Recorder("j", 0, clock=mine)
    kept.time_on(torch.device("cpu"))
    assert kept.clock is mine
    assert isinstance(PhaseTimer(torch.device("cuda", 0)).clock, CudaEventClock)
    assert PhaseTimer(torch.device("cpu")).clock is None


def test_an_op_starts_only_once_the_current_stream_reached_its_launch() -> None:
    """The test backend's two streams, as NCCL's: an op waits for the current stream to reach
    the point where it was issued, so a mark taken before the call is never stamped after the
    op started (the race behind a 198 ms message under a 200 ms delay, CI of stop 54)."""
    from datetime import timedelta

    from tests import async_backend as ab
    delay_s = 0.02
    pg = ab.AsyncTestProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=30), delay_s=delay_s,
                                  wait_blocks=False, streams=2)
    gate = ab._Op(None)          # the current stream waits for this: it holds the stream
    pg._current.put(gate)
    t_post = pg.record_event()   # queued behind the gate, as a mark behind earlier work
    work = pg.allreduce([torch.ones(4)])
    time.sleep(10 * delay_s)
    assert not work.is_completed()  # it would have, 20 ms after the call, without the wait
    released = time.perf_counter_ns()
    gate.done.set()
    pg.synchronize()
    assert t_post.time_ns >= released
    assert (work.end_ns - t_post.time_ns) / 1e9 >= delay_s


# ------------------------------------------------------------------ distributed checks
def _dur_ms(t0: Any, t1: Any) -> float:
    return (int(t1) - int(t0)) / 1e6


def _checks(rank: int, n: int) -> dict[str, Any]:
    """Run on every rank; returns name -> measured values (the test asserts on them)."""
    from dpcore.write.capture.collective_tap import CollectiveTap
    from dpcore.write.dp.comm.central import central_all_reduce
    from dpcore.write.dp.comm.naive import naive_all_reduce
    from dpcore.write.dp.comm.ring import ring_all_reduce
    from dpcore.write.dp.variants.torch_ddp import TorchDDP
    from tests import async_backend as ab

    out: dict[str, Any] = {}
    world = ab.group_of()
    ab.configure(DELAY_MS, "stream")
    stream_wait = dist.new_group(backend=ab.BACKEND)  # wait() returns at once, as NCCL's
    sw = ab.group_of(stream_wait)

    def rec(clock: Any) -> Recorder:
        return Recorder("t", rank, offset_ns=0, clock=clock)

    # 1. an async collective tracked through its future (the bucketed/overlap/fsdp path)
    for name, clock in (("host", None), ("event", ab.StreamEventClock(world))):
        r = rec(clock)
        t = torch.ones(1000)
        idx = r.launch("all_reduce", "native", 4000)
        w = r.track(idx, dist.all_reduce(t, async_op=True))
        w.wait()
        row = r.collective_rows()[0]
        real_end = world.works[-1].end_ns
        out[f"track_{name}"] = {"ms": _dur_ms(row["t_launch_ns"], row["t_end_ns"]),
                                "after_real_end_ms": (row["t_end_ns"] - real_end) / 1e6,
                                "value": t[0].item()}
    # 2. a blocking collective on a group whose wait only orders the stream
    for name, clock in (("host", None), ("event", ab.StreamEventClock(stream_wait))):
        r = rec(clock)
        t = torch.ones(10)
        idx = r.launch("broadcast", "native", 40)
        dist.broadcast(t, 0, group=stream_wait)
        r.done(idx)
        row = r.collective_rows()[0]
        out[f"blocking_{name}"] = {"ms": _dur_ms(row["t_launch_ns"], row["t_end_ns"]),
                                   "after_real_end_ms": (row["t_end_ns"] - sw.works[-1].end_ns) / 1e6}
    sw.synchronize()
    # 3. the collective tap (a DDP hook dpcore did not write): async and blocking calls
    for name, clock in (("host", None), ("event", ab.StreamEventClock(world))):
        r = rec(clock)
        tap = CollectiveTap(None, lambda r=r: r, lambda: True).install()
        try:
            w = dist.all_reduce(torch.ones(100), async_op=True)
            w.wait()
            ends = [world.works[-1].end_ns]
            dist.all_reduce(torch.ones(100))
            ends.append(world.works[-1].end_ns)
        finally:
            tap.remove()
        rows = r.collective_rows()
        out[f"tap_{name}"] = {"ms": [_dur_ms(c["t_launch_ns"], c["t_end_ns"]) for c in rows],
                              "after_real_end_ms": [(c["t_end_ns"] - e) / 1e6 for c, e in zip(rows, ends)]}
    # 4. torch_ddp's recording comm hook (its end was stamped in the future's callback)
    for name, clock in (("host", None), ("event", ab.StreamEventClock(world))):
        r = rec(clock)
        torch.manual_seed(0)
        model = TorchDDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)),
                         recorder=r, bucket_mb=0.01)
        r.clear()  # DDP's construction broadcasts
        r.step = 0
        first = len(world.works)
        model(torch.ones(8, 64)).sum().backward()
        world.synchronize()
        rows = r.collective_rows()
        ends = [w.end_ns for w in world.works[first:]]
        out[f"ddp_{name}"] = {"ms": [_dur_ms(c["t_launch_ns"], c["t_end_ns"]) for c in rows],
                              "after_real_end_ms": [(c["t_end_ns"] - e) / 1e6 for c, e in zip(rows, ends)],
                              "buckets": len(rows)}
        del model
    # 5. from-scratch messages (batched on NCCL, as there), on the stream-wait group
    for algo, fn in (("ring", lambda t, r: ring_all_reduce(t, group=stream_wait, recorder=r, batched=True)),
                     ("naive", lambda t, r: naive_all_reduce(t, group=stream_wait, recorder=r, batched=True)),
                     ("central", lambda t, r: central_all_reduce(t, group=stream_wait, recorder=r))):
        for name, clock in (("host", None), ("event", ab.StreamEventClock(stream_wait))):
            r = rec(clock)
            fn(torch.ones(64), r)
            sw.synchronize()
            msgs = r.message_rows()
            out[f"msg_{algo}_{name}"] = [_dur_ms(m["t_post_ns"], m["t_done_ns"]) for m in msgs]
    # 5b. the same on a group whose marks sit on a current stream of their own: only a wait
    #     makes that stream wait for an op, so a mark placed before the wait reads the launch
    ab.configure(DELAY_MS, "stream", streams=2)
    two = dist.new_group(backend=ab.BACKEND)
    tw = ab.group_of(two)
    r = rec(ab.StreamEventClock(two))
    t_post = r.mark()
    w = dist.all_reduce(torch.ones(8), group=two, async_op=True)
    early = r.mark()  # misplaced on purpose: before the wait
    w.wait()
    r.message("probe", 0, "x", 0, 0, 1, 0, 32, t_post, early, "send")
    r.message("probe", 0, "x", 0, 0, 1, 0, 32, t_post, r.mark(), "send")
    out["two_probe"] = [_dur_ms(m["t_post_ns"], m["t_done_ns"]) for m in r.message_rows()]
    r = rec(ab.StreamEventClock(two))
    idx = r.launch("broadcast", "native", 40)
    dist.broadcast(torch.ones(10), 0, group=two)
    r.done(idx)
    row = r.collective_rows()[0]
    out["two_blocking"] = {"ms": _dur_ms(row["t_launch_ns"], row["t_end_ns"]),
                           "after_real_end_ms": (row["t_end_ns"] - tw.works[-1].end_ns) / 1e6}
    for algo, fn in (("ring", lambda t, r: ring_all_reduce(t, group=two, recorder=r, batched=True)),
                     ("naive", lambda t, r: naive_all_reduce(t, group=two, recorder=r, batched=True)),
                     ("central", lambda t, r: central_all_reduce(t, group=two, recorder=r))):
        r = rec(ab.StreamEventClock(two))
        fn(torch.ones(64), r)
        tw.synchronize()
        out[f"two_msg_{algo}"] = [_dur_ms(m["t_post_ns"], m["t_done_ns"]) for m in r.message_rows()]
    # 6. the same algorithms on the blocking-wait group: right results with the event clock
    for algo, fn in (("ring", lambda t, r: ring_all_reduce(t, recorder=r, batched=True)),
                     ("naive", lambda t, r: naive_all_reduce(t, recorder=r, batched=True)),
                     ("central", lambda t, r: central_all_reduce(t, recorder=r))):
        r = rec(ab.StreamEventClock(world))
        t = torch.full((64,), float(rank + 1))
        fn(t, r)
        out[f"sum_{algo}"] = {"values": sorted(set(t.tolist())),
                              "ms": [_dur_ms(m["t_post_ns"], m["t_done_ns"]) for m in r.message_rows()]}
    # 7. a torch_ddp trainer's steps: steps.csv's comm_ms (engine's attach_comm, the rule the
    #    analysis shares) from its collectives and the phase timer, both on one clock
    from dpcore.contract.config import TrainConfig
    from dpcore.write.capture.run_lifecycle import attach_comm
    from dpcore.write.runtime.context import DistContext
    from dpcore.write.training.trainer import make_trainer
    ctx = DistContext(rank=rank, world_size=n, local_rank=rank, backend=ab.BACKEND,
                      device=torch.device("cpu"), threads=1)
    cfg = TrainConfig(model="toy", batch_size=8, steps=2, warmup=0, profile_steps=0)
    for name, clock in (("host", None), ("event", ab.StreamEventClock(world))):
        r = rec(clock)
        tr = make_trainer("torch_ddp", ctx, cfg, recorder=r)
        timer = PhaseTimer(ctx.device, 0, clock=clock)
        r.clear()
        steps = []
        for step in range(2):
            x, y = tr.batch(step)
            world.synchronize()
            r.step = step
            tr.step(x, y, timer)
            res = timer.finish()
            steps.append({"job_id": "t", "rank": rank, "step": step, "world_size": n,
                          "t_start_ns": res["t_start_ns"], "step_ms": res["step_ms"]})
        world.synchronize()
        attach_comm(steps, r.collective_rows())
        out[f"steps_{name}"] = [(s["comm_ms"], s["comm_ops"], s["step_ms"]) for s in steps]
    # 8. phase timer: a phase that waits for an async collective on the stream
    for name, clock in (("host", None), ("event", ab.StreamEventClock(world))):
        timer = PhaseTimer(None, 0, clock=clock)
        timer.start()
        dist.all_reduce(torch.ones(10), async_op=True)  # not waited for: on the stream only
        timer.mark("fwd")
        for p in ("bwd", "sync", "opt"):
            timer.mark(p)
        res = timer.finish()
        out[f"phase_{name}"] = {"fwd_ms": res["fwd_ms"], "step_ms": res["step_ms"]}
        world.synchronize()
    return out


def _worker(rank: int, n: int, tmp: str) -> None:
    from tests import async_backend as ab
    ab.run_rank(rank, n, tmp, DELAY_MS, "blocking", _checks)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    from tests import async_backend as ab
    return ab.job_reports(_worker, 2, tmp_path_factory.mktemp("event-timing"))


def _ends_at_completion(after_ms: float) -> bool:
    """An end stamped by the event clock lies at the backend's real completion: the marker
    runs right after the op on the stream, and the anchor's host time is known to within half
    the two clock reads around it (sub-ms when idle); a host stamp of the same op reads
    DELAY_MS early."""
    return abs(after_ms) < ZERO_MS


@pytest.mark.slow
def test_tracked_collective_ends_when_the_work_completed(reports: list[dict]) -> None:
    for rep in reports:
        assert rep["track_host"]["ms"] < ZERO_MS, rep  # the defect: the future completed at enqueue
        assert rep["track_event"]["ms"] >= DELAY_MS, rep
        assert _ends_at_completion(rep["track_event"]["after_real_end_ms"]), rep
        assert rep["track_event"]["value"] == 2.0, rep


@pytest.mark.slow
def test_blocking_collective_ends_when_the_work_completed(reports: list[dict]) -> None:
    for rep in reports:
        assert rep["blocking_host"]["ms"] < ZERO_MS, rep  # NCCL's wait returns at once
        assert rep["blocking_event"]["ms"] >= DELAY_MS, rep
        assert _ends_at_completion(rep["blocking_event"]["after_real_end_ms"]), rep


@pytest.mark.slow
def test_tap_collectives_end_when_the_work_completed(reports: list[dict]) -> None:
    for rep in reports:
        assert rep["tap_host"]["ms"][0] < ZERO_MS, rep  # async: stamped in the future's callback
        assert len(rep["tap_event"]["ms"]) == 2, rep
        assert all(ms >= DELAY_MS for ms in rep["tap_event"]["ms"]), rep
        assert all(_ends_at_completion(a) for a in rep["tap_event"]["after_real_end_ms"]), rep


@pytest.mark.slow
def test_ddp_hook_buckets_end_when_the_work_completed(reports: list[dict]) -> None:
    for rep in reports:
        assert rep["ddp_event"]["buckets"] >= 1 and rep["ddp_host"]["buckets"] == rep["ddp_event"]["buckets"], rep
        assert all(ms < ZERO_MS for ms in rep["ddp_host"]["ms"]), rep  # stamped in the callback
        assert all(ms >= DELAY_MS for ms in rep["ddp_event"]["ms"]), rep
        assert all(_ends_at_completion(a) for a in rep["ddp_event"]["after_real_end_ms"]), rep


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ring", "naive", "central"])
def test_messages_end_when_the_work_completed(reports: list[dict], algo: str) -> None:
    for rep in reports:
        host, event = rep[f"msg_{algo}_host"], rep[f"msg_{algo}_event"]
        assert host and len(host) == len(event), rep
        assert all(ms < ZERO_MS for ms in host), rep  # stamped after a wait that returned at once
        assert all(ms >= DELAY_MS for ms in event), rep
        assert rep[f"sum_{algo}"]["values"] == [3.0], rep  # 1 + 2: right results with events too
        assert all(ms >= DELAY_MS for ms in rep[f"sum_{algo}"]["ms"]), rep


@pytest.mark.slow
def test_marks_after_a_wait_end_at_completion_on_a_separate_current_stream(reports: list[dict]) -> None:
    """With marks on a current stream of their own, only the ordering a wait gives makes an end
    read the completion: the probe placed before the wait reads ~0, every dpcore edge (done,
    the algorithms' t_done) reads >= the delay, so each is placed after its wait."""
    for rep in reports:
        early, late = rep["two_probe"]
        assert early < ZERO_MS and late >= DELAY_MS, rep
        assert rep["two_blocking"]["ms"] >= DELAY_MS, rep
        assert _ends_at_completion(rep["two_blocking"]["after_real_end_ms"]), rep
        for algo in ("ring", "naive", "central"):
            assert rep[f"two_msg_{algo}"] and all(ms >= DELAY_MS for ms in rep[f"two_msg_{algo}"]), rep


@pytest.mark.slow
def test_steps_comm_ms_covers_the_collectives(reports: list[dict]) -> None:
    """steps.csv's comm_ms of a torch_ddp job: ~0 from host stamps (what a 2-rank NCCL job
    read), at least one op's delay from events (each step's buckets ran >= DELAY_MS)."""
    for rep in reports:
        for comm_ms, ops, _ in rep["steps_host"]:
            assert ops >= 1 and comm_ms < ZERO_MS, rep
        for comm_ms, ops, step_ms in rep["steps_event"]:
            assert ops >= 1 and DELAY_MS <= comm_ms <= step_ms + 1e-6, rep


@pytest.mark.slow
def test_phase_waiting_on_the_stream_lasts_until_the_work_completed(reports: list[dict]) -> None:
    for rep in reports:
        assert rep["phase_host"]["fwd_ms"] < ZERO_MS, rep
        assert rep["phase_event"]["fwd_ms"] >= DELAY_MS, rep
        assert rep["phase_event"]["step_ms"] >= rep["phase_event"]["fwd_ms"], rep


# ------------------------------------------------------------------ a comm hook's compute, events
def test_hook_clock_subtracts_waits_and_nested_regions_on_device_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A compressing hook's region on the device: its span less the union of its waits and the
    callbacks run inside it, each clipped to the span (a callback's events are on another
    stream and may stick out)."""
    from dpcore.write.capture.collective_tap import COMPRESS, DECOMPRESS, HookClock
    clock = _ScriptedClock()
    hc = HookClock(lambda: 4, events=clock)

    def at(t: int) -> None:
        clock.device_now = t

    at(0)
    with hc.timed(COMPRESS):          # span 0 .. 100
        at(10)
        with hc.waiting():            # 10 .. 30 excluded
            at(30)
        at(40)
        with hc.timed(DECOMPRESS):    # 40 .. 70, nested: excluded from the compress span
            at(50)
            with hc.waiting():        # 50 .. 60 excluded from the decompress span
                at(60)
            at(70)
        at(100)
    at(200)
    with hc.timed(DECOMPRESS):        # 200 .. 250, a wait from 180 sticks out before it
        at(250)
    hc._regions[-1][4].append((_FakeEvent(180), _FakeEvent(220)))  # its wait, by hand
    at(1000)  # the anchor: device == host here
    reads = iter([1000, 1000])
    monkeypatch.setattr(comm_log, "_perf_ns", lambda: next(reads))
    ((step, compress_ms, decompress_ms),) = hc.ms([4])
    assert step == 4
    assert compress_ms * 1e6 == pytest.approx(100 - 20 - 30)
    assert decompress_ms * 1e6 == pytest.approx((30 - 10) + (50 - 20))


def test_hook_clock_host_mode_is_unchanged() -> None:
    """Without events the clock keeps its host arithmetic (perf_counter per region)."""
    from dpcore.write.capture.collective_tap import COMPRESS, HookClock
    hc = HookClock(lambda: 0)
    with hc.timed(COMPRESS):
        time.sleep(0.02)
        with hc.waiting():
            time.sleep(0.1)
    ((_, compress_ms, decompress_ms),) = hc.ms([0])
    assert 15 <= compress_ms < 65 and decompress_ms == 0.0  # the 100 ms wait left out
