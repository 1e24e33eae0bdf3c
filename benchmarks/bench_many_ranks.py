"""Benchmark: many ranks. dpcore's first read (no cache), its second read (the cache of
``cache/``) and, optionally, Holistic Trace Analysis, on the same synthetic GPU trace folder.

Each measurement runs in a fresh subprocess, ``--repeat`` times, interleaved (first, second,
HTA, first, ...) so that a noisy minute on a shared machine slows all of them; medians are
printed, and the ratios of the medians. Memory is the peak RSS of any process of a run (the
parent's VmHWM or its largest worker's, both tools parse ranks in worker processes). dpcore's
read is ``analyze PATH --csv`` (per-rank overlap, the same as HTA's get_comm_comp_overlap) with
its default workers (the cores); ``summarize``'s read of a run is the same per-rank reduction.

    python -m benchmarks.bench_many_ranks --ranks 256 --events 20000 [--hta-python PY] [--repeat 3]

``--run`` measures what a user of a run does instead: the folder is imported once as a run
(``import``, its time and peak memory printed), then ``summarize RUN`` is timed with its cache
deleted (first) and with it (second), interleaved.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_trace_load import _median, ensure_traces, hta_missing, run_child  # noqa: E402
from dpcore.read.ranks.cache import cache_dir  # noqa: E402

#: What every measured child starts with: its imports and its peak RSS (VmHWM) in MB.
_PRELUDE = r"""
import json, os, resource, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""

_OURS = _PRELUDE + r"""
d, workers = sys.argv[2], sys.argv[3]
from dpcore.read.ranks import Scale
from dpcore.read.report.analyze import analyze
base = rss(); t = time.perf_counter(); c0 = os.times()
out = analyze(d, csv=True, scale=Scale(workers=None if workers == "auto" else int(workers)))
secs, c1 = time.perf_counter() - t, os.times()
print(json.dumps({"tool": sys.argv[1], "seconds": secs, "cpu_s": sum(c1[i] - c0[i] for i in range(4)),
                  "peak_mb": rss(), "import_mb": base,
                  "worker_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "rows": out.count("\n") - 1, "overlap_pct": {}}))
"""


_SUMMARIZE = _PRELUDE + r"""
run = sys.argv[2]
t = time.perf_counter(); c0 = os.times()
from dpcore.read.report.summarize import summarize
out = summarize(run)
secs, c1 = time.perf_counter() - t, os.times()
print(json.dumps({"tool": sys.argv[1], "seconds": secs, "cpu_s": sum(c1[i] - c0[i] for i in range(4)),
                  "peak_mb": rss(), "worker_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "rows": out.count("\n")}))
"""

_IMPORT = _PRELUDE + r"""
t = time.perf_counter(); c0 = os.times()
from dpcore.read.importer.write_run import import_traces
res = import_traces(sys.argv[1], sys.argv[2], name="bench")
secs, c1 = time.perf_counter() - t, os.times()
print(json.dumps({"run": str(res.run_dir), "seconds": secs, "cpu_s": sum(c1[i] - c0[i] for i in range(4)),
                  "peak_mb": rss(), "worker_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def _child(code: str, *args: str) -> dict:
    import json
    import subprocess
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        return {"tool": args[0], "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_mode(d: Path, repeat: int) -> dict[str, list[dict]]:
    """Import ``d`` once as a run, then ``summarize`` it first (no cache) and second (cache)."""
    out = d.parent / f"{d.name}_runs"
    shutil.rmtree(out, ignore_errors=True)
    imp = _child(_IMPORT, str(d), str(out))
    if "error" in imp:
        sys.exit(f"import failed: {imp['error']}")
    print(f"import: {imp['seconds']:.1f} s (cpu {imp['cpu_s']:.1f} s), peak RSS of any process "
          f"{max(imp['peak_mb'], imp['worker_peak_mb']):.0f} MB -> {imp['run']}")
    runs: dict[str, list[dict]] = {"first": [], "second": []}
    for _ in range(max(1, repeat)):
        shutil.rmtree(cache_dir(Path(imp["run"])), ignore_errors=True)
        runs["first"].append(_child(_SUMMARIZE, "first", imp["run"]))
        runs["second"].append(_child(_SUMMARIZE, "second", imp["run"]))
    return runs


def ours(kind: str, d: Path, workers: str) -> dict:
    """One dpcore read in a fresh process: 'first' after deleting its cache (the user's cache
    folder for a folder of traces), 'second' with it."""
    import json
    import subprocess
    if kind == "first":
        shutil.rmtree(cache_dir(d), ignore_errors=True)
    p = subprocess.run([sys.executable, "-c", _OURS, kind, str(d), workers], capture_output=True, text=True,
                       cwd=ROOT)
    if p.returncode != 0:
        return {"tool": kind, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--events", type=int, default=20_000, help="events per rank")
    ap.add_argument("--dir", default=None, help="default /tmp/dpcore_bench_<ranks>x<events>")
    ap.add_argument("--hta-python", default=None, help="interpreter with HTA installed (none: HTA not run)")
    ap.add_argument("--workers", default="auto")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--run", action="store_true", help="import the folder as a run, time summarize on it")
    a = ap.parse_args()
    d = Path(a.dir or f"/tmp/dpcore_bench_{a.ranks}x{a.events}")
    t = time.perf_counter()
    ensure_traces(d, a.events, a.ranks)
    size = sum(f.stat().st_size for f in d.glob("rank*.json*")) / 1e6
    print(f"{a.ranks} ranks x ~{a.events} events, {size:.0f} MB gzipped (ready in {time.perf_counter() - t:.0f} s)")
    runs: dict[str, list[dict]] = {"first": [], "second": []}
    missing = hta_missing(a.hta_python) if a.hta_python else "HTA not run (no --hta-python)"
    if missing:
        print(missing)
        a.hta_python = None
    else:
        runs["hta"] = []
    for _ in range(0 if a.run else max(1, a.repeat)):
        runs["first"].append(ours("first", d, a.workers))
        runs["second"].append(ours("second", d, a.workers))
        if a.hta_python:
            runs["hta"].append(run_child(a.hta_python, "hta", d))
    if a.run:
        runs = run_mode(d, a.repeat)
    med = {}
    for tool, rs in runs.items():
        ok = [dict(r, mem_mb=max(r["peak_mb"], r["worker_peak_mb"])) for r in rs if "error" not in r]
        if not ok:
            print(f"{tool:>6}: failed: {rs[-1].get('error')}")
            continue
        med[tool] = {k: _median(ok, k) for k in ("seconds", "cpu_s", "mem_mb")}
        print(f"{tool:>6}: {med[tool]['seconds']:7.2f} s (cpu {med[tool]['cpu_s']:.1f} s), peak RSS of any "
              f"process {med[tool]['mem_mb']:6.0f} MB; runs {[round(r['seconds'], 2) for r in ok]} s, "
              f"{[round(r['mem_mb']) for r in ok]} MB")
    if "first" in med and "second" in med:
        print(f"second/first: time {med['second']['seconds'] / med['first']['seconds']:.3f}x")
    if "first" in med and "hta" in med:
        print(f"first/HTA: time {med['first']['seconds'] / med['hta']['seconds']:.3f}x, "
              f"memory {med['first']['mem_mb'] / med['hta']['mem_mb']:.3f}x")


if __name__ == "__main__":
    main()
