"""Collective bandwidth, ring message timing and the ring chunk matrix.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time; busbw = algbw · factor,
factor 2(N−1)/N for all-reduce, (N−1)/N for reduce-scatter / all-gather / all-to-all, 1 for
broadcast/reduce: busbw is comparable to the link speed whatever N is.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dpcore.contract.bandwidth import bus_factor
from dpcore.contract.intervals import union_length
from dpcore.contract.messages import pair_messages, piece_numbers
from dpcore.contract.ringplan import ring_schedule
from dpcore.contract.runformat import ALLREDUCE_COLUMNS, MESSAGE_KEY

_GROUP = ["job_id", "algo", "step", "call", "phase", "ring_step"]


def allreduce_bandwidth(allreduce: pd.DataFrame) -> pd.DataFrame:
    """algbw/busbw per (allreduce job, size), recomputed from bytes and time_ms.

    `consistent` says whether the recorded values agree with the recomputed ones (within 1%).
    """
    cols = [c for c in ALLREDUCE_COLUMNS if c != "repeats"] + ["consistent"]
    if allreduce is None or allreduce.empty:
        return pd.DataFrame(columns=cols)
    df = allreduce.copy()
    t = pd.to_numeric(df["time_ms"], errors="coerce") / 1e3
    algbw = (df["bytes"] / t / 1e9).where(t > 0)
    busbw = algbw * df["world_size"].map(lambda n: bus_factor("all_reduce", int(n)))
    rec_a = pd.to_numeric(df.get("algbw_gbps"), errors="coerce")
    df["consistent"] = (rec_a.isna() | (np.abs(rec_a - algbw) <= 0.01 * algbw.abs() + 1e-12)).to_numpy()
    df["algbw_gbps"], df["busbw_gbps"] = algbw, busbw
    return df[cols].sort_values(["algo", "world_size", "bytes"]).reset_index(drop=True)


def _keys(messages: pd.DataFrame) -> list[tuple]:
    return list(messages[[k for k in MESSAGE_KEY if k in messages.columns]].astype(str).itertuples(index=False))


def message_pairs(messages: pd.DataFrame) -> pd.DataFrame:
    """One row per message seen on both sides: key columns, the send's post/done and the
    receive's post/done times (``*_send`` / ``*_recv``), paired by
    :func:`dpcore.contract.messages.pair_messages`."""
    keys = [k for k in MESSAGE_KEY if k in messages.columns]
    row_keys, sides, posts = _keys(messages), messages["side"].tolist(), messages["t_post_ns"].tolist()
    pieces = piece_numbers(row_keys, sides, posts)
    idx = pair_messages(row_keys, sides, posts, pieces)
    snd = messages.iloc[[a for a, _ in idx]].reset_index(drop=True)
    rcv = messages.iloc[[b for _, b in idx]].reset_index(drop=True)
    out = snd[keys].copy()
    out["piece"] = np.asarray([pieces[a] for a, _ in idx], dtype=np.int64)
    for c in ("t_post_ns", "t_done_ns"):
        out[f"{c}_send"], out[f"{c}_recv"] = snd[c].to_numpy(), rcv[c].to_numpy()
    return out


def ring_step_times(messages: pd.DataFrame) -> pd.DataFrame:
    """Per (job, algo, step, call, phase, ring_step, rank): duration, transfer and wait (ms).

    docs/DESIGN.md: transfer = the shortest matching send→recv time across ranks in that ring step
    (send posted at src .. receive completed at dst: the pure wire time when nobody waited;
    for a chunk sent as several pipelined sub-messages, the union of their intervals on that
    link), wait = the rank's time in the ring step minus that transfer.
    """
    cols = _GROUP + ["rank", "duration_ms", "transfer_ms", "wait_ms"]
    if messages is None or messages.empty:
        return pd.DataFrame(columns=cols)
    m = messages
    pairs = message_pairs(m)
    # A link's transfer time in a step is the union of its messages' send-posted -> received
    # intervals (a pipelined chunk's sub-messages overlap in flight); the step's transfer is
    # the fastest link's.
    by_link: Any = pairs.groupby(_GROUP + ["src", "dst"], dropna=False)  # pandas-stubs lack include_groups
    link = by_link.apply(lambda g: union_length(g["t_post_ns_send"], g["t_done_ns_recv"]) / 1e6, include_groups=False)
    transfer = link.groupby(level=list(range(len(_GROUP))), dropna=False).min().rename("transfer_ms")
    per = m.groupby(_GROUP + ["rank"], dropna=False).agg(t0=("t_post_ns", "min"), t1=("t_done_ns", "max"))
    per["duration_ms"] = (per["t1"] - per["t0"]) / 1e6
    out = per.reset_index().merge(transfer.reset_index(), on=_GROUP, how="left")
    out["transfer_ms"] = np.minimum(out["transfer_ms"], out["duration_ms"])
    out["wait_ms"] = (out["duration_ms"] - out["transfer_ms"]).clip(lower=0)
    return out[cols].sort_values(_GROUP + ["rank"]).reset_index(drop=True)


def chunk_matrix(world_size: int) -> pd.DataFrame:
    """Which chunk each rank sends/receives and holds after each ring all-reduce step.

    Ring all-reduce (Patarasuk & Yuan; Baidu): in reduce-scatter step k rank r sends chunk
    (r−k) mod N to r+1 and adds chunk (r−k−1) mod N from r−1; after N−1 steps rank r owns the
    fully reduced chunk (r+1) mod N. All-gather step k forwards chunk (r+1−k) mod N. `held[c]` is
    how many ranks' contributions rank r's copy of chunk c contains; `complete` lists the chunks
    that hold all N (comma-joined).
    """
    n = int(world_size)
    if n < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    held = np.ones((n, n), dtype=int)  # held[rank, chunk]
    rows = []
    plan = ring_schedule(n)  # ordered by (phase, ring_step, rank): the plan the ring executes
    for i in range(0, len(plan), n):
        block, before = plan[i:i + n], held.copy()
        for st in block:  # st.rank receives st.recv_chunk from st.src
            c = st.recv_chunk
            held[st.rank, c] = (before[st.rank, c] + before[st.src, c]
                                if st.phase == "reduce_scatter" else before[st.src, c])
        for st in block:
            rows.append({"phase": st.phase, "ring_step": st.ring_step, "rank": st.rank,
                         "send_chunk": st.send_chunk, "recv_chunk": st.recv_chunk, "dst": st.dst,
                         "src": st.src, "held": held[st.rank].tolist(),
                         "complete": ",".join(str(c) for c in range(n) if held[st.rank, c] == n)})
    return pd.DataFrame(rows, columns=["phase", "ring_step", "rank", "send_chunk", "recv_chunk", "dst", "src",
                                       "held", "complete"])


def message_counts(messages: pd.DataFrame) -> pd.DataFrame:
    """Per (job, algo): messages and bytes sent (each message counted once, at its sender), the
    number of all-reduce calls and messages per call (ring: 2N(N−1); naive: N(N−1); central:
    2(N−1)). A message is one logical transfer (``MESSAGE_KEY``: one chunk of one ring step): the
    pipelined ring's S sub-messages of a large chunk count once, in ``sub_messages`` apart, so
    that the count per call is the formula's whatever the message size (the sample's calls of
    16 MiB pipelined 4 pieces per chunk: 6 "messages" per call were counted where the ring sends 4)."""
    cols = ["job_id", "algo", "messages", "sub_messages", "bytes", "calls", "messages_per_call"]
    if messages is None or messages.empty:
        return pd.DataFrame(columns=cols)
    s = messages[messages["side"] == "send"]
    key = [k for k in MESSAGE_KEY if k in s.columns]
    logical = s.groupby(key, dropna=False).size().rename("pieces").reset_index()
    g = logical.groupby(["job_id", "algo"])
    out = g.agg(messages=("pieces", "size"), sub_messages=("pieces", "sum")).reset_index()
    out = out.merge(s.groupby(["job_id", "algo"])["bytes"].sum().rename("bytes").reset_index(), on=["job_id", "algo"])
    calls = logical.drop_duplicates(["job_id", "algo", "step", "call"]).groupby(["job_id", "algo"]).size()
    out["calls"] = calls.reindex(pd.MultiIndex.from_frame(out[["job_id", "algo"]])).to_numpy()
    out["messages_per_call"] = out["messages"] / out["calls"]
    return out[cols]


#: Per collective call of a trace: `gpu --collectives`' columns after job_id.
CALL_COLUMNS = ["rank", "step", "seq", "op", "bytes", "time_ms", "algbw_gbps", "busbw_gbps"]


def call_bandwidth(calls: pd.DataFrame, world_size: int | None) -> pd.DataFrame:
    """algbw and busbw of every collective call of one rank's trace (nccl-tests' definitions, as
    :func:`allreduce_bandwidth`): ``calls`` are the rank's comm events with the bytes the trace's
    collective metadata gives (the ``import_comm`` rank table: rank, step, seq, op, dur µs, bytes;
    NaN where the trace does not say), ``world_size`` the group's ranks (busbw NaN when unknown).
    algbw = bytes / time in GB/s (1e9 bytes/s)."""
    if calls.empty:
        return pd.DataFrame(columns=CALL_COLUMNS)
    dur = calls["dur"].to_numpy(np.float64)
    algbw = calls["bytes"].to_numpy(np.float64) / np.where(dur > 0, dur * 1e3, np.nan)  # bytes/ns = GB/s
    factor = np.asarray([bus_factor(str(op), int(world_size)) if world_size else np.nan for op in calls["op"]])
    return pd.DataFrame({"rank": calls["rank"].to_numpy(), "step": calls["step"].to_numpy(),
                         "seq": calls["seq"].to_numpy(), "op": calls["op"].astype(str).to_numpy(),
                         "bytes": calls["bytes"].to_numpy(np.float64), "time_ms": dur / 1e3,
                         "algbw_gbps": algbw, "busbw_gbps": algbw * factor}, columns=CALL_COLUMNS)
