"""Time the Timeline's lanes on a made 30,000-step GPU trace (not a test: timings vary by machine).

Prints the seconds of: the parse alone; the dashboard's first page (the eager tables of every job,
the overlap of each step among them); the Timeline's first read of one step's lanes through the
rank cache (a miss: the parse and the ``lane_events`` table, stored); a later visit to
another step (a hit: the cached table read, one step reduced); and the lanes of every step, which
is what the first read reduced before the cache kept lane events (the old ``lanes`` table).

    python scripts/bench_timeline_lanes.py [STEPS]     # ALL_STEPS=1: also every step's lanes (minutes)
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpcore.read.analysis.lanes import LANE_EVENTS_TABLE, trace_lanes  # noqa: E402
from dpcore.read.ranks import Scale  # noqa: E402
from dpcore.read.ranks.reduce import reduce_trace  # noqa: E402
from dpcore.read.rundir import load_run  # noqa: E402
from dpcore.read.tables import job_lanes, run_trace_steps  # noqa: E402
from dpcore.read.traces.reader import read_trace  # noqa: E402
from tests.read.ranks.long_trace import write_long_trace  # noqa: E402

JOB = "zero1-ws1-b0.25"


def main(steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DPCORE_CACHE_DIR"] = str(Path(tmp) / "cache")
        run_dir = shutil.copytree(ROOT / "profiles" / "sample-train", Path(tmp) / "sample-train",
                                  ignore=shutil.ignore_patterns("cache"))
        trace = write_long_trace(run_dir / "traces" / JOB / "rank0.json.gz", steps)
        print(f"trace: {steps} steps, {trace.stat().st_size / 1e6:.1f} MB gzipped")
        t = time.perf_counter()
        events = read_trace(trace)
        print(f"parse alone: {time.perf_counter() - t:.2f} s ({len(events)} events)")
        t = time.perf_counter()
        table = reduce_trace(trace, False, (LANE_EVENTS_TABLE,))[LANE_EVENTS_TABLE]
        print(f"parse + lane_events table: {time.perf_counter() - t:.2f} s ({len(table)} rows)")
        t = time.perf_counter()
        run_trace_steps(load_run(run_dir), Scale(workers=1))
        print(f"the dashboard's first page before it (every job's eager tables, the overlap of every step): "
              f"{time.perf_counter() - t:.2f} s")
        t = time.perf_counter()
        job_lanes(load_run(run_dir), JOB, steps=[5], scale=Scale(workers=1))
        print(f"Timeline's first read, one step's lanes (a miss: parse, lane_events table stored): "
              f"{time.perf_counter() - t:.2f} s")
        t = time.perf_counter()
        job_lanes(load_run(run_dir), JOB, steps=[steps // 2])
        print(f"later visit, another step (hit): {time.perf_counter() - t:.2f} s")
        t = time.perf_counter()
        trace_lanes(table, [steps - 1])
        print(f"one step's lanes from the table in memory (the page's rerun): {time.perf_counter() - t:.3f} s")
        if os.environ.get("ALL_STEPS"):  # ~10 minutes at 30,000 steps
            t = time.perf_counter()
            trace_lanes(table)
            print(f"every step's lanes (what the first read reduced before): {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30_000)
