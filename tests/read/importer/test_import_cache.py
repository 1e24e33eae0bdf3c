"""``dpcore import`` reads each rank through the rank cache (issue 23): the run it writes is the
same with and without the cache, from a cache hit, and with 1 and 2 worker processes; a second
import parses no trace; its rows are those of the reader on all ranks' events at once; and 256
ranks import in less memory than their events take in one frame.

Why these traces: two hosts whose clocks differ by 5 s (the import aligns them from the ranks'
compact comm rows) and a real 2-rank gloo DDP job (arrivals linked to the enqueue on the
calling thread), so every cross-rank step of the import is exercised.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.read.importer.rows import IMPORT_TABLES, profiler_steps
from dpcore.read.tables import EAGER
from dpcore.read.traces import workers
from dpcore.read.traces.files import trace_files
from dpcore.read.traces.reader import step_ranges
from tests.memlimit import did_not_fit, run_capped
from tests.synthetic import gpu_trace, write_gpu_trace_dir
from tests.trace_helpers import read_trace_files

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
SHIFT_US = 5e6  # the second host's clock runs 5 s ahead


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sets")
    hosts = root / "hosts"
    hosts.mkdir()
    for r in range(4):
        doc = gpu_trace(r, 4, steps=3, kernels_per_step=8, seed=7)
        for e in doc["traceEvents"]:
            if "ts" in e:
                e["ts"] += SHIFT_US * (r % 2)
        doc["host_name"] = f"node-{r % 2}"
        (hosts / f"rank{r}.json").write_text(json.dumps(doc))
    gloo = root / "gloo"
    shutil.copytree(DATA / "ddp_gloo_delay_rank1", gloo)
    return {"hosts": hosts, "gloo": gloo}


def _import(src: Path, out: Path, cache_dir: Path, *flags: str) -> Path:
    """One ``python -m dpcore import`` (a real CLI process); the run folder it wrote."""
    env = {**os.environ, "DPCORE_CACHE_DIR": str(cache_dir)}
    p = subprocess.run([sys.executable, "-m", "dpcore", "import", str(src), "--out", str(out), *flags],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (run,) = [d for d in out.iterdir() if not d.name.startswith(".")]
    return run


def _written(run: Path) -> dict[str, object]:
    """What an import wrote, less what differs between two imports (ids, times, the command)."""
    meta = json.loads((run / "run.json").read_text())
    for k in ("run_id", "created", "finished", "command"):
        meta.pop(k)
    return {"steps": (run / "steps.csv").read_text(), "collectives": (run / "collectives.csv").read_text(),
            "run.json": meta}


def _cache_files(cache_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(cache_dir)): p.stat().st_mtime_ns for p in cache_dir.rglob("*.parquet")}


@pytest.mark.parametrize("name", ["hosts", "gloo"])
def test_with_and_without_the_cache_and_workers_the_same_run(sets: dict[str, Path], tmp_path: Path,
                                                            name: str) -> None:
    src, cache_dir = sets[name], tmp_path / "cache"
    plain = _written(_import(src, tmp_path / "a", cache_dir, "--no-cache", "--workers", "1"))
    assert not cache_dir.exists()  # --no-cache stores nothing
    filled = _written(_import(src, tmp_path / "b", cache_dir, "--workers", "1"))
    stored = _cache_files(cache_dir)
    # the ranks' list and one file per table import built: the eager ones and its own (no lanes)
    assert sorted(Path(f).stem for f in stored) == sorted(["ranks", *(t.name for t in (*EAGER, *IMPORT_TABLES))])
    hit = _written(_import(src, tmp_path / "c", cache_dir, "--workers", "2"))
    assert _cache_files(cache_dir) == stored  # every rank was a hit: nothing parsed, nothing stored
    two = _written(_import(src, tmp_path / "d", cache_dir, "--no-cache", "--workers", "2"))
    assert plain["steps"].count("\n") > 4 and plain["collectives"].count("\n") > 4
    assert filled == plain and hit == plain and two == plain


def test_two_workers_really_parse_in_a_pool(sets: dict[str, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2-worker import above compares equal; here, that it took the worker-pool path."""
    from dpcore.read.importer.write_run import import_traces
    from dpcore.read.ranks import Scale
    if not workers.can_fork():
        pytest.skip("no fork here (threads running): the pool path is not taken")
    pools = []
    real = workers.worker_pool

    def counting(n: int):
        pools.append(n)
        return real(n)
    monkeypatch.setattr(workers, "worker_pool", counting)
    two = import_traces(sets["hosts"], tmp_path / "two", "p", scale=Scale(workers=2, cache=False))
    assert pools == [2]
    one = import_traces(sets["hosts"], tmp_path / "one", "p", scale=Scale(workers=1, cache=False))
    assert pools == [2] and _written(two.run_dir) == _written(one.run_dir)


def test_rows_are_the_readers_on_all_events(sets: dict[str, Path], tmp_path: Path) -> None:
    """Known answer: steps.csv's steps are profiler_steps of every rank's events read at once
    (step_ranges, a GPU step its kernels' window), each shifted by its rank's offset;
    collectives.csv has one row per comm event in a step; the second host's offset is its 5 s."""
    run = _import(sets["hosts"], tmp_path / "p", tmp_path / "cache")
    meta = json.loads((run / "run.json").read_text())["jobs"][0]
    off = {int(r): o for r, o in meta["clock_offsets_ns"].items()}
    assert meta["clock_alignment"].startswith("aligned to rank 0 by the median end of")
    assert off[0] == 0 and abs(off[2]) < 1e6  # the same host: what is left is the ends' spread
    assert abs(off[1] - SHIFT_US * 1e3) < 1e6 and abs(off[3] - SHIFT_US * 1e3) < 1e6
    events = read_trace_files(trace_files(sets["hosts"]))
    want = profiler_steps(events)
    assert (want["dur"] != step_ranges(events)["dur"]).any()  # GPU steps: their kernels' window
    steps = pd.read_csv(run / "steps.csv")
    assert steps[["rank", "step"]].values.tolist() == want[["rank", "step"]].values.tolist()
    assert steps["step_ms"].tolist() == (want["dur"] / 1e3).tolist()
    assert steps["t_start_ns"].tolist() == [int(round(t * 1e3)) - off[r] for r, t in zip(want["rank"], want["ts"])]
    comm = events[(events["kind"] == "comm") & (events["step"] >= 0)]
    colls = pd.read_csv(run / "collectives.csv")
    assert len(colls) == len(comm)
    assert colls.groupby(["rank", "step"]).size().to_dict() == comm.groupby(["rank", "step"]).size().to_dict()
    ends = np.sort(colls["t_end_ns"].to_numpy())
    assert ends[-1] - ends[0] < SHIFT_US * 1e3  # on one clock again


def test_gzipped_and_plain_copies_of_one_trace_give_one_run(sets: dict[str, Path], tmp_path: Path) -> None:
    """A cache entry is a trace's: the gloo set's traces gunzipped (other files, other keys)
    import to the same rows as the gzipped originals."""
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in trace_files(sets["gloo"]):
        (plain / f.name.removesuffix(".gz")).write_bytes(gzip.decompress(f.read_bytes()))
    a = _written(_import(sets["gloo"], tmp_path / "a", tmp_path / "cache"))
    b = _written(_import(plain, tmp_path / "b", tmp_path / "cache"))
    assert a["steps"] == b["steps"] and a["collectives"] == b["collectives"]


def test_bad_workers_is_one_line_exit_2(sets: dict[str, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from dpcore.cli import main
    assert main(["import", str(sets["hosts"]), "--out", str(tmp_path / "p"), "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --workers must be a whole number of processes >= 1") and err.count("\n") == 1
    assert not (tmp_path / "p").exists()


_LIMITED = r"""
import sys, tempfile
from pathlib import Path
from dpcore.read.importer.write_run import import_traces
from dpcore.read.ranks import Scale
warm, many, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
import_traces(warm, tempfile.mkdtemp(), "w", scale=Scale(workers=1, cache=False))  # libraries loaded, warm
if mode == "events":  # the old import's first step: every rank's events in one frame, in this process
    import dpcore.read.traces.workers as workers  # (a worker pool's threads would abort, not raise)
    workers.PARALLEL_MIN_BYTES = 1 << 62
    from tests.trace_helpers import read_trace_dir
    read_trace_dir(warm)
from tests.memlimit import limit_address_space
limit_address_space(int(sys.argv[4]))
try:
    if mode == "events":
        print(len(read_trace_dir(many)))
    else:
        print(import_traces(many, tempfile.mkdtemp(), "m", scale=Scale(workers=1, cache=False)).steps)
except MemoryError:
    print("MemoryError")
"""


def test_256_ranks_import_under_a_memory_limit(tmp_path: Path) -> None:
    """256 ranks imported under an address-space limit of 68 MiB above the warm process: one
    rank's events at a time plus every rank's compact rows fit; all ranks' events in one frame
    (what the import read before, kept as the control that the limit binds) do not. Measured
    here: the import needs 50-55 MiB (most of it the 45k collectives.csv rows it writes), the
    events 80-85 MiB, and the import before this change more than 120 MiB."""
    warm, many = tmp_path / "warm", tmp_path / "many"
    write_gpu_trace_dir(warm, world_size=2, steps=3, kernels_per_step=300, seed=1)
    write_gpu_trace_dir(many, world_size=256, steps=3, kernels_per_step=300, seed=1)

    def run(mode: str) -> str:
        return run_capped(_LIMITED, [str(warm), str(many), mode, "68"], ROOT)
    assert run("import") == "1024"  # 256 ranks x 4 steps
    control = run("events")  # MemoryError, or a native abort under the cap (memlimit.run_capped)
    assert did_not_fit(control), control


def test_a_local_dask_cluster_imports_the_same_run(sets: dict[str, Path], tmp_path: Path) -> None:
    from dpcore.read.importer.write_run import import_traces
    from dpcore.read.ranks import Scale
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        remote = import_traces(sets["gloo"], tmp_path / "dask", "p",
                               scale=Scale(scheduler=cluster.scheduler_address, cache=False))
    local = import_traces(sets["gloo"], tmp_path / "local", "p", scale=Scale(workers=1, cache=False))
    assert _written(remote.run_dir) == _written(local.run_dir)


def test_scheduler_without_dask_is_one_line(sets: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from dpcore.cli import main
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    assert main(["import", str(sets["gloo"]), "--out", str(tmp_path / "p"), "--no-cache",
                 "--scheduler", "tcp://127.0.0.1:8786"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --scheduler needs Dask distributed: pip install") and err.count("\n") == 1
    assert not (tmp_path / "p").exists()
