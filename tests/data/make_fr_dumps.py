"""A plain PyTorch gloo job (no dpcore) that hangs on purpose and writes flight-recorder dumps
the way a user would: ``TORCH_FR_BUFFER_SIZE`` on, each rank's ``_dump_fr_trace`` pickle written
to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``.

    python tests/data/make_fr_dumps.py OUT_PREFIX WORLD_SIZE MODE HANG_RANK

MODE ``sleep``: HANG_RANK sleeps instead of the last all-reduce (a missing rank); ``skip``: it
skips that all-reduce and enters the next step's barrier (a desync). Each step is
(barrier, all_reduce of 1000 floats), 3 steps, then the hanging step.

Why the dumps are structural, not timed: each rank dumps only once its own recorder holds the
entry it is stuck in (it polls its own dump), and every rank has said so through the store, so
a loaded machine delays the dumps but cannot change them. Then every process exits.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 3


def _entries() -> int:
    from torch._C._distributed_c10d import _dump_fr_trace_json
    return len(json.loads(_dump_fr_trace_json(True, False)).get("entries", []))


def rank_main(rank: int, ws: int, port: int, prefix: str, mode: str, hang_rank: int) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "200"
    store = dist.TCPStore("127.0.0.1", port, ws + 1, is_master=False,
                          timeout=dt.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=ws,
                            timeout=dt.timedelta(seconds=120))
    t = torch.ones(1000)
    for _ in range(STEPS):
        dist.barrier()
        dist.all_reduce(t)
    hangs = rank == hang_rank
    dist.barrier()
    expect = 2 * STEPS + 1 + (0 if hangs and mode == "sleep" else 1)

    def dump() -> None:
        while _entries() < expect:  # my own stuck collective is recorded
            time.sleep(0.05)
        store.add("dumped_ready", 1)
        while int(store.add("dumped_ready", 0)) < ws:
            time.sleep(0.05)
        from torch._C._distributed_c10d import _dump_fr_trace
        with open(f"{prefix}{rank}", "wb") as f:
            f.write(_dump_fr_trace(True, True, False))
        store.add("dumped", 1)
        while int(store.add("dumped", 0)) < ws:
            time.sleep(0.05)
        os._exit(0)

    threading.Thread(target=dump, daemon=True).start()
    try:
        if hangs and mode == "sleep":
            threading.Event().wait()
        elif hangs:
            dist.barrier()  # skipped the all-reduce: the next step's barrier meets it
        else:
            dist.all_reduce(t)
    except RuntimeError:  # a peer that has written its dump exited ("Connection closed by peer"):
        pass              # this rank's dump thread still writes its own and exits the process
    threading.Event().wait()


if __name__ == "__main__":
    out, size, how, who = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    master = dist.TCPStore("127.0.0.1", 0, size + 1, is_master=True, wait_for_workers=False)
    mp.spawn(rank_main, args=(size, master.port, out, how, who), nprocs=size)
