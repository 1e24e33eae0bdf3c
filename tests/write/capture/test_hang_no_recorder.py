"""A hang on a torch without a flight-recorder dump (torch 2.4, the floor): the ranks answer
with empty dumps, and the verdict says that the recorder is missing instead of claiming that
every recorded collective completed. Checked on an in-process store, no ranks needed."""
from __future__ import annotations

import json

import torch.distributed as dist

from dpcore.contract import runformat as rf
from dpcore.write.capture.job_monitor import NO_RECORDER, HangWatch
from dpcore.write.capture.rank_channel import key


def _answer(store: dist.Store, job: str, ranks: int, fr: bytes) -> None:
    for r in range(ranks):
        store.set(key(job, "hang", r, "fr"), fr)
        store.set(key(job, "hang", r, "stack"), f"Thread 0x1 (most recent call first): rank {r}")


def test_empty_dumps_say_the_recorder_is_missing(tmp_path) -> None:
    store = dist.HashStore()
    _answer(store, "flat-ws2", 2, b"")
    v = HangWatch(store, "flat-ws2", 2, tmp_path, 4.0, 60.0).collect()
    assert (v.kind, v.lagging_ranks, v.message) == ("unknown", [], NO_RECORDER)
    body = json.loads((rf.hang_dir(tmp_path, "flat-ws2") / rf.VERDICT_FILE).read_text())
    assert body["message"] == NO_RECORDER and body["no_answer"] == []
    assert "rank 1" in (rf.hang_dir(tmp_path, "flat-ws2") / rf.stack_name(1)).read_text()


def test_a_recorder_with_no_entries_keeps_the_dumps_verdict(tmp_path) -> None:
    """A torch that has the recorder but recorded nothing is not "no recorder"."""
    store = dist.HashStore()
    _answer(store, "flat-ws2", 2, b'{"entries": []}')
    v = HangWatch(store, "flat-ws2", 2, tmp_path, 4.0, 60.0).collect()
    assert v.message != NO_RECORDER and "no hang in these dumps" in v.message
