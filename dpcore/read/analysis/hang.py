"""A hang's dumps as DataFrames: every rank's recorded collectives, each rank's state, and the
verdict (the rule itself is :func:`dpcore.contract.flightrec.verdict`, shared with the watchdog,
so the page, the command and verdict.json agree)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from dpcore.contract import flightrec

COLLECTIVE_COLUMNS = ["rank", "seq", "op", "bytes", "sizes", "completed", "pg"]
STATE_COLUMNS = ["rank", "last_enqueued_seq", "last_completed_seq", "op", "bytes", "state",
                 "stack_top"]


def hang_collectives(dumps: dict[int, dict], last: int | None = 30) -> pd.DataFrame:
    """One row per (rank, recorded collective) in the hang's process group; ``last``: only the
    last N sequence numbers before the newest (what the Hang page draws)."""
    verdict = flightrec.verdict(dumps)
    rows = [{"rank": r, "seq": c.seq, "op": c.op, "bytes": c.bytes, "sizes": c.sizes,
             "completed": c.completed, "pg": c.pg}
            for r, d in sorted(dumps.items()) for c in flightrec.collectives(d)
            if c.pg == verdict.pg]
    df = pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS)
    if last is not None and not df.empty:
        df = df[df["seq"] > df["seq"].max() - last]
    return df.reset_index(drop=True)


def rank_table(dumps: dict[int, dict], stacks: dict[int, str] | None = None) -> pd.DataFrame:
    """Per rank: last enqueued and last completed collective, its op, bytes, state, stack top."""
    rows = [vars(s) for s in flightrec.rank_states(dumps, stacks)]
    return pd.DataFrame(rows, columns=STATE_COLUMNS)


def hang_verdict(dumps: dict[int, dict[str, Any]], world_size: int | None = None) -> dict[str, Any]:
    """The verdict as a dict (verdict.json's fields)."""
    return flightrec.verdict(dumps, world_size).to_dict()
