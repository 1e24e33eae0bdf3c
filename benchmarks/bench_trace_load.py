"""Benchmark: ``analyze`` of a 4-rank x ~250k-event trace folder vs Holistic Trace Analysis.

Ours: dpcore's first read of the folder (its cache deleted before every run), as ``python -m
dpcore analyze DIR --csv`` does it with its default workers: every rank's trace parsed and reduced
to its per-rank overlap. HTA: ``TraceAnalysis(trace_dir).get_comm_comp_overlap``, on the same
synthetic GPU traces. Each tool runs in a fresh subprocess, --repeat times, interleaved with the
other tool so that a noisy minute slows both; the medians and their ratio ours/HTA (time,
memory) are printed, with the run-by-run ratios. Per run: wall time (imports excluded), CPU time
of the process and its workers, peak RSS (VmHWM) and that minus the RSS after imports, and the
largest peak RSS of a worker process (both tools parse ranks in worker processes, whose memory is
not in the parent's VmHWM); "memory" is the peak RSS of any process of a run.

HTA is benchmark-only, never a dependency: ``--hta-python`` (default ``$DPCORE_HTA_PYTHON``, else
this Python) names an interpreter that has it (``pip install HolisticTraceAnalysis`` in a venv).
Where it cannot import ``hta`` the benchmark says so on its first line and times dpcore alone.

    python -m benchmarks.bench_trace_load [--dir D] [--events 250000] [--hta-python PY] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
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
if tool == "ours":  # analyze DIR --csv, first read: the cache of DIR deleted
    import csv, io, shutil
    from pathlib import Path
    from dpcore.read.ranks import Scale
    from dpcore.read.ranks.cache import cache_dir
    from dpcore.read.report.analyze import analyze
    shutil.rmtree(cache_dir(Path(d)), ignore_errors=True)
    base = rss(); t = time.perf_counter(); c0 = os.times()
    rows = list(csv.DictReader(io.StringIO(analyze(d, csv=True, scale=Scale(workers=None)))))
    pct = {int(r["rank"]): round(float(r["overlap_pct"]), 2) for r in rows}; n = len(rows)
else:
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    base = rss(); t = time.perf_counter(); c0 = os.times()
    ta = TraceAnalysis(trace_dir=d)
    res = ta.get_comm_comp_overlap(visualize=False)
    pct = res.set_index("rank")["comp_comm_overlap_pctg"].to_dict(); n = len(pct)
secs, c1 = time.perf_counter() - t, os.times()
cpu = sum(c1[i] - c0[i] for i in range(4))  # user + system, this process and its reaped workers
workers_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"tool": tool, "seconds": secs, "cpu_s": cpu, "peak_mb": rss(), "import_mb": base,
                  "worker_peak_mb": workers_mb,
                  "rows": n, "overlap_pct": {str(k): v for k, v in pct.items()}}))
"""


def ensure_traces(d: Path, events: int, ranks: int) -> None:
    """Generate the synthetic GPU traces once (about 3 events per kernel, 10 steps)."""
    from tests.synthetic import write_gpu_trace_dir
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


def hta_missing(python: str) -> str | None:
    """None when ``python`` can import Holistic Trace Analysis, else one line saying why not."""
    p = subprocess.run([python, "-c", "import hta.trace_analysis"], capture_output=True, text=True)
    if p.returncode == 0:
        return None
    why = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
    return (f"HTA ABSENT: {python} cannot import hta ({why}); timing dpcore alone, no ratio. "
            "Install it apart from dpcore (python -m venv --system-site-packages V && "
            "V/bin/pip install HolisticTraceAnalysis) and pass --hta-python V/bin/python")


def run_child(python: str, tool: str, d: Path) -> dict:
    p = subprocess.run([python, "-c", _CHILD, tool, str(d)], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        return {"tool": tool, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _median(runs: list[dict], key: str) -> float:
    vals = sorted(r[key] for r in runs)
    return vals[(len(vals) - 1) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2


def summarize(tool: str, runs: list[dict]) -> dict:
    """Medians over a tool's successful runs (shared machines are noisy), with every run's numbers.

    ``mem_mb`` is the peak RSS of any process of a run (the parent, or its largest worker: both
    tools parse ranks in worker processes), the memory the tool needs on one core.
    """
    ok = [dict(r, mem_mb=max(r["peak_mb"], r["worker_peak_mb"])) for r in runs if "error" not in r]
    if not ok:
        return runs[-1] if runs else {"tool": tool, "error": "not run"}
    out = {k: _median(ok, k) for k in ("seconds", "cpu_s", "peak_mb", "import_mb", "worker_peak_mb", "mem_mb")}
    out.update(tool=tool, rows=ok[0]["rows"], overlap_pct=ok[0]["overlap_pct"],
               all_seconds=[round(r["seconds"], 2) for r in ok], all_mem_mb=[round(r["mem_mb"]) for r in ok])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/dpcore_bench_traces")
    ap.add_argument("--events", type=int, default=250_000, help="events per rank")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--hta-python", default=os.environ.get("DPCORE_HTA_PYTHON") or sys.executable,
                    help="interpreter with HTA installed (default: $DPCORE_HTA_PYTHON, else this one)")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--repeat", type=int, default=5, help="runs per tool; the medians are shown")
    a = ap.parse_args()
    d = Path(a.dir)
    ensure_traces(d, a.events, a.ranks)
    size = sum(f.stat().st_size for f in d.glob("rank*.json*")) / 1e6
    print(f"{a.ranks} ranks, ~{a.events} events each, {size:.0f} MB gzipped")
    missing = "HTA not run (--skip-hta)" if a.skip_hta else hta_missing(a.hta_python)
    if missing:
        print(missing)
    tools = {"ours": sys.executable} if missing else {"ours": sys.executable, "hta": a.hta_python}
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    for _ in range(max(1, a.repeat)):  # interleaved, so a noisy minute slows both tools alike
        for tool, python in tools.items():
            runs[tool].append(run_child(python, tool, d))
    results = {t: summarize(t, rs) for t, rs in runs.items()}
    for r in results.values():
        if "error" in r:
            print(f"{r['tool']:>5}: failed: {r['error']}")
        else:
            print(f"{r['tool']:>5}: {r['seconds']:6.2f} s (cpu {r['cpu_s']:.2f} s)  peak RSS {r['peak_mb']:5.0f} MB "
                  f"(+{r['peak_mb'] - r['import_mb']:.0f} MB over imports), worker peak {r['worker_peak_mb']:.0f} MB  "
                  f"ranks {r['rows']}  overlap% {r['overlap_pct']}")
            print(f"       runs: {r['all_seconds']} s; peak RSS of any process per run: {r['all_mem_mb']} MB")
    ours, hta = results.get("ours", {}), results.get("hta", {})
    if "seconds" in ours and "seconds" in hta:
        diff = max(abs(ours["overlap_pct"][k] - v) for k, v in hta["overlap_pct"].items()) \
            if set(ours["overlap_pct"]) == set(hta["overlap_pct"]) else float("nan")
        pairs = [round(o["seconds"] / h["seconds"], 3) for o, h in zip(runs["ours"], runs["hta"])
                 if "error" not in o and "error" not in h]
        print(f"ratio ours/HTA: time {ours['seconds'] / hta['seconds']:.3f}x (medians; run by run {pairs}), "
              f"memory {ours['mem_mb'] / hta['mem_mb']:.2f}x (peak RSS of any process); "
              f"overlap% differs by at most {diff:.2f} points")


if __name__ == "__main__":
    main()
