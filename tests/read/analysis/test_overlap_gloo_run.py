"""Real 2-rank gloo run under torch.profiler: blocking vs async all-reduce.

Blocking all-reduce after backward must show ~0% overlap; an async all-reduce launched from a
gradient hook at the start of backward must show more; and the trace-based overlap (gloo spans vs
main-thread phases minus the marked communication calls, as dpcore's recorder marks them) must
agree with the interval-based one (steps/collectives/calls on the same clock). One spawn runs both
modes to keep the test cheap.

Where the two instruments differ, and why: gloo reports no backend start, so the interval method's
collective starts at its launch (the call to ``all_reduce``), while the trace's gloo span starts when
gloo's worker thread picks the work up. The ends agree (the future's callback runs as the span
closes). Between launch and pick-up the request waits for a CPU for the worker thread; during
backward that wait is counted as overlapped comm by the interval method only. Measured on this 2-core
machine: 1-22 ms per collective under load (CI saw a 16.7-point overlap gap from it). So the test
checks each part: ends agree, launches precede the spans, and with the span's start as the backend
start (the ``t_start_ns`` column the interval method takes when known) the two overlaps agree.
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
from dpcore.read.traces import read_trace_dir  # noqa: E402

STEPS = 4  # ProfilerStep#1..3 are recorded (schedule: warmup 1, active 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out: str) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(384, 384), torch.nn.ReLU())])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 384), torch.randn(256, 384)
    buf = torch.zeros(1 << 19)
    for mode in ("blocking", "async"):
        rows, colls, calls, pending = [], [], [], []
        now = time.perf_counter_ns

        def hook(_p, mode=mode, pending=pending, colls=colls, calls=calls, now=now):
            if mode == "async" and not pending:
                # marked as dpcore's recorder marks a communication call (comm_call# range, and
                # its interval), so both methods take the same compute: phases minus the calls
                with record_function("comm_call#all_reduce"):
                    colls.append([now(), None])
                    work = dist.all_reduce(buf, async_op=True)
                    calls.append([colls[-1][0], now()])
                entry = colls[-1]
                work.get_future().then(lambda f, e=entry: e.__setitem__(1, now()))
                pending.append(work)
        h = model[-2].weight.register_post_accumulate_grad_hook(hook)  # first gradient of backward
        d = Path(out) / mode
        d.mkdir(parents=True, exist_ok=True)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=STEPS - 1),
                     on_trace_ready=lambda p, d=d: p.export_chrome_trace(str(d / f"rank{rank}.json"))) as prof:
            for step in range(STEPS):
                n0, k0 = len(colls), len(calls)
                t0 = now()
                with record_function("forward"):
                    loss = ((model(x) - y) ** 2).mean()
                t1 = now()
                with record_function("backward"):
                    loss.backward()
                t2 = now()
                with record_function("grad_sync"):
                    if mode == "blocking":
                        with record_function("comm_call#all_reduce"):
                            colls.append([now(), None])
                            dist.all_reduce(buf)
                            colls[-1][1] = now()
                        calls.append(list(colls[-1]))
                    for w in pending:
                        with record_function("comm_call#wait"):
                            a = now()
                            w.wait()
                            calls.append([a, now()])
                    pending.clear()
                t3 = now()
                with record_function("optimizer"):
                    opt.step()
                    opt.zero_grad()
                t4 = now()
                prof.step()
                rows.append(dict(step=step, t_start_ns=t0, fwd_ms=(t1 - t0) / 1e6, bwd_ms=(t2 - t1) / 1e6,
                                 sync_ms=(t3 - t2) / 1e6, opt_ms=(t4 - t3) / 1e6, step_ms=(t4 - t0) / 1e6,
                                 colls=colls[n0:], calls=calls[k0:]))
        h.remove()
        dist.barrier()
        (d / f"intervals{rank}.json").write_text(json.dumps(rows, default=list))
    dist.destroy_process_group()


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
    rows = [r for r in json.loads((d / f"intervals{rank}.json").read_text()) if r["step"] >= 1]
    fwd = ev[(ev["name"] == "forward") & (ev["category"] == "user_annotation")].sort_values("ts")
    assert len(fwd) == len(rows)
    offset = float(np.median(fwd["ts"].to_numpy(np.float64) * 1e3 - np.array([r["t_start_ns"] for r in rows])))
    comm = ev[ev["kind"] == "comm"].sort_values("ts")
    start = comm["ts"].to_numpy(np.float64) * 1e3 - offset
    return start, start + comm["dur"].to_numpy(np.float64) * 1e3, offset


def _interval_overlap(d: Path, backend_stamps: bool = False) -> pd.DataFrame:
    """The interval method on the recorded steps and collectives; ``backend_stamps``: each profiled
    collective's start and end are its gloo span's (matched in order), as on a backend that reports
    them, so only the compute side (phase ranges vs operators) is left to differ."""
    steps, colls, calls = [], [], []
    for rank in (0, 1):
        spans = iter(zip(*_gloo_spans(d, rank)[:2], strict=True)) if backend_stamps else None
        for r in json.loads((d / f"intervals{rank}.json").read_text()):
            steps.append(dict(job_id="j", variant="v", world_size=2, bucket_mb=0.0, rank=rank, step=r["step"],
                              profiled=False, comm_ops=1, comm_bytes=0, samples=1,
                              **{k: r[k] for k in ("t_start_ns", "fwd_ms", "bwd_ms", "sync_ms", "opt_ms", "step_ms")}))
            for seq, (a, b) in enumerate(r["colls"]):
                start = None
                if spans is not None and r["step"] >= 1:
                    start, b = next(spans)
                colls.append(dict(job_id="j", rank=rank, step=r["step"], seq=seq, op="all_reduce", algo="native",
                                  bytes=0, t_launch_ns=a, t_start_ns=start, t_end_ns=b, bucket=-1))
            calls += [dict(job_id="j", rank=rank, step=r["step"], seq=k, call="all_reduce", t_begin_ns=a, t_end_ns=b)
                      for k, (a, b) in enumerate(r["calls"])]
    return step_breakdown(pd.DataFrame(steps), pd.DataFrame(colls), calls=pd.DataFrame(calls))


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
        rows = [r for r in json.loads((gloo_run / "async" / f"intervals{rank}.json").read_text()) if r["step"] >= 1]
        launch = np.array([a for r in rows for a, _ in r["colls"]], dtype=np.float64)
        done = np.array([b for r in rows for _, b in r["colls"]], dtype=np.float64)
        assert len(launch) == len(starts) == STEPS - 1
        # The stamps follow causality (1 ms of clock-offset slack): the launch precedes the worker's
        # pick-up, and the future's callback runs once the work is done. How late each comes is the
        # machine's load (a CPU for gloo's thread, the GIL for the callback): 1-22 ms measured here.
        assert (starts - launch).min() > -1e6, (starts - launch) / 1e6
        assert (done - ends).min() > -1e6, (done - ends) / 1e6
        assert (done - launch > ends - starts - 1e6).all()
    # With the backend's stamps, the two instruments measure the same comm, and with the calls marked
    # (as dpcore's recorder marks them) the same compute: phases minus the communication calls.
    # Before the calls were marked the trace's compute was the union of the operators, whose gaps
    # grow with the machine's load: CI once measured 90.0 vs 96.9 from that alone.
    backend = _pct(_interval_overlap(gloo_run / "async", backend_stamps=True))
    assert abs(trace["async"] - backend) < 5.0, (trace, backend, ivals)
