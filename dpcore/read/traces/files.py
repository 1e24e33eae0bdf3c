"""Which files of a path are rank traces: discovery only, nothing is parsed here.

People point dpcore at whatever their training wrote (one file, a folder of ``rank<r>.json``,
torchtitan's ``iteration_<k>`` folders, ``tensorboard_trace_handler``'s per-cycle files);
:func:`trace_files` turns that into one job's per-rank files by the rules in its docstring.
:func:`json_bytes` sizes a file without reading it, so a caller can decide whether reading the
files in worker processes pays (:mod:`dpcore.read.traces.workers`).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from dpcore.contract.runformat import RUN_JSON, TRACE_SUFFIXES
from dpcore.contract.tracefile import MAX_TRACE_FILE_BYTES, TraceFormatError, open_regular

_ITER_RE = re.compile(r"iteration_(\d+)")
_TB_RE = re.compile(r"(?P<worker>.+)\.(?P<stamp>\d+)\.pt\.trace\.json(\.gz)?")


def trace_files(path: str | Path, iteration: int | None = None) -> list[Path]:
    """The per-rank trace files at ``path``: the file itself, or a folder searched recursively.

    Why recursive, and these rules: people point at what their training wrote. torchtitan
    writes ``iteration_<k>/rank<r>_trace.json`` per profiling cycle (take iteration
    ``iteration``, else the latest); ``tensorboard_trace_handler`` writes
    ``<worker>.<stamp>.pt.trace.json[.gz]`` per worker and cycle (take each worker's latest
    cycle); dpcore and many scripts write ``rank<r>.json[.gz]``. Files named like a trace
    (``rank*``, ``*trace*``) win over other JSON; ``merged*`` and ``run.json`` never count.
    """
    p = Path(path)
    if p.is_file():
        if not p.name.endswith(TRACE_SUFFIXES):
            raise TraceFormatError(f"not a Chrome trace file (*.json, *.json.gz): {p}")
        return [p]
    if not p.is_dir():
        raise TraceFormatError(f"not a regular file or folder (a pipe, device or socket): {p}" if p.exists()
                               else f"trace folder not found: {p}")
    iters = iteration_dirs(p)
    if iteration is not None and iteration not in iters:
        have = ", ".join(map(str, sorted(iters))) or "none"
        raise TraceFormatError(f"no iteration_{iteration} folder under {p} (iterations found: {have})")
    if iters:
        p = iters[iteration if iteration is not None else max(iters)]
    found = sorted(f for f in _walk(p) if f.name.endswith(TRACE_SUFFIXES)
                   and not f.name.startswith("merged") and f.name != RUN_JSON)
    named = [f for f in found if f.name.lower().startswith("rank") or "trace" in f.name.lower()]
    files = _latest_cycles(named or found)
    if not files:
        raise TraceFormatError(f"no Chrome trace files (*.json, *.json.gz) in {p}")
    return files


def iteration_dirs(path: Path) -> dict[int, Path]:
    """{k: folder} of torchtitan's ``iteration_<k>`` trace folders under ``path`` (itself included)."""
    out: dict[int, Path] = {}
    for d in [path, *(f for f in _walk(path, dirs=True))]:
        m = _ITER_RE.fullmatch(d.name)
        if m and d.is_dir():
            out.setdefault(int(m.group(1)), d)
    return out


def _walk(path: Path, dirs: bool = False) -> Iterator[Path]:
    """Files (or folders) under ``path``, recursively, skipping hidden folders; no symlinked folders."""
    for root, subdirs, names in os.walk(path):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for n in (subdirs if dirs else names):
            yield Path(root) / n


def _latest_cycles(files: list[Path]) -> list[Path]:
    """Of tensorboard_trace_handler's files, each worker's latest cycle (largest stamp); others kept."""
    best: dict[tuple[Path, str], tuple[int, Path]] = {}
    out = []
    for f in files:
        m = _TB_RE.fullmatch(f.name)
        if m is None:
            out.append(f)
            continue
        key, stamp = (f.parent, m.group("worker")), int(m.group("stamp"))
        if key not in best or stamp > best[key][0]:
            best[key] = (stamp, f)
    return sorted(out + [f for _, f in best.values()])


def json_bytes(path: Path) -> int:
    """Uncompressed size of a trace file (gzip's ISIZE trailer; exact below 4 GiB), 0 if unreadable."""
    try:  # regular files only: a FIFO would block here (the read proper reports it by name)
        with open_regular(path, MAX_TRACE_FILE_BYTES) as fh:
            if fh.read(2) != b"\x1f\x8b":
                return os.fstat(fh.fileno()).st_size
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0
