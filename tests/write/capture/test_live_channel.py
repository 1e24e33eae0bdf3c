"""live.csv's path from a rank to the file, and the watchdog's rules, on an in-process store:
whole lines, one header, every row once; the default hang timeout; the watchdog standing down
after the job's last step and firing (with a verdict) when no step ends."""
from __future__ import annotations

import csv
import json
import time

import torch.distributed as dist

from dpcore.contract import runformat as rf
from dpcore.write.capture.job_monitor import HANG_FLOOR_S, JobMonitor, default_hang_timeout
from dpcore.write.capture.rank_channel import RankChannel


def _row(rank: int, step: int) -> dict:
    return {"job_id": "j", "rank": rank, "step": step, "profiled": False, "t_end_ns": 10 ** 9 + step,
            "wall_time": 1.0, "step_ms": 2.5, "comm_ms": None, "exposed_comm_ms": None}


def test_rows_of_every_rank_reach_live_csv_once_as_whole_lines(tmp_path):
    store = dist.HashStore()
    mon = JobMonitor("j", 2, tmp_path, watch=False)
    mon.attach(store)
    chans = [RankChannel(store, "j", r, 2, period_s=0.05) for r in range(2)]
    for step in range(5):
        for r, ch in enumerate(chans):
            # one finished collective of 1 ms inside the step window -> comm_ms 1.0
            t_end = 10 ** 9 + step
            ch.put(_row(r, step), [[step, 0, "all_reduce", "native", 4, t_end - 2_000_000, -1,
                                    t_end - 1_000_000, -1]])
        mon.poll()
    for ch in chans:
        ch.close()
    mon.close()
    text = (tmp_path / rf.LIVE_FILE).read_text()
    assert text.endswith("\n") and text.count("job_id,") == 1
    rows = list(csv.DictReader(text.splitlines()))
    assert sorted((int(r["rank"]), int(r["step"])) for r in rows) == [(r, s) for r in range(2) for s in range(5)]
    assert {r["comm_ms"] for r in rows} == {"1.0"} and {r["exposed_comm_ms"] for r in rows} == {""}


def test_default_hang_timeout_is_floored_a_multiple_of_the_median_and_below_timeout():
    assert default_hang_timeout(None, 600) == HANG_FLOOR_S
    assert default_hang_timeout(0.01, 600) == HANG_FLOOR_S
    assert default_hang_timeout(2.0, 600) == 100.0
    assert default_hang_timeout(2.0, 50) == 40.0


def test_watchdog_stands_down_after_the_last_step_and_fires_otherwise(tmp_path):
    store = dist.HashStore()
    done = JobMonitor("a", 2, tmp_path, hang_timeout_s=0.01, steps_total=3)
    done.attach(store)
    for n in (1, 2, 3):
        done.stepped({"done": n})
    assert done.hang is None and done.poll() is None  # e.g. a trace export after the last step
    hung = JobMonitor("b", 2, tmp_path, hang_timeout_s=0.01, steps_total=3)
    hung.attach(store)
    assert hung.poll() is None  # no step yet: only --timeout applies
    hung.stepped({"done": 1})
    # two ranks answer the request as their channel threads would: rank 1 is one collective behind
    entry = {"collective_seq_id": 1, "profiling_name": "gloo:all_reduce", "input_sizes": [[4]],
             "input_dtypes": ["Float"], "retired": True}
    pending = {**entry, "collective_seq_id": 2, "retired": False}
    for r, entries in ((0, [entry, pending]), (1, [entry])):
        store.set(f"dpcore/b/hang/{r}/fr", json.dumps({"entries": entries}))
        store.set(f"dpcore/b/hang/{r}/stack", "Current thread 0x1 (most recent call first):\n")
    time.sleep(0.05)  # past the 0.01 s limit: a hang, whatever the machine's load
    failed = hung.poll()
    assert failed is not None and failed.rank == 1
    assert "rank 1 never entered collective seq 2 (all_reduce, 16 B)" in failed.message
    verdict = json.loads((rf.hang_dir(tmp_path, "b") / rf.VERDICT_FILE).read_text())
    assert verdict["kind"] == "missing" and verdict["no_answer"] == []
    assert (rf.hang_dir(tmp_path, "b") / "rank1.stack.txt").exists()


def test_an_end_still_an_event_reads_as_not_ended_and_waits(tmp_path):
    """On a device job an end stamped after the recorder resolved its events is still an event
    object in the row: the channel reads it as not ended (-1) and keeps the row waiting, where it
    once compared the event with 0 and lost the thread's rows to a TypeError."""
    import numpy as np

    from dpcore.write.capture.comm_log import row_interval

    class Event:  # a stand-in for an unresolved torch.cuda.Event
        pass

    row = ["job", 0, 0, 1, "all_reduce", 10, np.int64(12), Event()]
    assert row_interval(row) == (10, 12, -1)
    store = dist.HashStore()
    ch = RankChannel(store, "job", 0, 2, period_s=3600.0)
    try:
        ch.put({"job_id": "job", "rank": 0, "step": 0, "t_end_ns": 2_000_000, "step_ms": 1.0}, [row])
        ch.flush()
        assert len(ch._pending) == 1  # waiting for its end, not failed
    finally:
        ch.close()
