"""Quick benchmark: ring vs native (gloo) all-reduce busbw on one host.

Not a test: ``python -m benchmarks.bench_ring [--sizes-mb 16 64] [--repeats 15]``.
The machine is shared and noisy, so the algorithms are *interleaved* (native, ring, native,
ring, ... with the order flipped each round) and medians are reported: a background burst
then hits both algorithms alike instead of biasing one. busbw follows nccl-tests:
algbw * 2(N-1)/N, with t = the slowest rank's time of one call, started after a barrier.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dpcore.write.dp.comm import all_reduce
from dpcore.write.dp.comm import ring as ring_mod


def _worker(rank: int, world: int, store_path: str, sizes: list[int], repeats: int,
            algos: list[str], sub_bytes: int, inflight: int, threads: int,
            out: dict, pin: bool = True) -> None:
    if pin:  # as `python -m dpcore allreduce` does: each rank on its own CPUs
        from dpcore.write.runtime.resources import pin_rank
        pin_rank(rank, world, threads)
    torch.set_num_threads(threads)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    ring_mod.DEFAULT_SUB_BYTES = sub_bytes
    ring_mod.DEFAULT_INFLIGHT = inflight
    try:
        for nbytes in sizes:
            x = torch.ones(nbytes // 4, dtype=torch.float32)
            times: dict[str, list[float]] = {a: [] for a in algos}
            for a in algos:  # warm-up (connections, allocator)
                all_reduce(x, algo=a, op="sum")
            for i in range(repeats):
                order = algos if i % 2 == 0 else algos[::-1]
                for a in order:
                    dist.barrier()
                    t0 = time.perf_counter()
                    all_reduce(x, algo=a, op="sum")
                    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                    times[a].append(float(dt))
            if rank == 0:
                out[nbytes] = times
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[16.0, 64.0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--algos", nargs="+", default=["native", "ring"])
    p.add_argument("--sub-kb", type=int, default=ring_mod.DEFAULT_SUB_BYTES // 1024,
                   help="ring sub-message size (pipelining granularity)")
    p.add_argument("--inflight", type=int, default=ring_mod.DEFAULT_INFLIGHT,
                   help="ring receives posted ahead (0 = a whole step)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin each rank to its own CPUs (the allreduce command pins)")
    a = p.parse_args(argv)
    sizes = [int(s * (1 << 20)) for s in a.sizes_mb]
    n = a.world_size
    with tempfile.TemporaryDirectory() as d, mp.Manager() as mgr:
        out = mgr.dict()
        mp.start_processes(_worker, args=(n, os.path.join(d, "store"), sizes, a.repeats,
                                          a.algos, a.sub_kb * 1024, a.inflight, a.threads, out,
                                          not a.no_pin),
                           nprocs=n, start_method="spawn", join=True)
        results = dict(out)
    factor = 2 * (n - 1) / n if n > 1 else 1.0
    print(f"world={n} repeats={a.repeats} sub={a.sub_kb}KB inflight={a.inflight} "
          f"threads/rank={a.threads} pinned={not a.no_pin} "
          f"(busbw = bytes/t * 2(N-1)/N, median of interleaved repeats)")
    for nbytes in sizes:
        med = {k: statistics.median(v) for k, v in results[nbytes].items()}
        bus = {k: nbytes / t * factor / 1e9 for k, t in med.items()}
        line = "  ".join(f"{k}: {med[k] * 1e3:7.2f} ms {bus[k]:6.2f} GB/s" for k in a.algos)
        ratio = ""
        if "ring" in bus and "native" in bus:  # paired: each ring call vs its neighbour
            t = results[nbytes]
            paired = statistics.median(a / b for a, b in zip(t["native"], t["ring"]))
            ratio = (f"  ring/native busbw = {bus['ring'] / bus['native']:.3f}"
                     f" (paired median {paired:.3f})")
        print(f"{nbytes / (1 << 20):6.1f} MB  {line}{ratio}")


if __name__ == "__main__":
    main()
