"""A run always ends with run.json saying how (issue 25, item 7): a second Ctrl-C while it is
being closed, and a full disk, never leave it ``running``, and a full disk leaves no temporary
file behind. The writer and the life cycle are the real ones; only the moments are forced."""
from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import pytest

from dpcore.write.capture import run_writer
from dpcore.write.capture.run_lifecycle import RunLife
from dpcore.write.capture.run_writer import RunWriter
from dpcore.write.capture.tracing import TraceCapture


class _LocalWorld:
    writes = True

    def broadcast(self, box: list) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


def _writer(tmp_path: Path) -> RunWriter:
    w = RunWriter(tmp_path, run_id="r", command=["test"], config={}, environment={})
    w.add_job({"id": "flat-ws2", "status": "running"})
    w.add_job({"id": "flat-ws4", "status": "pending"})
    return w


def _meta(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "r" / "run.json").read_text())


def test_a_second_ctrl_c_while_closing_still_ends_the_run_interrupted(tmp_path: Path, monkeypatch) -> None:
    """The second SIGINT is sent from inside the writer's close, the moment it landed in when
    the run stayed ``running``; it is held until run.json is final, then delivered."""
    # Python's own Ctrl-C handler, as in a user's process: the suite's other tests run commands
    # in this process, and one that leaves its handler installed must not decide this test.
    # (tests/conftest.py puts the suite's handlers back after each test)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    writer = _writer(tmp_path)
    real_finish = writer.finish

    def finish_hit_by_ctrl_c(status: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler at the next bytecode
        real_finish(status)
    monkeypatch.setattr(writer, "finish", finish_hit_by_ctrl_c)
    with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C is not lost, only held
        with RunLife(_LocalWorld(), lambda: writer):
            raise KeyboardInterrupt  # the first Ctrl-C, while a job runs
    meta = _meta(tmp_path)
    assert meta["status"] == "interrupted" and meta["finished"]
    assert [j["status"] for j in meta["jobs"]] == ["interrupted", "interrupted"]


def test_a_full_disk_still_ends_the_run_and_leaves_no_temp_file(tmp_path: Path, monkeypatch) -> None:
    writer = _writer(tmp_path)

    def full(path, data):  # what the atomic write meets on a full disk: no space for its temp file
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(run_writer, "atomic_write_text", full)
    with pytest.raises(OSError, match="No space left on device"):  # reported, exit 1 in the CLI
        with RunLife(_LocalWorld(), lambda: writer):
            writer.append_rows("steps", [{"job_id": "flat-ws2", "rank": 0, "step": 0}])
    meta = _meta(tmp_path)
    assert meta["status"] == "failed" and meta["finished"]
    assert [j["status"] for j in meta["jobs"]] == ["failed", "failed"]
    disk = "(OSError: [Errno 28] No space left on device)"
    assert [j["error"] for j in meta["jobs"]] == [f"the run ended while this job ran {disk}",
                                                 f"never started: the run ended before it {disk}"]
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["run.json"]


def test_a_trace_export_on_a_full_disk_leaves_no_temp_file(tmp_path: Path) -> None:
    cap = TraceCapture(tmp_path, 0, "flat-ws2", 0, first=1, last=2, warmup_step=0)

    class FullDisk:
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_bytes(b"\x1f\x8b half a trace")  # written until the disk filled
            raise RuntimeError("Failed to write trace: No space left on device")
    cap._export(FullDisk())
    assert cap.trace_file is None and "No space left on device" in cap.error
    assert list(tmp_path.iterdir()) == []
