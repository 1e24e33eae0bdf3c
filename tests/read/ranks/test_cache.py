"""The per-rank cache (dpcore.read.ranks): a hit reads no trace, a changed trace or a newer
reduction misses, the cache never changes a number (every command's output is compared with and
without it, and with the event-based path it replaced), and an unwritable folder caches in the
user's cache directory."""
from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from dpcore.read.analysis.comm_overlap import OVERLAP_TABLE
from dpcore.read.analysis.gpu_kernels import KERNELS_TABLE
from dpcore.read.analysis.gpu_time import GPU_CAUSES_TABLE, GPU_TABLE
from dpcore.read.analysis.lanes import LANE_EVENTS_TABLE
from dpcore.read.analysis.trace_arrivals import COMM_TABLE
from dpcore.read.importer.rows import IMPORT_COMM, IMPORT_FACTS, IMPORT_STEPS, IMPORT_TABLES
from dpcore.read.ranks import Scale, cache
from dpcore.read.report.analyze import analyze
from dpcore.read.report.stragglers import stragglers_text
from dpcore.read.report.summarize import summarize
from dpcore.read.rundir import load_run
from dpcore.read.tables import EAGER, GPU_TABLES, folder_tables, run_trace_steps
from tests.events_path import trace_step_metrics, traced_job_events
from tests.fixtures_run import make_run
from tests.synthetic import write_gpu_trace_dir

DATA = Path(__file__).resolve().parents[2] / "data"
#: The cache's files after a read that needs no lazy table: ranks.parquet and one per eager table.
FILES = sorted(f"{t}.parquet{mac}" for t in ("ranks", *(t.name for t in EAGER)) for mac in ("", ".mac"))


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    write_gpu_trace_dir(d, world_size=4, steps=3, kernels_per_step=40, seed=3)
    return d


def test_miss_then_hit_then_invalidation(traces: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    one = Scale(workers=1)
    first = folder_tables(traces, one)
    assert sorted(reads) == [f"rank{r}.json.gz" for r in range(4)]
    assert sorted(p.name for p in cache.cache_dir(traces).iterdir()) == FILES
    reads.clear()
    second = folder_tables(traces, one)
    assert reads == []  # a hit reads no trace
    for a, b in zip(first, second):
        assert (a.rank, a.world_size, a.events, a.notes) == (b.rank, b.world_size, b.events, b.notes)
        pd.testing.assert_frame_equal(a.overlap, b.overlap)
        pd.testing.assert_frame_equal(a.comm, b.comm)
        assert len(a.comm) and b.built == ("overlap", "comm")
    # a rewritten trace (new mtime) misses, the others still hit
    st = (traces / "rank2.json.gz").stat()
    os.utime(traces / "rank2.json.gz", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    folder_tables(traces, one)
    assert reads == ["rank2.json.gz"]
    reads.clear()
    folder_tables(traces, one)
    assert reads == []
    # a trace replaced by another rank's content (another size): its tables follow the new content
    shutil.copy(traces / "rank3.json.gz", traces / "rank9.json.gz")
    os.remove(traces / "rank3.json.gz")
    got = folder_tables(traces, one)
    assert reads == ["rank9.json.gz"] and [t.rank for t in got] == [0, 1, 2, 3]
    reads.clear()
    # a newer reader invalidates everything
    monkeypatch.setattr(cache, "CACHE_VERSION", cache.CACHE_VERSION + 1)
    folder_tables(traces, one)
    assert sorted(reads) == ["rank0.json.gz", "rank1.json.gz", "rank2.json.gz", "rank9.json.gz"]


def test_a_tables_version_misses_only_that_table(traces: Path, reads: list[str]) -> None:
    """A declaration whose reduction changed (its version bumped) misses its own table's
    entries; the other tables' entries still hit."""
    one = Scale(workers=1)
    folder_tables(traces, one, need=(LANE_EVENTS_TABLE,))
    reads.clear()
    lanes2 = dataclasses.replace(LANE_EVENTS_TABLE, version=LANE_EVENTS_TABLE.version + 1)
    got = folder_tables(traces, one, need=(lanes2,))
    assert sorted(reads) == [f"rank{r}.json.gz" for r in range(4)] and all(len(t.lane_events) for t in got)
    reads.clear()
    folder_tables(traces, one, need=(OVERLAP_TABLE, COMM_TABLE))  # stored with the old key, kept
    folder_tables(traces, one, need=(lanes2,))  # stored with the new key
    assert reads == []
    folder_tables(traces, one, need=(LANE_EVENTS_TABLE,))  # the old version's entries were replaced
    assert sorted(reads) == [f"rank{r}.json.gz" for r in range(4)]


def test_lazy_tables_are_built_when_asked_and_kept(traces: Path, reads: list[str]) -> None:
    """A read that needs only the eager tables builds no lane or import rows (they cost a first
    read 15-25 % each); the first read that needs them reads the traces once more and adds
    them, keeping the eager entries; from then on both kinds hit."""
    one = Scale(workers=1)
    first = folder_tables(traces, one, need=(OVERLAP_TABLE,))
    assert all(t.built == ("overlap", "comm") and t[LANE_EVENTS_TABLE].empty and t[IMPORT_STEPS].empty for t in first)
    assert sorted(p.name for p in cache.cache_dir(traces).iterdir()) == FILES
    reads.clear()
    lanes = folder_tables(traces, one, need=(LANE_EVENTS_TABLE,))
    assert sorted(reads) == [f"rank{r}.json.gz" for r in range(4)]  # the lanes were not there
    assert all(len(t.lane_events) and t[IMPORT_STEPS].empty and "import_steps" not in t.built for t in lanes)
    assert "lane_events.parquet" in {p.name for p in cache.cache_dir(traces).iterdir()}
    reads.clear()
    again = folder_tables(traces, one, need=(OVERLAP_TABLE, COMM_TABLE, LANE_EVENTS_TABLE))
    assert reads == []  # overlap, comm and lanes all hit now
    for a, b in zip(first, again):
        pd.testing.assert_frame_equal(a.overlap, b.overlap)
    for a, b in zip(lanes, again):
        pd.testing.assert_frame_equal(a.lane_events, b.lane_events)
    imp = folder_tables(traces, one, need=IMPORT_TABLES)
    assert sorted(reads) == [f"rank{r}.json.gz" for r in range(4)]
    assert all({"import_steps", "import_comm", "import_facts"} <= set(t.built) and len(t.import_facts) == 1
               and "gpu" not in t.built and "lane_events" not in t.built for t in imp)
    reads.clear()
    folder_tables(traces, one, need=(LANE_EVENTS_TABLE, IMPORT_STEPS, IMPORT_COMM, COMM_TABLE))
    assert reads == []
    gpu = folder_tables(traces, one, need=GPU_TABLES)
    assert sorted(reads) == [f"rank{r}.json.gz" for r in range(4)]
    assert all({"gpu", "gpu_causes", "gpu_kernels"} <= set(t.built) and len(t.gpu) and len(t.gpu_causes)
               and len(t.gpu_kernels) for t in gpu)
    reads.clear()
    again = folder_tables(traces, one,
                          need=(GPU_CAUSES_TABLE, GPU_TABLE, KERNELS_TABLE, LANE_EVENTS_TABLE, IMPORT_FACTS))
    assert reads == []
    for a, b in zip(gpu, again):
        pd.testing.assert_frame_equal(a.gpu, b.gpu)
        pd.testing.assert_frame_equal(a.gpu_causes, b.gpu_causes)
        pd.testing.assert_frame_equal(a.gpu_kernels, b.gpu_kernels)


def test_a_broken_cache_file_is_a_miss(traces: Path, reads: list[str]) -> None:
    folder_tables(traces, Scale(workers=1))
    (cache.cache_dir(traces) / "overlap.parquet").write_bytes(b"not parquet")
    reads.clear()
    a = analyze(str(traces), csv=True, scale=Scale(workers=1))
    assert len(reads) == 4
    assert a == analyze(str(traces), csv=True, scale=Scale(cache=False))


def test_a_traces_folder_gets_no_cache_files(traces: Path, tmp_path: Path, reads: list[str]) -> None:
    """A folder of someone's traces (not a dpcore run) is read, never written: its cache lives
    in the user's cache directory, writable or not."""
    out = analyze(str(traces), csv=True, scale=Scale(workers=1))
    assert sorted(p.name for p in traces.iterdir()) == [f"rank{r}.json.gz" for r in range(4)]
    assert cache.user_cache_dir(traces).is_relative_to(tmp_path / "xdg" / "dpcore")
    assert sorted(p.name for p in cache.user_cache_dir(traces).iterdir()) == FILES
    reads.clear()
    assert analyze(str(traces), csv=True, scale=Scale(workers=1)) == out and reads == []


def _answer(command, *args, **kwargs) -> str:
    """What a command prints, or the one line it fails with."""
    try:
        return command(*args, **kwargs)
    except ValueError as exc:
        return f"error: {exc}"


def test_commands_print_the_same_with_and_without_the_cache(traces: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPCORE_CACHE_DIR", str(tmp_path / "c"))  # tests/data's folder stays as it is
    run = make_run(tmp_path / "profiles")
    off, on = Scale(cache=False), Scale(workers=1)
    for path in (traces, run, DATA / "ddp_gloo_delay_rank1"):
        for csv in (True, False):
            want = analyze(str(path), csv=csv, scale=off)
            assert analyze(str(path), csv=csv, scale=on) == want  # the miss
            assert analyze(str(path), csv=csv, scale=on) == want  # the hit
    for path in (traces, run, DATA / "ddp_gloo_delay_rank1"):  # the synthetic ranks' counts differ: an error
        want = _answer(stragglers_text, str(path), scale=off)
        assert want.startswith("error: ") == (path == traces), want
        assert _answer(stragglers_text, str(path), scale=on) == want
        assert _answer(stragglers_text, str(path), scale=on) == want
    want = summarize(str(run), csv=True, scale=off)
    assert summarize(str(run), csv=True, scale=on) == want == summarize(str(run), csv=True, scale=on)
    shutil.rmtree(tmp_path / "c")  # deleting it changes no number
    assert summarize(str(run), csv=True) == want


def test_cache_dir_env_keeps_the_folder_untouched(traces: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPCORE_CACHE_DIR", str(tmp_path / "elsewhere"))
    analyze(str(traces), csv=True, scale=Scale(workers=1))
    assert not (traces / "cache").exists()
    assert len(list((tmp_path / "elsewhere").rglob("*.parquet"))) == len([f for f in FILES if f.endswith("t")])


def test_the_tables_give_the_rows_of_the_event_based_path(tmp_path: Path) -> None:
    """run_trace_steps (rank by rank, through the cache) == trace_step_metrics over all ranks'
    events at once (what every command computed before the cache), row for row."""
    run = load_run(make_run(tmp_path / "profiles"))
    want = trace_step_metrics(traced_job_events(run))
    assert len(want) > 0
    pd.testing.assert_frame_equal(run_trace_steps(run, Scale(cache=False)), want)
    pd.testing.assert_frame_equal(run_trace_steps(run), want)
    pd.testing.assert_frame_equal(run_trace_steps(run), want)
