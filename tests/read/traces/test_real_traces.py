"""Numbers that hold on real traces (issue 19): every trace folder in ``../shared/traces/``.

Traces other projects recorded (HTA's and TraceLens' test data, a kineto sample: see each
folder's SOURCE.txt) are read by ``analyze``, ``import`` and ``summarize`` and checked against an
exact interval sweep written here, independently of dpcore: plain Python over the JSON events.

The sweep's definitions (docs/DESIGN.md's metrics, issue 19's rules):

* steps: the ``ProfilerStep#N`` ranges on the host (not their ``gpu_user_annotation`` copies);
  a trace without any is one step covering its host events;
* GPU traces: a kernel counts in the step where its launch (the runtime event with its
  correlation id) started; a kernel whose launch is not in the trace counts nowhere. comm =
  kernels with ``nccl`` in the name; compute = the other kernels but memcpy/memset/``Sync``;
* CPU traces: comm = ``gloo:*`` spans (not barriers) off the main thread (the one with the
  ProfilerStep ranges), compute = the main thread's ops, each in the step it starts in;
* per rank: overlap % = Σ_steps |comm ∩ compute| / Σ_steps |comm| (unions per step);
* a collective's metadata is its kernel's own args, else those of the innermost
  ``record_param_comms`` range around its launch on the launching thread; bytes = max(in, out)
  elements x dtype size.

The tests skip, saying why, when ``../shared/traces`` is absent (a user's fresh clone).
"""
from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest

from dpcore.read.importer.write_run import import_traces
from dpcore.read.report.analyze import analyze
from dpcore.read.report.summarize import summarize
from dpcore.read.rundir import load_run

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
FOLDERS = sorted(p.name for p in TRACES.iterdir() if p.is_dir()) if TRACES.is_dir() else []
DEVICE = {"kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset", "gpu_user_annotation",
          "cuda_driver_kernel"}
LAUNCH = {"cuda_runtime", "cuda_driver", "Runtime"}
SIZES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1, "Char": 1, "Bool": 1}
OPS = {"allreduce": "all_reduce", "broadcast": "broadcast", "_allgather_base": "all_gather",
       "allgather": "all_gather", "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter"}
STEP = re.compile(r"ProfilerStep#(\d+)$")

pytestmark = pytest.mark.skipif(not FOLDERS, reason=f"no real traces at {TRACES} (CI has them; a fresh clone "
                                                    "does not): nothing to check them against")


def _events(path: Path) -> tuple[dict, list[dict]]:
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc.pop("traceEvents") if isinstance(doc, dict) else doc
    return (doc if isinstance(doc, dict) else {}), [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def _union(iv: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for s, e in sorted(iv):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _length(u: list[list[float]]) -> float:
    return sum(e - s for s, e in u)


def _intersection(a: list[list[float]], b: list[list[float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _meta_of(e: dict, host: list[dict], launch: dict | None) -> dict | None:
    """A comm kernel's collective metadata: its own args, else the innermost record_param_comms
    range (with metadata) on its launch's thread around the launch's start."""
    if "Collective name" in e.get("args", {}):
        return e["args"]
    if launch is None:
        return None
    around = [r for r in host if r["name"] == "record_param_comms" and "Collective name" in r.get("args", {})
              and (r["pid"], r["tid"]) == (launch["pid"], launch["tid"])
              and r["ts"] <= launch["ts"] < r["ts"] + r["dur"]]
    return max(around, key=lambda r: r["ts"])["args"] if around else None


def exact_sweep(path: Path) -> dict:
    """The numbers of one rank's trace by the module docstring's definitions."""
    meta, events = _events(path)
    rank = (meta.get("distributedInfo") or {}).get("rank", 0)
    host = [e for e in events if e.get("cat") not in DEVICE]
    steps: dict[int, tuple[float, float]] = {}
    for e in host:
        m = STEP.match(str(e.get("name")))
        if m:
            steps[int(m.group(1))] = (e["ts"], e["ts"] + e.get("dur", 0))
    if not steps:
        steps = {0: (min(e["ts"] for e in host), max(e["ts"] + e.get("dur", 0) for e in host))}

    def step_at(t: float) -> int | None:
        return next((n for n, (s, end) in steps.items() if s <= t < end), None)

    comm: dict[int, list] = defaultdict(list)
    comp: dict[int, list] = defaultdict(list)
    collectives = []  # (step, op name or None, bytes or None)
    kernels = [e for e in events if e.get("cat") in ("kernel", "Kernel")]
    if kernels:
        launches: dict = {}
        for e in host:
            c = e.get("args", {}).get("correlation")
            if e.get("cat") in LAUNCH and c is not None:
                launches.setdefault(c, e)
        for k in kernels:
            launch = launches.get(k.get("args", {}).get("correlation"))
            s = step_at(launch["ts"]) if launch else None
            if s is None:
                continue
            name, iv = k["name"], (k["ts"], k["ts"] + k["dur"])
            if "nccl" in name.lower():
                comm[s].append(iv)
                m = _meta_of(k, host, launch)
                nbytes = None
                if m and m.get("dtype") in SIZES:
                    nbytes = max(m["In msg nelems"], m["Out msg nelems"]) * SIZES[m["dtype"]]
                collectives.append((s, m["Collective name"] if m else None, nbytes))
            elif not any(w in name.lower() for w in ("memcpy", "memset")) and "Sync" not in name:
                comp[s].append(iv)
    else:
        marks = [(e["pid"], e["tid"]) for e in host if STEP.match(str(e.get("name")))]
        main = max(set(marks), key=marks.count)
        for e in host:
            s = step_at(e["ts"])
            if s is None:
                continue
            iv = (e["ts"], e["ts"] + e["dur"])
            if (e["pid"], e["tid"]) == main:
                if e.get("cat") in ("cpu_op", "Operator"):
                    comp[s].append(iv)
            elif e["name"].startswith("gloo:") and "barrier" not in e["name"]:
                comm[s].append(iv)
                collectives.append((s, None, None))
    c_len = ov = k_len = 0.0
    for s in steps:
        cu, ku = _union(comm[s]), _union(comp[s])
        c_len, ov, k_len = c_len + _length(cu), ov + _intersection(cu, ku), k_len + _length(ku)
    n = len(steps)
    return {"rank": rank, "steps": sorted(steps), "overlap_pct": 100 * ov / c_len if c_len else float("nan"),
            "comm_ms": c_len / n / 1e3, "compute_ms": k_len / n / 1e3, "collectives": collectives}


@pytest.fixture(scope="module", params=FOLDERS)
def folder(request, tmp_path_factory) -> dict:
    """One trace folder: the sweep of each rank, and what analyze, import and summarize say."""
    path = TRACES / request.param
    files = sorted(f for f in path.iterdir() if f.name.endswith((".json", ".json.gz")))
    sweeps = {s["rank"]: s for s in map(exact_sweep, files)}
    imported = import_traces(path, tmp_path_factory.mktemp("profiles"), request.param)
    return {"name": request.param, "sweeps": sweeps,
            "analyze": pd.read_csv(StringIO(analyze(str(path), csv=True))).set_index("rank"),
            "run": load_run(imported.run_dir), "imported": imported,
            "summarize": pd.read_csv(StringIO(summarize(str(imported.run_dir), csv=True)))}


def test_overlap_matches_the_exact_sweep(folder):
    for rank, sw in folder["sweeps"].items():
        got = folder["analyze"].loc[rank]
        if sw["comm_ms"] == 0:
            assert got["comm_ms"] == 0 and pd.isna(got["overlap_pct"]), folder["name"]
        else:
            assert abs(got["overlap_pct"] - sw["overlap_pct"]) < 0.5, (folder["name"], rank)
        assert got["comm_ms"] == pytest.approx(sw["comm_ms"], rel=1e-3, abs=1e-3), (folder["name"], rank)
        assert got["compute_ms"] == pytest.approx(sw["compute_ms"], rel=1e-3, abs=1e-3), (folder["name"], rank)


def test_collectives_are_the_launched_ones_with_their_metadata(folder):
    coll = folder["run"].collectives
    for rank, sw in folder["sweeps"].items():
        mine = coll[coll["rank"] == rank].sort_values(["step", "seq"])
        assert len(mine) == len(sw["collectives"]), (folder["name"], rank)
        want = sorted(sw["collectives"], key=lambda c: c[0])
        assert mine["step"].tolist() == [c[0] for c in want], folder["name"]
        got_pairs = sorted(((int(s), str(o), None if pd.isna(b) else int(b))
                            for s, o, b in zip(mine["step"], mine["op"], mine["bytes"])), key=repr)
        want_pairs = sorted(((s, OPS.get(n, "?") if n else None, b) for s, n, b in want), key=repr)
        if any(n for _, n, _ in want):  # the trace names its collectives: op and bytes as it says
            assert got_pairs == want_pairs, folder["name"]
            assert "unknown" not in set(mine["op"])
        else:  # no metadata: bytes unknown (empty), never 0
            assert mine["bytes"].isna().all(), folder["name"]


def test_every_command_reports_the_same_steps(folder):
    steps = folder["run"].steps
    for rank, sw in folder["sweeps"].items():
        assert sorted(steps.loc[steps["rank"] == rank, "step"]) == sw["steps"], folder["name"]
        assert folder["analyze"].loc[rank, "steps"] == len(sw["steps"]), folder["name"]
    n_steps = max(len(sw["steps"]) for sw in folder["sweeps"].values())
    assert folder["imported"].steps == sum(len(sw["steps"]) for sw in folder["sweeps"].values())
    s = folder["summarize"].iloc[0]
    assert s["comm_steps"] == n_steps and s["step_ms"] > 0, folder["name"]
    if any(sw["comm_ms"] > 0 for sw in folder["sweeps"].values()):  # summarize = mean over ranks of analyze
        assert s["overlap_pct"] == pytest.approx(folder["analyze"]["overlap_pct"].mean(), abs=1e-3)
