"""The cache against files someone planted where it lives: a link at a temporary name, a key or
a folder another user owns, a table file that is a link to /dev/zero, a sparse giant or a FIFO,
and a link in place of a cache folder. Each is a miss (the traces are read again and every
number stays the trace's), never written through, never a hang or a MemoryError.

Each test here failed on the cache before it opened files exclusively and without following
links (the victim file was overwritten, the doctored number shown, the child ran out of memory
or hung)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpcore.read.ranks import Scale, cache
from dpcore.read.report.analyze import analyze
from dpcore.read.report.summarize import summarize
from tests.fixtures_run import make_run
from tests.synthetic import write_gpu_trace_dir

ROOT = Path(__file__).resolve().parents[3]
OTHER_UID = 54321  # a user that is not this one (the tests that chown need root)
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="planting another user's file needs root (chown)")


def _traces(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    write_gpu_trace_dir(d, world_size=2, steps=2, kernels_per_step=10, seed=1)
    return d


def test_a_link_planted_at_a_temporary_name_is_not_written_through(tmp_path: Path, reads: list[str]) -> None:
    run = make_run(tmp_path / "profiles")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    (run / "cache").mkdir(mode=0o700)
    names = ["ranks", "overlap", "comm", "lanes"]
    for n in names:  # the names the cache used to write to: its pid, no randomness
        for tmp in (f".{n}.parquet.{os.getpid()}.tmp", f".{n}.parquet.mac.{os.getpid()}.tmp"):
            (run / "cache" / tmp).symlink_to(victim)
    out = summarize(str(run), scale=Scale(workers=1))
    assert victim.read_bytes() == b"precious"
    assert (run / "cache" / "ranks.parquet").is_file() and not (run / "cache" / "ranks.parquet").is_symlink()
    reads.clear()
    assert summarize(str(run), scale=Scale(workers=1)) == out and reads == []  # the cache still works


def _doctor(f: Path, key: bytes) -> None:
    """Multiply a float column of a table file and sign it with ``key`` (what a user who
    knows the key can do)."""
    t = pq.read_table(f)
    col = next(n for n in t.column_names if t.schema.field(n).type == pa.float64())
    doctored = t.set_column(t.schema.get_field_index(col), col,
                            pa.array([v * 10 + 7 for v in t.column(col).to_pylist()], pa.float64()))
    pq.write_table(doctored.replace_schema_metadata(t.schema.metadata), f)
    f.with_name(f.name + ".mac").write_bytes(cache._mac(key, f.read_bytes()))


@needs_root
def test_a_key_planted_in_a_shared_cache_by_another_user_is_not_trusted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: list[str]) -> None:
    traces = _traces(tmp_path)
    planted = b"k" * 32
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "key").write_bytes(planted)
    os.chmod(shared / "key", 0o644)
    os.chown(shared / "key", OTHER_UID, OTHER_UID)
    os.chmod(shared, 0o1777)
    os.chown(shared, OTHER_UID, OTHER_UID)
    # the other user builds a cache entry for these traces with that key, doctors it and puts
    # it where this user's read looks
    mine = tmp_path / "theirs"
    mine.mkdir(mode=0o700)
    (mine / "key").write_bytes(planted)
    os.chmod(mine / "key", 0o600)
    monkeypatch.setenv("DPCORE_CACHE_DIR", str(mine))
    truth = analyze(str(traces), csv=True, scale=Scale(workers=1))
    theirs = cache.cache_dir(traces)
    _doctor(theirs / "overlap.parquet", planted)
    monkeypatch.setenv("DPCORE_CACHE_DIR", str(shared))
    target = cache.cache_dir(traces)
    theirs.rename(target)
    for p in (target, *target.iterdir()):
        os.chown(p, OTHER_UID, OTHER_UID)
    reads.clear()
    assert analyze(str(traces), csv=True, scale=Scale(workers=1)) == truth
    assert sorted(reads) == ["rank0.json.gz", "rank1.json.gz"]
    assert (shared / "key").read_bytes() == planted  # someone else's folder: left as it is


def test_a_loose_key_of_ones_own_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               reads: list[str]) -> None:
    traces = _traces(tmp_path)
    base = tmp_path / "mine"
    base.mkdir(mode=0o755)
    (base / "key").write_bytes(b"k" * 32)
    os.chmod(base / "key", 0o644)  # readable by all: anyone could have signed with it
    monkeypatch.setenv("DPCORE_CACHE_DIR", str(base))
    analyze(str(traces), csv=True, scale=Scale(workers=1))
    key = base / "key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_bytes() != b"k" * 32
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    assert stat.S_IMODE(cache.cache_dir(traces).stat().st_mode) == 0o700
    reads.clear()
    analyze(str(traces), csv=True, scale=Scale(workers=1))
    assert reads == []


def test_a_link_planted_as_the_cache_folder_is_not_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: list[str]) -> None:
    traces = _traces(tmp_path)
    base = tmp_path / "cachebase"
    base.mkdir(mode=0o700)
    monkeypatch.setenv("DPCORE_CACHE_DIR", str(base))
    victim = tmp_path / "victim"
    victim.mkdir()
    cache.cache_dir(traces).symlink_to(victim)
    truth = analyze(str(traces), csv=True, scale=Scale(workers=1), )
    assert list(victim.iterdir()) == []
    reads.clear()
    assert analyze(str(traces), csv=True, scale=Scale(workers=1)) == truth
    assert sorted(reads) == ["rank0.json.gz", "rank1.json.gz"]


_CHILD = """
import sys
sys.path.insert(0, {root!r})
from tests.memlimit import limit_address_space
limit_address_space(1024)
from dpcore.read.ranks import Scale
from dpcore.read.report.analyze import analyze
sys.stdout.write(analyze({traces!r}, csv=True, scale=Scale(workers=1)))
"""


def _plant(kind: str, f: Path) -> None:
    if f.exists() or f.is_symlink():
        f.unlink()
    if kind == "zero-link":
        f.symlink_to("/dev/zero")
    elif kind == "sparse":
        with open(f, "wb") as out:
            out.truncate(100 << 30)  # 100 GiB that take no disk
    else:
        os.mkfifo(f)


@pytest.mark.slow
@pytest.mark.parametrize("kind, which", [("zero-link", "ranks.parquet"), ("sparse", "overlap.parquet"),
                                         ("fifo", "ranks.parquet"), ("fifo", "ranks.parquet.mac"),
                                         ("fifo", "key")])
def test_a_cache_file_that_is_a_device_a_giant_or_a_fifo_is_a_miss(tmp_path: Path, kind: str,
                                                                     which: str) -> None:
    """In a child whose address space is capped (1 GiB more than at its start) and with a time
    limit: the old cache read /dev/zero until MemoryError, allocated the sparse file's 100 GiB,
    and waited on the FIFO for ever."""
    traces = _traces(tmp_path)
    base = tmp_path / "cachebase"
    base.mkdir(mode=0o700)
    env = {**os.environ, "DPCORE_CACHE_DIR": str(base)}
    child = [sys.executable, "-c", _CHILD.format(root=str(ROOT), traces=str(traces))]
    first = subprocess.run(child, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    folder = base / cache._folder_id(traces)
    assert (folder / "ranks.parquet").is_file()
    _plant(kind, base / which if which == "key" else folder / which)
    try:
        again = subprocess.run(child, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a {kind} planted as {which} made the read hang")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout == first.stdout and again.stderr == first.stderr
