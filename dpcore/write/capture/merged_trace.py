"""Merged Chrome trace of a job: every rank as one process on the shared clock, with each
point-to-point message drawn as a flow arrow from its send to its receive.

Why marker events: torch.profiler's timestamps are on the profiler's own clock, not ours. Each
rank opens empty ``record_function`` ranges named ``dpcore_clock_sync#k`` between two reads of
the shared clock (see :mod:`dpcore.contract.clocksync`); finding them in the rank's trace gives the
shift from trace time to the shared clock, whatever clock the profiler used.

Output is the JSON Object Format of the Trace Event Format (``traceEvents`` + metadata events,
``ts``/``dur`` in microseconds), which Perfetto and chrome://tracing both open.
"""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dpcore.contract.clocksync import SYNC_MARKER, trace_shift_us
from dpcore.contract.files import atomic_write_bytes
from dpcore.contract.messages import message_key, pair_messages
from dpcore.contract.tracefile import load_trace

_MSG_TID_BASE = 900_000_000  # message lanes get tids far from OS thread ids and GPU streams
_GPU_TID_BASE = 800_000_000


def read_json_trace(path: Path | str) -> dict:
    """A Chrome trace file (gzipped or not, by magic number) as its JSON document.

    The one trace reader (:mod:`dpcore.contract.tracefile`) that the analysis uses too, so a
    file both sides accept is the same file; TraceFormatError (a ValueError) names a bad one.
    """
    meta, events = load_trace(path)
    return {**meta, "traceEvents": events}


def _sync_shift_us(events: list[Any], samples: list) -> float:
    """Microseconds to add to this trace's ``ts`` to land on the shared clock."""
    timed = [e for e in events if type(e) is dict and "ts" in e]
    shift = trace_shift_us((e.get("name", "") for e in timed), (e["ts"] for e in timed), samples)
    if shift is None:
        raise ValueError(f"trace has no {SYNC_MARKER}#k event; cannot place it on the shared clock")
    return shift


def _lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """Greedy interval partitioning: overlapping slices get different lanes, because Chrome
    trace slices on one thread must nest, and in-flight messages overlap freely."""
    ends: list[float] = []
    out = []
    for start, end in intervals:
        for lane, lane_end in enumerate(ends):
            if lane_end <= start:
                ends[lane] = end
                out.append(lane)
                break
        else:
            ends.append(end)
            out.append(len(ends) - 1)
    return out


def _message_events(messages: list[dict], t_lo_ns: int, t_hi_ns: int) -> list[dict]:
    """Slices for each logged message in [t_lo, t_hi] plus send->recv flow arrows."""
    rows = [m for m in messages if t_lo_ns <= int(m["t_post_ns"]) <= t_hi_ns]
    out: list[dict] = []
    thread_names: set[tuple[int, int, str]] = set()
    placed: dict[int, tuple[int, int, float, float]] = {}
    by_rank_side: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i, m in enumerate(rows):
        by_rank_side[(int(m["rank"]), m["side"])].append(i)
    for (rank, side), idxs in by_rank_side.items():
        idxs.sort(key=lambda i: int(rows[i]["t_post_ns"]))
        spans = [(int(rows[i]["t_post_ns"]) / 1e3, int(rows[i]["t_done_ns"]) / 1e3) for i in idxs]
        for i, lane, (ts, te) in zip(idxs, _lanes(spans), spans):
            tid = _MSG_TID_BASE + (0 if side == "send" else 1000) + lane
            thread_names.add((rank, tid, f"p2p {side} {lane}"))
            m = rows[i]
            arrow = "→" if side == "send" else "←"
            peer = m["dst"] if side == "send" else m["src"]
            out.append({"ph": "X", "pid": rank, "tid": tid, "ts": ts, "dur": max(te - ts, 0.001),
                        "cat": f"p2p_{side}", "name": f"{m['phase']} s{m['ring_step']} c{m['chunk']} "
                        f"{arrow} rank{peer}",
                        "args": {k: m[k] for k in ("algo", "step", "call", "phase", "ring_step",
                                                   "src", "dst", "chunk", "bytes")}})
            placed[i] = (rank, tid, ts, te)
    # one pairing rule for every reader of messages (dpcore.contract.messages)
    pairs = pair_messages([message_key(m) for m in rows], [m["side"] for m in rows],
                          [int(m["t_post_ns"]) for m in rows])
    for flow_id, (s_i, r_i) in enumerate(pairs, start=1):
        s_rank, s_tid, s_ts, _ = placed[s_i]
        r_rank, r_tid, r_ts, r_te = placed[r_i]
        out.append({"ph": "s", "id": flow_id, "pid": s_rank, "tid": s_tid, "ts": s_ts,
                    "cat": "p2p", "name": "message"})
        out.append({"ph": "f", "bp": "e", "id": flow_id, "pid": r_rank, "tid": r_tid,
                    "ts": max(r_ts, r_te - 0.0005), "cat": "p2p", "name": "message"})
    for rank, tid, name in thread_names:
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                    "args": {"sort_index": tid}})
    return out


def merge_job_traces(rank_traces: dict[int, Path], sync: dict[int, list],
                     messages: Iterable[dict], out_path: Path) -> dict:
    """Write ``merged.json.gz``: all ranks on the shared clock, one process named "rank r" each.

    Returns a small summary (event counts) for run.json.
    """
    events: list[dict] = []
    lo, hi = None, None
    for rank in sorted(rank_traces):
        _, src = load_trace(rank_traces[rank])
        src = [ev for ev in src if type(ev) is dict]  # the format allows nothing else
        shift = _sync_shift_us(src, sync[rank])
        cpu_pids = {ev.get("pid") for ev in src if ev.get("cat") in ("cpu_op", "user_annotation",
                                                                     "python_function")}
        seen_threads: dict[Any, int] = {}
        for ev in src:
            ph = ev.get("ph")
            if ph not in ("X", "i", "I", "M", "s", "f"):
                continue
            new = dict(ev)
            pid, tid = ev.get("pid"), ev.get("tid")
            if pid not in cpu_pids:  # GPU device "process": keep each stream a lane of this rank
                tid = _GPU_TID_BASE + int(pid if isinstance(pid, int) else 0) * 1000 + int(
                    tid if isinstance(tid, int) else 0)
            new["pid"], new["tid"] = rank, tid
            if ph == "M":
                if ev.get("name") == "thread_name":
                    seen_threads[tid] = 1
                    events.append(new)
                continue
            if "ts" in ev:
                new["ts"] = float(ev["ts"]) + shift
                lo = new["ts"] if lo is None else min(lo, new["ts"])
                hi_end = new["ts"] + float(ev.get("dur", 0) or 0)
                hi = hi_end if hi is None else max(hi, hi_end)
            if ph in ("s", "f") and "id" in ev:
                new["id"] = f"r{rank}-{ev['id']}"
            events.append(new)
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    msg_events = []
    if lo is not None and hi is not None:
        msg_events = _message_events(list(messages), int(lo * 1e3), int(hi * 1e3))
    events.extend(msg_events)
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"producer": "dpcore", "clock": "shared perf_counter (rank 0) in us"}}
    atomic_write_bytes(out_path, gzip.compress(json.dumps(doc).encode("utf-8"), compresslevel=5))
    return {"events": len(events), "message_events": sum(1 for e in msg_events if e["ph"] == "X")}
