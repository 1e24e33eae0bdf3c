"""Which rank a trace file is, and whether a set of trace files can be the ranks of one job.

One rule for every reader of traces (``import``, ``analyze``, ``stragglers``, ``gpu``, the
Timeline's lanes): the rank is the trace's ``distributedInfo.rank``, else ``rank<r>`` in its file
name; a merged trace names its ranks in its process names; and a folder whose traces claim the
same rank twice, a rank beyond their world, or two world sizes is refused by file
(TraceFormatError), never read as one job.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dpcore.contract.tracefile import TraceFormatError, read_trace_bytes

_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def rank_of(meta: dict[str, Any], path: Path) -> int | None:
    """distributedInfo.rank, else 'rank<r>' in the file name, else None."""
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int) and info["rank"] >= 0:
        return int(info["rank"])
    m = _RANK_RE.search(path.name)
    if m:
        return int(m.group(1))
    return None


#: Highest rank number a trace may claim: far above any real job (the largest run tens of
#: thousands of ranks); a rank of 10**12 is a damaged or crafted trace, and tables are built
#: over the ranks.
MAX_RANK = 2**20 - 1


def check_one_world(found: list[tuple[Path, int, int | None]]) -> None:
    """Refuse, by file and in file order, traces that cannot be the ranks of one job:
    (file, rank, world size from its metadata or None) with a rank beyond its world size or
    :data:`MAX_RANK`, two traces of one rank, or different world sizes. ``import``, ``analyze``,
    ``stragglers``, ``gpu`` and the Timeline's lanes read traces by this one rule (TraceFormatError)."""
    by_rank: dict[int, Path] = {}
    sizes: dict[int, Path] = {}
    for f, rank, ws in found:
        if rank < 0 or rank > MAX_RANK or (ws is not None and rank >= ws):
            raise TraceFormatError(f"{f}: rank {rank} cannot be a rank of "
                                   + (f"its world of {ws}" if ws is not None else "a job")
                                   + f"; valid ranks: 0..{(ws if ws is not None else MAX_RANK + 1) - 1}")
        if rank in by_rank:
            raise TraceFormatError(f"two traces for rank {rank}: {by_rank[rank]} and {f} (several jobs or "
                                   "profiling cycles in one folder? point at one of them)")
        if ws is not None:
            sizes.setdefault(ws, f)
            if len(sizes) > 1:
                (a, fa), (b, fb) = list(sizes.items())[:2]
                raise TraceFormatError(f"traces of different world sizes: {fa} says {a}, {fb} says {b}; "
                                       "give one job's traces at a time")
        by_rank[rank] = f


#: A process_name metadata event, whatever its key order: its ``args`` object is its only nested one.
_PROCESS_NAME_RE = re.compile(rb'\{[^{}]*"process_name"[^{}]*\{[^{}]*\}[^{}]*\}'
                              rb'|\{[^{}]*\{[^{}]*\}[^{}]*"process_name"[^{}]*\}')
_RANK_NAME_RE = re.compile(r"rank\s*(\d+)$", re.IGNORECASE)


def merged_ranks(path: Path) -> dict[str, int]:
    """{pid (as text): rank} of a trace that holds several ranks as processes named 'rank <r>' (the
    ``merged.json.gz`` dpcore writes, every rank on one clock; Chrome's ``process_name`` metadata
    events); {} when it is not one (fewer than two such processes)."""
    out: dict[str, int] = {}
    for m in _PROCESS_NAME_RE.finditer(read_trace_bytes(path)):
        try:
            ev = json.loads(m.group(0))
        except ValueError:
            continue
        args = ev.get("args") if isinstance(ev, dict) else None
        name = args.get("name") if isinstance(args, dict) else None
        hit = _RANK_NAME_RE.search(name.strip()) if isinstance(name, str) and ev.get("name") == "process_name" else None
        if hit and "pid" in ev:
            out[str(ev["pid"])] = int(hit.group(1))
    return out if len(set(out.values())) >= 2 else {}
