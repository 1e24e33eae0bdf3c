"""Benchmark: load a 4-rank x ~250k-event trace folder and compute per-rank overlap.

Ours (dpcore.read.analysis.read_trace_dir + overlap_by_rank) vs Holistic Trace Analysis
(TraceAnalysis(trace_dir).get_comm_comp_overlap). Each tool runs in a fresh subprocess, --repeat
times (the median is printed: shared machines are noisy); we report wall time, CPU time of the
process and its workers, peak RSS (VmHWM) minus the RSS after imports, so the numbers are the cost
of the trace itself, and the largest peak RSS of any worker process (ours parses ranks in parallel
processes; their memory is not in the parent's VmHWM). HTA is benchmark-only (pip install HolisticTraceAnalysis psutil), never a
dependency; pass --hta-python to use an interpreter from a separate venv.

    python -m benchmarks.bench_trace_load [--dir /tmp/dpcore_bench] [--events 250000] [--hta-python PY] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_CHILD = r"""
import json, os, resource, sys, time, logging
tool, d = sys.argv[1], sys.argv[2]
def rss():  # VmHWM: peak RSS of this exec (ru_maxrss would inherit the parent's peak across fork)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
if tool == "ours":
    from dpcore.read.analysis import read_trace_dir, overlap_by_rank
    base = rss(); t = time.perf_counter(); c0 = os.times()
    ev = read_trace_dir(d); res = overlap_by_rank(ev)
    pct = res.set_index("rank")["overlap_pct"].round(2).to_dict(); n = len(ev)
else:
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    base = rss(); t = time.perf_counter(); c0 = os.times()
    ta = TraceAnalysis(trace_dir=d)
    res = ta.get_comm_comp_overlap(visualize=False)
    pct = res.set_index("rank")["comp_comm_overlap_pctg"].to_dict(); n = sum(len(x) for x in ta.t.traces.values())
secs, c1 = time.perf_counter() - t, os.times()
cpu = sum(c1[i] - c0[i] for i in range(4))  # user + system, this process and its reaped workers
workers_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"tool": tool, "seconds": secs, "cpu_s": cpu, "peak_mb": rss(), "import_mb": base,
                  "worker_peak_mb": workers_mb,
                  "rows": n, "overlap_pct": {str(k): v for k, v in pct.items()}}))
"""


def ensure_traces(d: Path, events: int, ranks: int) -> None:
    """Generate the synthetic GPU traces once (about 3 events per kernel, 10 steps)."""
    from dpcore.read.analysis.synthetic import write_gpu_trace_dir
    marker = d / f".ok-{ranks}x{events}"
    if marker.exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    for f in d.glob("rank*.json*"):
        f.unlink()
    t = time.perf_counter()
    write_gpu_trace_dir(d, world_size=ranks, steps=10, kernels_per_step=max(1, events // 30), seed=1)
    marker.write_text("")
    print(f"generated {ranks} traces in {time.perf_counter() - t:.1f}s under {d}", file=sys.stderr)


def run_child(python: str, tool: str, d: Path) -> dict:
    p = subprocess.run([python, "-c", _CHILD, tool, str(d)], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        return {"tool": tool, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def median_run(python: str, tool: str, d: Path, repeat: int) -> dict:
    """Run a tool `repeat` times; the run with the median wall time, with every run's seconds."""
    runs = [run_child(python, tool, d) for _ in range(max(1, repeat))]
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["seconds"])
    if not ok:
        return runs[-1]
    med = dict(ok[(len(ok) - 1) // 2])
    med["all_seconds"] = [round(r["seconds"], 2) for r in ok]
    med["all_peak_mb"] = sorted(round(max(r["peak_mb"], r["worker_peak_mb"])) for r in ok)
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/dpcore_bench_traces")
    ap.add_argument("--events", type=int, default=250_000, help="events per rank")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--hta-python", default=sys.executable, help="interpreter with HTA installed")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool; the median is shown")
    a = ap.parse_args()
    d = Path(a.dir)
    ensure_traces(d, a.events, a.ranks)
    size = sum(f.stat().st_size for f in d.glob("rank*.json*")) / 1e6
    print(f"{a.ranks} ranks, ~{a.events} events each, {size:.0f} MB gzipped")
    results = [median_run(sys.executable, "ours", d, a.repeat)]
    if not a.skip_hta:
        results.append(median_run(a.hta_python, "hta", d, a.repeat))
    for r in results:
        if "error" in r:
            print(f"{r['tool']:>5}: failed: {r['error']}")
        else:
            print(f"{r['tool']:>5}: {r['seconds']:6.2f} s (cpu {r['cpu_s']:.2f} s)  peak RSS {r['peak_mb']:5.0f} MB "
                  f"(+{r['peak_mb'] - r['import_mb']:.0f} MB over imports), worker peak {r['worker_peak_mb']:.0f} MB  "
                  f"rows {r['rows']}  overlap% {r['overlap_pct']}")
            print(f"       runs: {r['all_seconds']} s; peak RSS of any process per run: {r['all_peak_mb']} MB")


if __name__ == "__main__":
    main()
