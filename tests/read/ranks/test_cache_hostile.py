"""The cache against a hostile or careless folder: a ``cache`` symlink is never written
through, a trace rewritten with its size and mtime kept is read again, an entry whose notes
nest without end is a miss, and a relative ``DPCORE_CACHE_DIR`` is refused in one line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dpcore.read.ranks import Scale, cache
from dpcore.read.report.summarize import summarize
from dpcore.read.tables import folder_tables
from tests.fixtures_run import make_run
from tests.synthetic import write_gpu_trace_dir

ROOT = Path(__file__).resolve().parents[3]


def test_a_symlinked_cache_is_not_written_through(tmp_path: Path, reads: list[str]) -> None:
    run = make_run(tmp_path / "profiles")
    target = tmp_path / "unrelated"
    target.mkdir()
    (target / "overlap.parquet").write_bytes(b"someone else's file")
    (run / "cache").symlink_to(target)
    out = summarize(str(run), scale=Scale(workers=1))
    assert sorted(p.name for p in target.iterdir()) == ["overlap.parquet"]
    assert (target / "overlap.parquet").read_bytes() == b"someone else's file"
    assert cache.cache_dir(run) == cache.user_cache_dir(run)
    assert (cache.user_cache_dir(run) / "ranks.parquet").is_file()
    reads.clear()
    assert summarize(str(run), scale=Scale(workers=1)) == out and reads == []


def test_a_runs_own_cache_stays_beside_it(tmp_path: Path, reads: list[str]) -> None:
    run = make_run(tmp_path / "profiles")
    summarize(str(run), scale=Scale(workers=1))
    assert cache.cache_dir(run) == run / "cache" and (run / "cache" / "ranks.parquet").is_file()


def test_a_trace_rewritten_with_size_and_mtime_kept_is_read_again(tmp_path: Path,
                                                                   reads: list[str]) -> None:
    traces = tmp_path / "job"
    write_gpu_trace_dir(traces, world_size=2, steps=2, kernels_per_step=10, seed=1)
    folder_tables(traces, Scale(workers=1))
    reads.clear()
    folder_tables(traces, Scale(workers=1))
    assert reads == []
    f = traces / "rank1.json.gz"
    st = f.stat()
    data = f.read_bytes()
    f.write_bytes(data)  # same bytes here; a doctored trace of the same size alike
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    folder_tables(traces, Scale(workers=1))
    assert reads == ["rank1.json.gz"]


def test_notes_nested_without_end_are_a_miss(tmp_path: Path, reads: list[str]) -> None:
    traces = tmp_path / "job"
    write_gpu_trace_dir(traces, world_size=2, steps=2, kernels_per_step=10, seed=1)
    first = folder_tables(traces, Scale(workers=1))
    f = cache.cache_dir(traces) / "ranks.parquet"
    t = pq.read_table(f)
    deep = "[" * 200_000 + "]" * 200_000
    t = t.set_column(t.schema.get_field_index("notes"), "notes", pa.array([deep] * t.num_rows))
    pq.write_table(t, f)
    reads.clear()
    again = folder_tables(traces, Scale(workers=1))
    assert sorted(reads) == ["rank0.json.gz", "rank1.json.gz"]
    assert [a.notes for a in again] == [a.notes for a in first]


def test_a_relative_cache_dir_is_refused_in_one_line(tmp_path: Path) -> None:
    traces = tmp_path / "job"
    write_gpu_trace_dir(traces, world_size=2, steps=2, kernels_per_step=10, seed=1)
    env = {**os.environ, "DPCORE_CACHE_DIR": "relcache", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "dpcore", "analyze", str(traces)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: DPCORE_CACHE_DIR must be an absolute path, got 'relcache'; give one such as "
        "$HOME/.cache/dpcore, or unset it"]
    assert not (tmp_path / "relcache").exists()


def test_a_doctored_parquet_is_a_miss_not_a_number(tmp_path: Path, reads: list[str]) -> None:
    """The entry keys (schema metadata) kept and one column's values changed: without the
    signature the doctored numbers were loaded as the trace's."""
    from dpcore.read.report.analyze import analyze
    traces = tmp_path / "job"
    write_gpu_trace_dir(traces, world_size=2, steps=2, kernels_per_step=10, seed=1)
    truth = analyze(str(traces), csv=True, scale=Scale(workers=1))
    f = cache.cache_dir(traces) / "overlap.parquet"
    t = pq.read_table(f)
    col = next(n for n in t.column_names if t.schema.field(n).type == pa.float64())
    doctored = t.set_column(t.schema.get_field_index(col), col,
                            pa.array([v * 10 + 7 for v in t.column(col).to_pylist()], pa.float64()))
    pq.write_table(doctored.replace_schema_metadata(t.schema.metadata), f)
    reads.clear()
    assert analyze(str(traces), csv=True, scale=Scale(workers=1)) == truth
    assert sorted(reads) == ["rank0.json.gz", "rank1.json.gz"]
