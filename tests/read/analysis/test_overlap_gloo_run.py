"""Real 2-rank gloo run under torch.profiler: blocking vs async all-reduce.

Blocking all-reduce after backward must show ~0% overlap; an async all-reduce launched from a
gradient hook at the start of backward must show more; and the trace-based overlap (gloo spans vs
main-thread phases minus the marked communication calls) must agree with the interval-based one
(steps/collectives/calls on the same clock). The job records its collectives and calls with
dpcore's own :class:`~dpcore.write.capture.comm_log.Recorder`, the instrument under test, and
stamps its phases as dpcore's PhaseTimer does (outside their ranges). One spawn runs both modes
to keep the test cheap.

Where the two instruments differ, and why: gloo reports no backend start, so the interval method's
collective starts at its launch (the call to ``all_reduce``), while the trace's gloo span starts when
gloo's worker thread picks the work up. The ends agree (the future's callback runs as the span
closes). Between launch and pick-up the request waits for a CPU for the worker thread; during
backward that wait is counted as overlapped comm by the interval method only. Measured on this 2-core
machine: 1-41 ms per collective under load (CI saw a 16.7-point overlap gap from it). So the test
checks each part: ends agree, launches precede the spans, each call's stamps cover its trace range,
and with the span's start as the backend start (the ``t_start_ns`` column the interval method takes
when known) the two overlaps agree.
"""
import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from dpcore.read.analysis import overlap_from_trace, step_breakdown  # noqa: E402
from tests import spawned  # noqa: E402
from tests.trace_helpers import read_trace_dir  # noqa: E402

STEPS = 4  # ProfilerStep#1..3 are recorded (schedule: warmup 1, active 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out: str) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from dpcore.write.capture.comm_log import Recorder
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(384, 384), torch.nn.ReLU())])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 384), torch.randn(256, 384)
    buf = torch.zeros(1 << 19)
    nbytes = buf.numel() * buf.element_size()
    for mode in ("blocking", "async"):
        # dpcore's own recorder logs each collective and marks each communication call (its
        # comm_call# range, inside stamps that cover it): the instrument under test, not a copy
        rec = Recorder("j", rank)
        rows: list[dict] = []
        pending: list = []
        now = time.perf_counter_ns

        def hook(_p, mode=mode, pending=pending, rec=rec):
            if mode == "async" and not pending:
                idx = rec.launch("all_reduce", "native", nbytes)
                pending.append(rec.track(idx, dist.all_reduce(buf, async_op=True)))
        h = model[-2].weight.register_post_accumulate_grad_hook(hook)  # first gradient of backward
        d = Path(out) / mode
        d.mkdir(parents=True, exist_ok=True)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=STEPS - 1),
                     on_trace_ready=lambda p, d=d: p.export_chrome_trace(str(d / f"rank{rank}.json"))) as prof:
            for step in range(STEPS):
                rec.step = step
                # the phases stamped as dpcore's PhaseTimer stamps them: outside their ranges
                t0 = now()
                with record_function("forward"):
                    loss = ((model(x) - y) ** 2).mean()
                t1 = now()
                with record_function("backward"):
                    loss.backward()
                t2 = now()
                with record_function("grad_sync"):
                    if mode == "blocking":
                        idx = rec.launch("all_reduce", "native", nbytes)
                        dist.all_reduce(buf)
                        rec.done(idx)
                    for w in pending:
                        w.wait()
                    pending.clear()
                t3 = now()
                with record_function("optimizer"):
                    opt.step()
                    opt.zero_grad()
                t4 = now()
                prof.step()
                rows.append(dict(step=step, t_start_ns=t0, fwd_ms=(t1 - t0) / 1e6, bwd_ms=(t2 - t1) / 1e6,
                                 sync_ms=(t3 - t2) / 1e6, opt_ms=(t4 - t3) / 1e6, step_ms=(t4 - t0) / 1e6))
        h.remove()
        dist.barrier()  # every future's callback (a collective's end stamp) has run
        (d / f"intervals{rank}.json").write_text(json.dumps(
            dict(steps=rows, collectives=rec.collective_rows(), calls=rec.call_rows())))
    dist.destroy_process_group()
    spawned.leave()


def _record(d: Path, rank: int) -> tuple[list[dict], pd.DataFrame, pd.DataFrame]:
    """A rank's steps, collectives (collectives.csv's columns) and calls (comm_calls.csv's)."""
    rec = json.loads((d / f"intervals{rank}.json").read_text())
    return rec["steps"], pd.DataFrame(rec["collectives"]), pd.DataFrame(rec["calls"])


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    import torch.multiprocessing as mp
    out = tmp_path_factory.mktemp("gloo")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=2, join=True)
    return out


def _gloo_spans(d: Path, rank: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The rank's gloo spans (start, end, in perf_counter ns) and the trace-to-perf_counter offset.

    The profiler's clock differs from perf_counter by a constant: the offset is the median of
    (trace ``forward`` range start - recorded step start) over the profiled steps."""
    ev = read_trace_dir(d)
    ev = ev[ev["rank"] == rank]
    rows = [r for r in _record(d, rank)[0] if r["step"] >= 1]
    fwd = ev[(ev["name"] == "forward") & (ev["category"] == "user_annotation")].sort_values("ts")
    assert len(fwd) == len(rows)
    offset = float(np.median(fwd["ts"].to_numpy(np.float64) * 1e3 - np.array([r["t_start_ns"] for r in rows])))
    comm = ev[ev["kind"] == "comm"].sort_values("ts")
    start = comm["ts"].to_numpy(np.float64) * 1e3 - offset
    return start, start + comm["dur"].to_numpy(np.float64) * 1e3, offset


def _call_ranges(d: Path, rank: int) -> tuple[np.ndarray, float]:
    """The rank's ``comm_call#`` ranges in the trace, as rows of (start, end) in perf_counter ns
    (by :func:`_gloo_spans`' offset), in order, and that offset."""
    _, _, offset = _gloo_spans(d, rank)
    ev = read_trace_dir(d)
    ev = ev[(ev["rank"] == rank) & ev["name"].astype(str).str.startswith("comm_call#")].sort_values("ts")
    start = ev["ts"].to_numpy(np.float64) * 1e3 - offset
    return np.column_stack([start, start + ev["dur"].to_numpy(np.float64) * 1e3]), offset


def _interval_overlap(d: Path, backend_stamps: bool = False) -> pd.DataFrame:
    """The interval method on the recorded steps, collectives and calls; ``backend_stamps``: each
    profiled collective's start and end are its gloo span's (matched in order), as on a backend
    that reports them, so only the compute side (phase stamps vs ranges) is left to differ."""
    steps, colls, calls = [], [], []
    for rank in (0, 1):
        rows, coll, call = _record(d, rank)
        steps += [dict(job_id="j", variant="v", world_size=2, bucket_mb=0.0, rank=rank, profiled=False, comm_ops=1,
                       comm_bytes=0, samples=1, **r) for r in rows]
        coll = coll.astype({"t_start_ns": object})
        if backend_stamps:
            starts, ends, _ = _gloo_spans(d, rank)
            profiled = (coll["step"] >= 1).to_numpy()
            assert profiled.sum() == len(starts)
            coll.loc[profiled, "t_start_ns"] = starts
            coll.loc[profiled, "t_end_ns"] = ends
        colls.append(coll)
        calls.append(call)
    return step_breakdown(pd.DataFrame(steps), pd.concat(colls, ignore_index=True),
                          calls=pd.concat(calls, ignore_index=True))


def _pct(df: pd.DataFrame) -> float:
    df = df[df["step"] >= 1]
    return 100.0 * df["overlapped_ms"].sum() / df["comm_ms"].sum()


def test_blocking_vs_async_overlap(gloo_run):
    trace = {m: _pct(overlap_from_trace(read_trace_dir(gloo_run / m))) for m in ("blocking", "async")}
    ivals = {m: _pct(_interval_overlap(gloo_run / m)) for m in ("blocking", "async")}
    assert trace["blocking"] < 2.0 and ivals["blocking"] < 2.0
    assert trace["async"] > trace["blocking"] + 5.0
    assert ivals["async"] > ivals["blocking"] + 5.0
    for rank in (0, 1):
        starts, ends, _ = _gloo_spans(gloo_run / "async", rank)
        coll = _record(gloo_run / "async", rank)[1]
        coll = coll[coll["step"] >= 1]
        launch, done = (coll[c].to_numpy(np.float64) for c in ("t_launch_ns", "t_end_ns"))
        assert len(launch) == len(starts) == STEPS - 1
        # The stamps follow causality (1 ms of clock-offset slack): the launch precedes the worker's
        # pick-up, and the future's callback runs once the work is done. How late each comes is the
        # machine's load (a CPU for gloo's thread, the GIL for the callback): 1-22 ms measured here.
        assert (starts - launch).min() > -1e6, (starts - launch) / 1e6
        assert (done - ends).min() > -1e6, (done - ends) / 1e6
        assert (done - launch > ends - starts - 1e6).all()
        # Each communication call's stamps cover its comm_call# range (1 ms of clock-offset slack),
        # as the recorder takes them: a stall inside the range (the collector, a lost CPU) is then
        # the call's in both instruments. A call stamped inside its range left such a stall to
        # compute in the interval method only: 18.8 ms of a gloo span (a 4.0-point gap) in 1 of
        # 6 runs measured with two busy loops beside them.
        ranges, offset = _call_ranges(gloo_run / "async", rank)
        calls = _record(gloo_run / "async", rank)[2]
        calls = calls[calls["step"] >= 1].sort_values("t_begin_ns")
        begin, end = (calls[c].to_numpy(np.float64) for c in ("t_begin_ns", "t_end_ns"))
        assert len(begin) == len(ranges) == 2 * (STEPS - 1)  # a launch and a wait per step
        assert (begin - ranges[:, 0]).max() < 1e6, (begin - ranges[:, 0]) / 1e6
        assert (ranges[:, 1] - end).max() < 1e6, (ranges[:, 1] - end) / 1e6
    # With the backend's stamps, the two instruments measure the same comm, and with the calls marked
    # (by dpcore's recorder) the same compute: phases minus the communication calls. What is left to
    # differ is a few µs at each edge (a stamp beside its range's edge): measured 0.00-0.01 points in
    # 8 runs with two busy loops beside them (load 16-20). Before the calls were marked the trace's compute was
    # the union of the operators, whose gaps grow with the machine's load (CI: 90.0 vs 96.9); while
    # the job stamped its calls inside their ranges, a stall there made 6.8 points in CI.
    backend = _pct(_interval_overlap(gloo_run / "async", backend_stamps=True))
    assert abs(trace["async"] - backend) < 5.0, (trace, backend, ivals)
