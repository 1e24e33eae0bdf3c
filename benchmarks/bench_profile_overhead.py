"""Does profiling change what it measures? Timed-step medians with tracing vs --no-trace.

Runs `python -m dpcore profile` alternately with and without tracing (interleaved, so slow
drifts of a shared machine hit both arms equally), then compares the median timed step time
per job as a ratio traced / untraced. Also reports the wall time of each invocation.

    python -m benchmarks.bench_profile_overhead --repeats 3 --variants flat,bucketed,torch_ddp
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd


def one(out: Path, trace: bool, variants: str, world_sizes: str, steps: int) -> tuple[pd.DataFrame, float]:
    cmd = [sys.executable, "-m", "dpcore", "profile", "--variants", variants, "--world-sizes",
           world_sizes, "--steps", str(steps), "--progress", "none", "--out", str(out)]
    if not trace:
        cmd.append("--no-trace")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    run = max(out.iterdir(), key=lambda p: p.stat().st_mtime)
    steps_df = pd.read_csv(run / "steps.csv")
    timed = steps_df[~steps_df["profiled"].astype(bool)]
    return timed.groupby("job_id")["step_ms"].median(), wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="flat,bucketed,torch_ddp")
    ap.add_argument("--world-sizes", default="2")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    res: dict[bool, list[pd.Series]] = {True: [], False: []}
    walls: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            for trace in ((True, False) if i % 2 == 0 else (False, True)):
                med, wall = one(Path(tmp), trace, a.variants, a.world_sizes, a.steps)
                res[trace].append(med)
                walls[trace].append(wall)
    traced = pd.concat(res[True], axis=1).median(axis=1)
    plain = pd.concat(res[False], axis=1).median(axis=1)
    table = pd.DataFrame({"traced_ms": traced, "no_trace_ms": plain, "ratio": traced / plain})
    print(table.round(3).to_string())
    print(f"median ratio over jobs: {table['ratio'].median():.3f}")
    print(f"wall s per invocation (median): traced {statistics.median(walls[True]):.1f}, "
          f"no-trace {statistics.median(walls[False]):.1f}")


if __name__ == "__main__":
    main()
