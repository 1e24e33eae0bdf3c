"""live.csv as a DataFrame, read while rank 0 may be appending to it.

Why drop a last line without its newline: the writer appends whole lines in one write, but a
crash (or a file system that splits the write) could leave half a row; a reader must never show
half a row, so only complete lines are parsed. The file is read fresh every time (it is not one
of the run files the loader's cache is keyed on: it changes while the run runs).

Why bounded and regular-only: live.csv is a file anyone can replace; a link to a device or to
``/proc/self/pagemap`` (a "regular" file of size 0 that reads forever) or a file of gigabytes
without a newline must not run the page out of memory, and a link to a file outside the run
must not be shown as the run's. It is opened through :func:`dpcore.contract.files.open_inside`
(a regular file whose real path lies inside the run) and at most :data:`MAX_LIVE_BYTES` (plus a
header line of at most :data:`MAX_HEADER_BYTES`) is read, whatever its size says.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pandas as pd

from dpcore.contract import runformat as rf
from dpcore.contract.files import open_inside

#: the most of live.csv read (its tail): a long run's early rows are not what a live view shows
MAX_LIVE_BYTES = 64 * 2**20
#: the longest header line read (live.csv's header is about 80 bytes)
MAX_HEADER_BYTES = 64 * 2**10
#: the largest run.json read for its status (the loader's own bound for run files)
MAX_META_BYTES = 512 << 20
#: live.csv of any length is accepted: only its tail is read
_ANY_SIZE = 1 << 62


def run_status(run_dir: Path | str, default: str = "?") -> str:
    """run.json's status as it is now (a loaded run's may be older: the run is still running),
    ``stale`` for a run marked ``running`` whose writer is gone (:func:`runformat.is_stale`,
    the CLI's and the run list's rule), so no view keeps refreshing a killed run."""
    try:
        with open_inside(Path(run_dir) / rf.RUN_JSON, run_dir, MAX_META_BYTES) as f:
            meta = json.loads(f.read(MAX_META_BYTES + 1))
        status = str(meta.get("status", default))
        return "stale" if status == "running" and rf.is_stale(meta) else status
    except (OSError, ValueError, AttributeError, RecursionError):
        return default


def empty_live() -> pd.DataFrame:
    return pd.DataFrame(columns=rf.LIVE_COLUMNS)


def read_live(run_dir: Path | str) -> pd.DataFrame:
    """live.csv's complete rows (an empty frame with its columns when there is none yet)."""
    path = Path(run_dir) / rf.LIVE_FILE
    try:
        with open_inside(path, run_dir, _ANY_SIZE) as f:
            size = os.fstat(f.fileno()).st_size
            header = f.readline(MAX_HEADER_BYTES)
            cut = size > MAX_LIVE_BYTES + len(header)
            if cut:
                f.seek(size - MAX_LIVE_BYTES)
            body = f.read(MAX_LIVE_BYTES)
            if cut:  # drop the partial first line of the tail
                body = body[body.find(b"\n") + 1:] if b"\n" in body else b""
    except OSError:  # missing, not a regular file (NotRegularFileError), outside the run, unreadable
        return empty_live()
    body = body[: body.rfind(b"\n") + 1]  # whole lines only
    if not header.endswith(b"\n"):
        return empty_live()
    df = pd.read_csv(io.BytesIO(header + body))
    missing = [c for c in rf.LIVE_COLUMNS if c not in df.columns]
    if missing:
        return empty_live()
    for col, kind in rf.LIVE_SCHEMA.items():
        if kind in ("int", "float", "ns"):
            df[col] = pd.to_numeric(df[col], errors="coerce")
    df["profiled"] = rf.parse_bools(df["profiled"])
    return df.dropna(subset=["rank", "step", "step_ms"]).astype({"rank": int, "step": int})
