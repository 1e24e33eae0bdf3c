"""Does ``dpcore.record`` slow the loop it records? Timed-step medians of one plain DDP loop,
with and without the recording around it.

Both arms run the same loop on the same ranks (2 gloo processes spawned here), each on a fresh
``DistributedDataParallel`` of the same initial model (a DDP keeps a comm hook for life, so
the plain arm must never have been recorded). Arms alternate within every repeat, in swapped
order on odd repeats, so slow drifts of a shared machine hit both equally. Step time is read the
same way in both arms: ``perf_counter`` around the user's whole step (``with rec.step():``
included), on the steps that ``record`` times without the profiler. The recorded arm's own
``step_ms`` from steps.csv is reported too. Result: ratio of the medians (recorded / plain);
the median of the per-repeat ratios (each repeat's two arms ran back to back) is
steadier on a busy machine. The budget is the same 5 % as ``profile``'s tracing.

    python -m benchmarks.bench_record_overhead --repeats 5 --steps 30
"""
from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from dpcore.write.commands.record import record

WARMUP, PROFILE = 2, 3


def _model(width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, 10))


def _loop(model: nn.Module, rec: Any, steps: int, batch: int, width: int) -> list[float]:
    """The user's loop; returns perf_counter ms of each step (phases marked when recorded)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    out = []
    for _ in range(steps):
        x, y = torch.randn(batch, width, generator=g), torch.randint(0, 10, (batch,), generator=g)
        t0 = time.perf_counter_ns()
        if rec is None:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with rec.step():
                with rec.phase("forward"):
                    loss = nn.functional.cross_entropy(model(x), y)
                with rec.phase("backward"):
                    loss.backward()
                with rec.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def _rank(rank: int, a: argparse.Namespace, store: str, out: str, q: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    plain: list[float] = []
    recorded: list[float] = []
    own: list[float] = []
    skip = WARMUP + PROFILE  # record's warm-up and traced steps; the plain arm drops as many
    for i in range(a.repeats):
        for arm in (("plain", "record") if i % 2 == 0 else ("record", "plain")):
            model = DistributedDataParallel(_model(a.width, a.layers))
            dist.barrier()
            if arm == "plain":
                plain.append(statistics.median(
                    _loop(model, None, skip + a.steps, a.batch, a.width)[skip:]))
            else:
                with record(out, name="bench", model=model, warmup=WARMUP,
                            profile_steps=PROFILE) as rec:
                    ms = _loop(model, rec, skip + a.steps, a.batch, a.width)
                recorded.append(statistics.median(ms[skip:]))
                if rank == 0:
                    with open(rec.run_dir / "steps.csv") as f:
                        rows = [r for r in csv.DictReader(f) if r["profiled"] == "False"]
                    own.append(statistics.median(float(r["step_ms"]) for r in rows))
    if rank == 0:
        q.put((plain, recorded, own))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per arm and repeat")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(a, str(Path(tmp) / "store"), str(Path(tmp) / "runs"), q), nprocs=2)
        plain, recorded, own = q.get()
    p, r = statistics.median(plain), statistics.median(recorded)
    print("repeat medians, ms (rank 0): plain " + ", ".join(f"{v:.3f}" for v in plain))
    print("                           record " + ", ".join(f"{v:.3f}" for v in recorded))
    paired = statistics.median(b / a for a, b in zip(plain, recorded))
    print(f"plain {p:.3f} ms, recorded {r:.3f} ms per step: ratio of medians {r / p:.3f}, "
          f"median of per-repeat ratios {paired:.3f} "
          f"(record's own step_ms median {statistics.median(own):.3f} ms)")


if __name__ == "__main__":
    main()
