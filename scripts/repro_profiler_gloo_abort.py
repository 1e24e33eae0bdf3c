"""Standalone reproducer: a 2-rank gloo DDP loop under torch.profiler with two cycles.

Why: a rank of this job once in a few CI runs died by SIGABRT ("malloc(): unsorted double
linked list corrupted"). This script runs the job many times, each in fresh processes, and
counts how each run ended, so that a cause can be told apart by switching one thing at a time:

    python scripts/repro_profiler_gloo_abort.py --runs 40 --handler dpcore
    python scripts/repro_profiler_gloo_abort.py --runs 40 --handler export   # export only
    python scripts/repro_profiler_gloo_abort.py --runs 40 --handler none     # no on_trace_ready

``--handler dpcore`` is what tests/integrations/test_trace_handler.py runs;
``export`` only calls ``prof.export_chrome_trace`` (no barrier, no pandas, no dpcore);
``barrier`` exports and then meets in a ``dist.barrier()`` as dpcore's handler does;
``none`` profiles without a handler. Load the machine beside it (busy loops) to make it likelier.

The cause (README, "trace_handler"): gloo completes a collective's future before its worker
thread ends the collective's profiler range, so a cycle that ends in between frees the event
that the range's end is then written into. Two switches show it:

    python scripts/repro_profiler_gloo_abort.py --runs 3 --handler export --hold-ms 50
    python scripts/repro_profiler_gloo_abort.py --runs 3 --handler export --hold-ms 50 --sync barrier

``--hold-ms`` keeps gloo's thread that long after each DDP all-reduce's future completes (the
window made wide); ``--sync barrier`` meets in ``dist.barrier()`` before each ``prof.step()``
that stops the profiler (what ``handler.schedule`` does), which waits for those ranges to end.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _held_allreduce(hold_s: float, bucket):
    """DDP's default all-reduce hook, plus a callback that keeps gloo's worker thread for
    ``hold_s`` after DDP's future has completed: the window between the future's completion
    and the end of the collective's profiler range (``Work::finish``), made wide."""
    import torch.distributed as dist
    buf = bucket.buffer().div_(dist.get_world_size())
    fut = dist.all_reduce(buf, async_op=True).get_future()
    done = fut.then(lambda f: f.value()[0])  # DDP waits on this one; runs first
    fut.then(lambda _f: time.sleep(hold_s))  # then gloo's thread is held, range still open
    return done


def _worker(rank: int, port: int, out: str, handler_kind: str, sched_args: tuple[int, int, int, int],
            hold_ms: float = 0.0, sync: str = "none") -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if hold_ms:
        model.register_comm_hook(hold_ms / 1000, _held_allreduce)

    def export(prof) -> None:
        path = os.path.join(out, f"r{rank}-{time.monotonic_ns()}.json")
        prof.export_chrome_trace(path)

    def export_barrier(prof) -> None:
        export(prof)
        dist.barrier()

    if handler_kind == "dpcore":
        import dpcore
        on_ready = dpcore.trace_handler(out, name="repro")
    else:
        on_ready = {"export": export, "barrier": export_barrier, "none": None}[handler_kind]
    wait, warmup, active, repeat = sched_args
    sched = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
    steps = (wait + warmup + active) * repeat + 1
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=on_ready) as prof:
        for _ in range(steps):
            x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sync == "barrier" and prof.current_action == ProfilerAction.RECORD_AND_SAVE:
                dist.barrier()  # the next prof.step() stops the profiler
            prof.step()
    if hold_ms:
        dist.barrier()  # the last step's held callbacks end before the group is destroyed
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--handler", choices=["dpcore", "export", "barrier", "none"], default="dpcore")
    ap.add_argument("--repeat", type=int, default=2, help="profiler cycles per job (default 2)")
    ap.add_argument("--hold-ms", type=float, default=0.0,
                    help="hold gloo's thread this long after each DDP all-reduce's future completes "
                         "(widens the race; default 0: off)")
    ap.add_argument("--sync", choices=["none", "barrier"], default="none",
                    help="barrier: dist.barrier() before each prof.step() that stops the profiler")
    ap.add_argument("--schedule", default="1,1,2", help="wait,warmup,active steps of a cycle (default 1,1,2)")
    args = ap.parse_args()
    import torch.multiprocessing as tmp
    wait, warmup, active = (int(v) for v in args.schedule.split(","))
    ends: Counter[str] = Counter()
    t0 = time.monotonic()
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as out:
            try:
                job = (_free_port(), out, args.handler, (wait, warmup, active, args.repeat),
                       args.hold_ms, args.sync)
                tmp.spawn(_worker, args=job, nprocs=2, join=True)
                ends["ok"] += 1
                print(f"run {i}: ok", flush=True)
            except tmp.ProcessExitedException as exc:
                ends[f"signal {exc.signal_name}" if exc.signal_name else f"exit {exc.exit_code}"] += 1
                print(f"run {i}: {exc}", flush=True)
            except tmp.ProcessRaisedException as exc:
                ends["exception"] += 1
                print(f"run {i}: {str(exc).strip().splitlines()[-1]}", flush=True)
    print(f"handler={args.handler} hold_ms={args.hold_ms:g} sync={args.sync} schedule={args.schedule} "
          f"repeat={args.repeat} runs={args.runs} "
          f"{dict(ends)} in {time.monotonic() - t0:.0f} s", flush=True)
    return 0 if ends["ok"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
