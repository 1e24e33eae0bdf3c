"""live.csv as a DataFrame, read while rank 0 may be appending to it.

Why drop a last line without its newline: the writer appends whole lines in one write, but a
crash (or a file system that splits the write) could leave half a row; a reader must never show
half a row, so only complete lines are parsed. The file is read fresh every time (it is not one
of the run files the loader's cache is keyed on: it changes while the run runs).
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

from dpcore.contract import runformat as rf

#: the most of live.csv read (its tail): a long run's early rows are not what a live view shows
MAX_LIVE_BYTES = 64 * 2**20


def run_status(run_dir: Path | str, default: str = "?") -> str:
    """run.json's status as it is now (a loaded run's may be older: the run is still running)."""
    try:
        return str(json.loads((Path(run_dir) / rf.RUN_JSON).read_text()).get("status", default))
    except (OSError, ValueError, AttributeError):
        return default


def empty_live() -> pd.DataFrame:
    return pd.DataFrame(columns=rf.LIVE_COLUMNS)


def read_live(run_dir: Path | str) -> pd.DataFrame:
    """live.csv's complete rows (an empty frame with its columns when there is none yet)."""
    path = Path(run_dir) / rf.LIVE_FILE
    try:
        if not path.is_file():
            return empty_live()
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = f.readline()
            if size > MAX_LIVE_BYTES:
                f.seek(size - MAX_LIVE_BYTES)
                f.readline()  # drop the partial first line of the tail
            body = f.read()
    except OSError:
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
