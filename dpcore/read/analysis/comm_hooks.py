"""Compression by DDP comm hooks: bytes saved against time added (``profile --comm-hook``).

Why: a compressing hook (fp16, PowerSGD) always puts fewer bytes on the wire, but it spends
compute to compress and decompress; whether it pays depends on the network. Each hook job is set
beside the plain ``torch_ddp`` job of the same world size and bucket size (its id without the
``-<hook>`` suffix): bytes handed to the hook = the plain job's bytes per step (every gradient,
once), bytes on the wire = the hook job's logged collectives per step. Pure pandas.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["job_id", "hook", "world_size", "bucket_mb", "status", "reason", "bytes_in", "bytes_wire",
           "saved_pct", "collectives", "step_ms", "plain_step_ms", "added_ms", "compress_ms", "decompress_ms",
           "loss_after_steps", "loss", "plain_loss", "loss_diff"]


def _per_step(collectives: pd.DataFrame) -> pd.DataFrame:
    """Per job: median over (rank, step) of the bytes and the number of collectives."""
    if collectives.empty:
        return pd.DataFrame(columns=["job_id", "bytes", "collectives"])
    g = collectives.groupby(["job_id", "rank", "step"])["bytes"].agg(["sum", "count"]).reset_index()
    return g.groupby("job_id").agg(bytes=("sum", "median"), collectives=("count", "median")).reset_index()


def compression(jobs: pd.DataFrame, summary: pd.DataFrame, collectives: pd.DataFrame) -> pd.DataFrame:
    """One row per comm-hook job (``COLUMNS``), each after a ``none`` row for the plain job it is
    set against (the reference: nothing saved, nothing added, no hook compute, loss_diff 0);
    empty when the run has no hook job.

    ``jobs``: ``Run.jobs``; ``summary``: :func:`~dpcore.read.analysis.summary.job_summary` (its
    ``step_ms``, the same number the Overview shows); ``collectives``: ``Run.collectives``."""
    if "comm_hook" not in jobs or jobs["comm_hook"].isna().all():
        return pd.DataFrame(columns=COLUMNS)
    per = _per_step(collectives).set_index("job_id")
    step = summary.set_index("job_id")["step_ms"] if "step_ms" in summary else pd.Series(dtype=float)
    by_id = jobs.drop_duplicates("job_id").set_index("job_id")
    col = lambda c: pd.to_numeric(by_id[c], errors="coerce") if c in by_id else pd.Series(dtype=float)  # noqa: E731
    get = lambda s, k: float(s[k]) if k is not None and k in s.index and pd.notna(s[k]) else np.nan  # noqa: E731
    loss, c_ms, d_ms, k_steps = col("loss"), col("hook_compress_ms"), col("hook_decompress_ms"), col("loss_after_steps")
    p_bytes = per["bytes"] if len(per) else pd.Series(dtype=float)
    p_count = per["collectives"] if len(per) else pd.Series(dtype=float)

    def row(jid: str, hook: str, plain: str | None) -> dict:
        j = by_id.loc[jid]
        b_in, b_wire = get(p_bytes, plain), get(p_bytes, jid)
        t, t0 = get(step, jid), get(step, plain)
        return {"job_id": jid, "hook": hook, "world_size": j.get("world_size"), "bucket_mb": j.get("bucket_mb"),
                "status": j.get("status"), "reason": j.get("skip_reason") or j.get("error") or "",
                "bytes_in": b_in, "bytes_wire": b_wire,
                "saved_pct": 100 * (1 - b_wire / b_in) if b_in and b_in == b_in else np.nan,
                "collectives": get(p_count, jid), "step_ms": t, "plain_step_ms": t0, "added_ms": t - t0,
                "compress_ms": get(c_ms, jid), "decompress_ms": get(d_ms, jid),
                "loss_after_steps": get(k_steps, jid), "loss": get(loss, jid), "plain_loss": get(loss, plain),
                "loss_diff": get(loss, jid) - get(loss, plain)}

    rows, seen = [], set()
    for _, j in jobs[jobs["comm_hook"].notna()].iterrows():
        jid, hook = str(j["job_id"]), str(j["comm_hook"])
        plain = jid[: -len(hook) - 1] if jid.endswith(f"-{hook}") else None
        if plain is not None and plain in by_id.index and plain not in seen:
            seen.add(plain)
            rows.append(row(plain, "none", plain))
        rows.append(row(jid, hook, plain))
    return pd.DataFrame(rows, columns=COLUMNS)
