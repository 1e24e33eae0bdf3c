"""Hostile trace files are refused in one line, after bounded work (issue 25 item 1).

A sparse 2 GiB ``rank0.json.gz`` (no disk used) or a few MB of gzip that inflate 1000:1 once kept
every reader busy for minutes and took 7 GB. Every fixture here is made by the test: sparse
files cost no disk, the bombs are compressed as they are generated. No assertion is on time:
the subprocess timeouts only turn a regression (minutes) into a failure instead of a hang.
"""
from __future__ import annotations

import gzip
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from dpcore.contract import runformat as rf
from dpcore.contract import tracefile as tf
from dpcore.read.traces import limits
from dpcore.read.traces.reader import read_trace
from tests.fixtures_run import make_run

pytestmark = pytest.mark.usefixtures("scan_path")  # each test: a cache of its own

ROOT = Path(__file__).resolve().parents[3]
EVENT = b'{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 5, "dur": 3},'


def sparse(path: Path, size: int = 2 << 30, head: bytes = b'{"traceEvents":[') -> Path:
    """``head`` then zeros up to ``size`` bytes, as a hole: no disk is used."""
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


def bomb(path: Path, unit: bytes, inflated: int) -> Path:
    """A gzip file whose content is a trace header then ``unit`` repeated to ``inflated`` bytes,
    compressed as it is generated (1 MiB at a time: nothing large is held)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = unit * ((1 << 20) // len(unit))
    with open(path, "wb") as fh:
        fh.write(z.compress(b'{"traceEvents":['))
        for _ in range(inflated // len(block)):
            fh.write(z.compress(block))
        fh.write(z.compress(b'{}]}') + z.flush())
    return path


def test_sparse_2gib_trace_is_refused_after_reading_a_few_mib(tmp_path):
    f = sparse(tmp_path / "rank0.json.gz")
    assert f.stat().st_blocks * 512 < 1 << 20  # a hole, not 2 GiB of disk
    with pytest.raises(tf.TraceFormatError, match=r"no complete event in \d+ MiB .*not read: .*rank0.json.gz"):
        read_trace(f)


def test_gzip_bomb_of_zeros_is_refused(tmp_path):
    f = bomb(tmp_path / "rank0.json.gz", b"\0" * 4096, 256 << 20)
    assert f.stat().st_size < 1 << 20
    with pytest.raises(tf.TraceFormatError, match="rank0.json.gz"):
        read_trace(f)


def test_gzip_bomb_of_valid_events_is_refused_by_its_ratio(tmp_path):
    """Every entry is a real event, so only the inflation ratio gives it away (torch traces
    compress ~14:1, this one ~1000:1): refused once GZIP_RATIO_FLOOR bytes are out."""
    f = bomb(tmp_path / "rank0.json.gz", EVENT, 256 << 20)
    with pytest.raises(tf.TraceFormatError, match=r"inflates more than 200:1 .*a gzip bomb"):
        read_trace(f)


def test_a_real_trace_is_within_every_bound(samples):
    """The committed sample traces compress 9:1 to 15:1 and read as before."""
    f = samples / "sample-train" / "traces" / "flat-ws2" / "rank0.json.gz"
    inflated = len(gzip.decompress(f.read_bytes()))
    assert inflated / f.stat().st_size < tf.MAX_GZIP_RATIO / 10
    assert len(read_trace(f)) > 1000


def test_event_count_and_time_and_full_parse_are_bounded(tmp_path, monkeypatch):
    f = tmp_path / "rank0.json"
    f.write_bytes(b'{"traceEvents":[' + EVENT * 5000 + b'{}]}')
    monkeypatch.setattr(limits, "MAX_TRACE_EVENTS", 1000)
    with pytest.raises(tf.TraceFormatError, match="more than 1,000 events"):
        read_trace(f)
    monkeypatch.setattr(limits, "MAX_TRACE_EVENTS", 10_000)
    monkeypatch.setattr(limits, "MAX_READ_SECONDS", 0.0)
    with pytest.raises(tf.TraceFormatError, match="took more than 0 s"):
        read_trace(f)
    monkeypatch.setattr(limits, "MAX_READ_SECONDS", 60.0)
    spaced = tmp_path / "spaced.json"  # a duplicate key is the full parse's case: its size is capped
    dup = EVENT[:-2].replace(b"{", b'{"ph": "i", ', 1) + b"}"
    spaced.write_bytes(b'{"traceEvents": [' + b",".join([dup] * 100) + b"]}")
    monkeypatch.setattr(limits, "MAX_PARSE_BYTES", 1000)
    with pytest.raises(tf.TraceFormatError, match="larger than 1000 bytes"):
        read_trace(spaced)
    monkeypatch.setattr(limits, "MAX_PARSE_BYTES", 1 << 20)
    assert len(read_trace(spaced)) == 100


def test_oversized_file_on_disk_is_refused_before_reading(tmp_path):
    f = sparse(tmp_path / "rank0.json", tf.MAX_TRACE_FILE_BYTES + 1)
    with pytest.raises(tf.TraceFormatError, match="larger than"):
        read_trace(f)


@pytest.mark.parametrize("command", ["summarize", "analyze", "whatif"])
def test_a_run_with_a_hostile_trace_is_read_with_one_warning(tmp_path, command):
    """The CLI on a run whose rank trace is a sparse 2 GiB file: exit 0, the job's numbers from
    its recorded intervals, one warning naming the file (before: > 150 s and 7 GB)."""
    run = make_run(tmp_path, "20250101-000000-hostile", steps=3, profiled=1)
    target = sparse(rf.trace_dir(run, "ring-ws2") / rf.rank_trace_name(1))
    args = [command, str(run)] + (["--job", "bucketed-ws2-b25"] if command == "whatif" else [])
    out = subprocess.run([sys.executable, "-m", "dpcore", *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)  # a hang guard, not a measurement
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if str(target) in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: job ring-ws2:"), out.stderr
    assert "Traceback" not in out.stderr
