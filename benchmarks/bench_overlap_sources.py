"""Benchmark: do the two measurements of a profiled step's overlap agree on a quiet machine?

A `profile` run measures its traced steps twice: from collectives.csv + the phase intervals
(Python-side timestamps around each collective and phase) and from the torch.profiler trace
(gloo's spans against the main thread's compute). Both see the same steps, but a loaded
machine delays the Python-side timestamps (a descheduled thread notices a collective's end
late), so how closely they agree is a timing claim, kept here rather than in the test suite
(tests/read/report/test_analyze_summarize_profile_run.py checks what holds under any load: the
same (rank, step) pairs, and blocking flat near 0 both ways). Expected on a quiet machine:
every rank's gap within 10 points; the per-rank gaps and the machine's load average are printed.

    python -m benchmarks.bench_overlap_sources [--runs 3] [--steps 4] [--bound 10]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOBS = ("flat-ws2", "overlap-ws2")


def gaps(run_dir: Path) -> dict[tuple[str, int], tuple[float, float]]:
    """(job, rank) -> (overlap % from intervals, overlap % from the trace), over the traced steps."""
    from dpcore.read.analysis import overlap_from_trace, step_breakdown
    from dpcore.read.rundir import load_run
    from tests.trace_helpers import read_trace_dir
    run = load_run(run_dir)
    iv = step_breakdown(run.steps, run.collectives, profiled=True, calls=run.comm_calls)
    out: dict[tuple[str, int], tuple[float, float]] = {}
    for job in JOBS:
        tr = overlap_from_trace(read_trace_dir(run_dir / "traces" / job))
        tr = tr[tr["step"] >= 0]
        a = iv[iv["job_id"] == job].groupby("rank")[["overlapped_ms", "comm_ms"]].sum()
        b = tr.groupby("rank")[["overlapped_ms", "comm_ms"]].sum()
        for rank in sorted(set(a.index) & set(b.index)):
            out[(job, int(rank))] = (100 * a.loc[rank, "overlapped_ms"] / a.loc[rank, "comm_ms"],
                                     100 * b.loc[rank, "overlapped_ms"] / b.loc[rank, "comm_ms"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--bound", type=float, default=10.0, help="largest gap in points (default 10)")
    args = ap.parse_args()
    worst = 0.0
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "dpcore", "profile", "--variants", "flat,overlap",
                   "--world-sizes", "2", "--steps", str(args.steps), "--warmup", "1", "--out", out]
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                print(p.stderr[-2000:], file=sys.stderr)
                return 2
            (run_dir,) = [d for d in Path(out).iterdir() if d.is_dir()]
            load = os.getloadavg()[0]
            for (job, rank), (pct_iv, pct_tr) in gaps(run_dir).items():
                gap = abs(pct_iv - pct_tr)
                worst = max(worst, gap)
                print(f"run {i} load {load:.1f} {job} rank {rank}: intervals {pct_iv:.1f} % "
                      f"trace {pct_tr:.1f} % gap {gap:.1f} points", flush=True)
    print(f"largest gap {worst:.1f} points (bound {args.bound:g}): "
          f"{'within' if worst < args.bound else 'OVER'}")
    return 0 if worst < args.bound else 1


if __name__ == "__main__":
    sys.exit(main())
