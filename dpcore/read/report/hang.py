"""What ``python -m dpcore hang PATH [--csv]`` prints: per rank the last enqueued and last
completed collective and the top of its stack, then the verdict (which rank is behind and
where, or which collective the ranks disagree on).

PATH: a run (every job under its ``hang/``), one job's hang folder, or a folder of flight-recorder
dumps PyTorch wrote for any job. With ``--csv`` the table goes to stdout (``job_id`` first) and
each verdict to stderr, so the CSV stays machine-readable.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from dpcore.contract.options import HangOptions
from dpcore.contract.units import exact_size
from dpcore.read.analysis.hang import hang_verdict, rank_table
from dpcore.read.report.table_text import csv_table, text_table
from dpcore.read.rundir.hang import load_hangs


def hang_text(path: str | Path, csv: bool = False) -> str:
    """The report (see module docstring)."""
    sets = load_hangs(path)
    if csv:
        frames = [rank_table(s.dumps, s.stacks).assign(job_id=s.job_id) for s in sets]
        df = pd.concat(frames, ignore_index=True)
        df = df[["job_id", *[c for c in df.columns if c != "job_id"]]]
        for s in sets:
            for line in s.skipped:
                print(f"{s.job_id}: skipped: {line}", file=sys.stderr)
            print(f"{s.job_id}: {hang_verdict(s.dumps, s.world_size)['message']}", file=sys.stderr)
        return csv_table(df)
    parts = []
    for s in sets:
        v = hang_verdict(s.dumps, s.world_size)
        skipped = "".join(f"skipped: {line}\n" for line in s.skipped)
        table = text_table(rank_table(s.dumps, s.stacks), float_format=None, formatters={"bytes": exact_size})
        parts.append(f"{s.job_id} ({len(s.dumps)} rank dump(s))\n{skipped}{table}\n"
                     f"verdict ({v['kind']}): {v['message']}")
    return "\n\n".join(parts)


def hang_command(options: HangOptions) -> str:
    """The ``hang`` command: exactly what it prints (the text ends in one newline; a CSV as is)."""
    out = hang_text(options.path, csv=options.csv)
    return out if options.csv else out.rstrip("\n") + "\n"
