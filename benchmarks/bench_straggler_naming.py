"""How clearly does `stragglers` name a rank that `profile --inject-delay` slows down?

Not a test: what share of the collectives the delayed rank arrives last at, and how long the
others wait for it, depend on how the machine's scheduler treats the ranks, so they are
measured here rather than asserted in the suite (`tests/write/commands/test_profile_fairness.py`
keeps the claims that do not: the delayed rank is the one named and the one waited for).

    python -m benchmarks.bench_straggler_naming --repeats 3 --delay-ms 250

Each repeat runs `python -m dpcore profile` (flat and overlap, world size 2, tiny mlp, no
traces, rank 1 sleeping --delay-ms every step), then `python -m dpcore stragglers RUN --csv`,
and prints per job: rank 1's last-arrival %, rank 0's mean wait and that wait as a share of the
delay. It exits 1 when a repeat falls under --min-pct or --min-wait-share (the bars the suite
used to hold: 75 % and 0.4 of the delay), so a quiet-machine run can be read as pass or fail.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
JOBS = ("flat-ws2", "overlap-ws2")


def one(out: Path, delay_ms: int, steps: int) -> pd.DataFrame:
    """One profile + stragglers; the rows of rank 1's share and rank 0's wait per job."""
    cmd = [sys.executable, "-m", "dpcore", "profile", "--variants", "flat,overlap", "--world-sizes", "2",
           "--steps", str(steps), "--warmup", "1", "--no-trace", "--model", "mlp", "--width", "64",
           "--batch-size", "8", "--inject-delay", f"1:{delay_ms}", "--progress", "none", "--out", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    run = next(d for d in out.iterdir() if d.is_dir())
    p = subprocess.run([sys.executable, "-m", "dpcore", "stragglers", str(run), "--csv"], cwd=ROOT,
                       check=True, capture_output=True, text=True)
    df = pd.read_csv(io.StringIO(p.stdout))
    rows = []
    for job in JOBS:
        mine = df[df["job_id"] == job].set_index("rank")
        rows.append({"job_id": job, "rank1_last_pct": float(mine.loc[1, "last_arrival_pct"]),
                     "rank0_wait_ms": float(mine.loc[0, "mean_wait_ms"]),
                     "wait_share": float(mine.loc[0, "mean_wait_ms"]) / delay_ms})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delay-ms", type=int, default=250)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--min-pct", type=float, default=75.0)
    ap.add_argument("--min-wait-share", type=float, default=0.4)
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.delay_ms < 1 or a.steps < 3:
        print("error: --repeats and --delay-ms must be >= 1 and --steps >= 3", file=sys.stderr)
        return 2
    frames = []
    for i in range(a.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            frames.append(one(Path(tmp), a.delay_ms, a.steps).assign(repeat=i))
    table = pd.concat(frames, ignore_index=True)
    print(table.round(3).to_string(index=False))
    bad = table[(table["rank1_last_pct"] < a.min_pct) | (table["wait_share"] < a.min_wait_share)]
    print(f"{len(table) - len(bad)} of {len(table)} job runs at or above {a.min_pct:g} % and "
          f"{a.min_wait_share:g} of the delay")
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
