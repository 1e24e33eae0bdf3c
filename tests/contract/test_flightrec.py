"""The flight-recorder rule on known dumps: missing vs desync, the deviant in a 2-rank tie, the
stack's top frame, and a pickle that names a global refused without running it."""
from __future__ import annotations

import os
import pickle

import pytest

from dpcore.contract.flightrec import DumpError, load_dump, rank_states, stack_top, verdict


def _entry(seq: int, op: str, n: int, done: bool = True) -> dict:
    return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "input_sizes": [[n]],
            "input_dtypes": ["Float"], "state": "scheduled", "retired": done, "is_p2p": False,
            "process_group": ["0", "default_pg"]}


def _steps(k: int) -> list[dict]:
    """k steps of (barrier, all_reduce 1000 floats), seqs 1..2k, all completed."""
    out = []
    for i in range(k):
        out += [_entry(2 * i + 1, "barrier", 0), _entry(2 * i + 2, "all_reduce", 1000)]
    return out


def test_missing_rank_is_named_with_the_collective_the_others_wait_in():
    base = _steps(3) + [_entry(7, "barrier", 0)]
    dumps = {0: {"entries": base + [_entry(8, "all_reduce", 1000, False)]},
             1: {"entries": list(base)},
             2: {"entries": base + [_entry(8, "all_reduce", 1000, False)]}}
    v = verdict(dumps)
    assert (v.kind, v.lagging_ranks, v.seq, v.op, v.bytes) == ("missing", [1], 8, "all_reduce", 4000)
    assert "rank 1 never entered collective seq 8" in v.message


def test_a_rank_without_a_dump_counts_as_missing():
    dumps = {0: {"entries": _steps(2)}, 1: {"entries": _steps(2)}}
    assert verdict(dumps, world_size=3).lagging_ranks == [2]


@pytest.mark.parametrize("skipper", [0, 1])
def test_desync_in_a_two_rank_tie_names_the_rank_whose_sequence_was_never_seen(skipper):
    base = _steps(3) + [_entry(7, "barrier", 0)]
    dumps = {r: {"entries": base + ([_entry(8, "barrier", 0, False)] if r == skipper
                                    else [_entry(8, "all_reduce", 1000, False)])}
             for r in range(2)}
    v = verdict(dumps)
    assert (v.kind, v.lagging_ranks, v.seq, v.op) == ("desync", [skipper], 8, "all_reduce")


def test_no_hang_and_a_stuck_collective_name_nobody():
    assert verdict({0: {"entries": _steps(2)}, 1: {"entries": _steps(2)}}).kind == "unknown"
    stuck = _steps(2) + [_entry(5, "all_reduce", 10, False)]
    v = verdict({0: {"entries": stuck}, 1: {"entries": stuck}})
    assert v.kind == "unknown" and v.lagging_ranks == [] and "seq 5" in v.message


def test_rank_states_and_stack_top():
    stack = ('Thread 0x1 (most recent call first):\n  File "/x/threading.py", line 327 in wait\n'
             '  File "/x/threading.py", line 1045 in _bootstrap_inner\n'
             '  File "/x/threading.py", line 1002 in _bootstrap\n\n'
             'Current thread 0x2 (most recent call first):\n'
             '  File "/usr/lib/python3/threading.py", line 327 in wait\n'
             '  File "/w/dpcore/inject.py", line 49 in injected\n  File "/w/main.py", line 3 in <module>\n')
    assert stack_top(stack) == "inject.py:49 in injected"
    rows = rank_states({0: {"entries": _steps(1) + [_entry(3, "barrier", 0, False)]}}, {0: stack})
    assert (rows[0].last_enqueued_seq, rows[0].last_completed_seq, rows[0].state) == (3, 2, "waiting")


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_pickle_with_a_global_is_refused_without_running(tmp_path):
    bad = tmp_path / "rank_0"
    bad.write_bytes(pickle.dumps({"entries": [], "x": _Evil()}))
    with pytest.raises(DumpError) as err:
        load_dump(bad)
    assert "refused" in str(err.value) and "posix.system" in str(err.value)
    assert "\n" not in str(err.value)
    good = tmp_path / "rank_1"
    good.write_bytes(pickle.dumps({"entries": _steps(1), "version": "2.10"}))
    assert len(load_dump(good)["entries"]) == 2
