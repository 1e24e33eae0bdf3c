"""Reading ranks in worker processes, on a Dask cluster, and under a memory limit: the same
tables whichever way, and a peak memory that does not grow with the number of ranks."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.read.ranks import Scale
from dpcore.read.report.analyze import analyze
from dpcore.read.tables import folder_tables
from dpcore.read.traces import workers
from tests.memlimit import did_not_fit, run_capped
from tests.synthetic import write_gpu_trace_dir

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("w") / "job"
    write_gpu_trace_dir(d, world_size=6, steps=3, kernels_per_step=40, seed=5)
    return d


def _same(a: list, b: list) -> None:
    assert [(t.rank, t.events, t.notes) for t in a] == [(t.rank, t.events, t.notes) for t in b]
    for x, y in zip(a, b):
        pd.testing.assert_frame_equal(x.overlap, y.overlap)
        pd.testing.assert_frame_equal(x.comm, y.comm)


def test_one_and_several_workers_give_the_same_tables(traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pools = []
    real = workers.worker_pool

    def counting(n: int):  # the pool really runs (fork is available to a single-threaded pytest)
        pools.append(n)
        return real(n)
    monkeypatch.setattr(workers, "worker_pool", counting)
    if not workers.can_fork():
        pytest.skip("no fork here (threads running): the pool path is not taken")
    one = folder_tables(traces, Scale(workers=1, cache=False))
    assert pools == []
    three = folder_tables(traces, Scale(workers=3, cache=False))
    assert pools == [3]
    _same(one, three)
    assert analyze(str(traces), csv=True, scale=Scale(workers=3, cache=False)) == \
        analyze(str(traces), csv=True, scale=Scale(workers=1, cache=False))


def test_bad_workers_is_one_line_exit_2(traces: Path, capsys: pytest.CaptureFixture) -> None:
    for bad in ("0", "two", "-1"):
        assert main(["analyze", str(traces), "--workers", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --workers must be a whole number of processes >= 1") and err.count("\n") == 1


def test_scheduler_without_dask_is_one_line(traces: Path, capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    assert main(["analyze", str(traces), "--no-cache", "--scheduler", "tcp://127.0.0.1:8786"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --scheduler needs Dask distributed: pip install") and err.count("\n") == 1


def test_a_local_dask_cluster_gives_the_same_tables(traces: Path) -> None:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        remote = folder_tables(traces, Scale(scheduler=cluster.scheduler_address, cache=False))
        text = analyze(str(traces), csv=True, scale=Scale(scheduler=cluster.scheduler_address, cache=False))
    _same(remote, folder_tables(traces, Scale(workers=1, cache=False)))
    assert text == analyze(str(traces), csv=True, scale=Scale(workers=1, cache=False))


_LIMITED = r"""
import sys
from pathlib import Path
from dpcore.read.ranks import Scale
from dpcore.read.tables import folder_tables
from dpcore.read.report.analyze import analyze
warm, many, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
analyze(str(warm), csv=True, scale=Scale(workers=1, cache=False))  # every library loaded and warmed up
if mode == "events":  # the old way: every rank's events in one frame, read in this process (a
    import dpcore.read.traces.workers as workers  # worker pool's threads would abort, not raise, at the limit)
    workers.PARALLEL_MIN_BYTES = 1 << 62
    from tests.trace_helpers import read_trace_dir
    read_trace_dir(warm)
from tests.memlimit import limit_address_space
limit_address_space(int(sys.argv[4]))
try:
    if mode == "events":
        print(len(read_trace_dir(many)))
    else:
        print(len(folder_tables(many, Scale(workers=1, cache=False))))
except MemoryError:
    print("MemoryError")
"""


def test_256_ranks_read_under_a_memory_limit(tmp_path: Path) -> None:
    """256 ranks read under an address-space limit of 45 MiB above the warm process: one rank
    at a time plus every rank's compact tables fit; all ranks' events in one frame (the old way,
    read serially in this process, kept here as the control that the limit binds) do not.
    Measured here: the tables fit in 30 MiB, the events need between 70 and 100 MiB (and
    160-320 MiB with the reader's worker pool); the limit sits between, 1.5x from both."""
    warm, many = tmp_path / "warm", tmp_path / "many"
    write_gpu_trace_dir(warm, world_size=2, steps=3, kernels_per_step=300, seed=1)
    write_gpu_trace_dir(many, world_size=256, steps=3, kernels_per_step=300, seed=1)
    code = textwrap.dedent(_LIMITED)

    def run(mode: str) -> str:
        return run_capped(code, [str(warm), str(many), mode, "45"], ROOT)
    assert run("tables") == "256"
    control = run("events")  # MemoryError, or a native abort under the cap (memlimit.run_capped)
    assert did_not_fit(control), control
