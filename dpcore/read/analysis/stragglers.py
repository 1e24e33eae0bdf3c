"""Stragglers and skew: which rank makes the others wait at each collective.

A collective completes only when every rank has joined it, so the rank that arrives last sets
its pace; every other rank's time in the collective is partly waiting for that rank, partly
moving data. docs/DESIGN.md "collective wait (stragglers)": for one collective matched across ranks,

* a rank's **wait** = latest arrival − its own arrival (at most its comm time, see below); the
  rank with wait 0 arrived last
  (with exact ties every tied rank counts as last, so per job the ranks' last-arrival shares
  add up to ≥ 100 %);
* **start skew** = latest − earliest start; **end skew** = latest − earliest end;
* a rank's comm time (end − arrival) splits into **wait** and **transfer** = comm − wait
  (= end − latest arrival): the part after everyone had arrived. A wait is never longer than
  the comm it is part of: where a rank's collective ended before the last rank
  arrived (impossible for a collective on one clock: the clocks or the matching are off, or
  the rank was a broadcast's root) the wait is capped at that rank's comm time, transfer is 0,
  and :func:`wait_notes` says how often.

Arrival is when the rank reached the collective: ``t_launch_ns`` of collectives.csv (read on the
calling thread just before the ``dist`` call: the enqueue). A collective is matched by
(job_id, step, seq) and kept only when every rank of the job recorded it: one seen on fewer ranks cannot be
matched and is dropped (so are jobs of one rank). For
asynchronous collectives (``overlap``, ``bucketed``, DDP) the wait is time the collective sat
waiting for its peers, which the rank may have spent computing: it measures skew, not idleness.
Traces go through :mod:`dpcore.read.analysis.trace_arrivals` (the enqueue as arrival on gloo,
point-to-point events left out); a folder holding fewer ranks than the job had is said so
(:func:`partial_rank_note`): the latest of the traced ranks need not be the job's latest.

Pure pandas/numpy: DataFrames in, DataFrames out (the ``stragglers`` command's text and its
verdict sentence's layout are :mod:`dpcore.read.report.stragglers`; the verdict itself,
:func:`straggler_verdict`, is here so that the command and the dashboard name the same rank).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpcore.read.analysis.comm_overlap import MS_NS, comm_start_ns

KEY = ["job_id", "step", "seq"]
WAIT_COLUMNS = ["job_id", "step", "seq", "rank", "op", "bytes", "arrival_ns", "end_ns", "wait_ms", "last",
                "start_skew_ms", "end_skew_ms", "comm_ms", "transfer_ms"]
SUMMARY_COLUMNS = ["job_id", "rank", "collectives", "last_arrival_pct", "mean_wait_ms", "p90_wait_ms",
                   "wait_ms", "transfer_ms", "comm_ms", "wait_fraction", "mean_start_skew_ms",
                   "mean_end_skew_ms"]


def _num(s: pd.Series) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(np.float64)


def collective_waits(collectives: pd.DataFrame) -> pd.DataFrame:
    """One row per (job_id, step, seq, rank) of every collective seen on all ranks of its job.

    ``collectives`` has collectives.csv's columns (``t_start_ns`` optional). Start skew uses the
    backend's start where it reported one (``t_start_ns``: NCCL; in traces the kernel's or gloo
    worker's start), else the launch: in dpcore's gloo runs, which record no start, start skew
    therefore equals the collective's largest arrival gap.
    wait = min(latest arrival, own end) − own arrival: the part of the rank's comm before the last
    rank arrived, so wait ≤ comm and transfer = comm − wait; ``last`` compares the arrivals alone.
    Columns: WAIT_COLUMNS (times ``*_ns`` on the shared clock, durations in ms).
    """
    if collectives is None or collectives.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    c = collectives.assign(rank=_num(collectives["rank"]), step=_num(collectives["step"]),
                           seq=_num(collectives["seq"]), arrival_ns=_num(collectives["t_launch_ns"]),
                           end_ns=_num(collectives["t_end_ns"]), _start=comm_start_ns(collectives))
    c = c.dropna(subset=["rank", "step", "seq", "arrival_ns", "end_ns"])
    c = c.drop_duplicates(subset=KEY + ["rank"], keep="first")
    if c.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    for col in ("rank", "step", "seq"):
        c[col] = c[col].astype(np.int64)
    job_ranks = c.groupby("job_id")["rank"].transform("nunique")
    seen_on = c.groupby(KEY)["rank"].transform("size")
    c = c[(seen_on == job_ranks) & (job_ranks >= 2)]
    if c.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    g = c.groupby(KEY)
    latest = g["arrival_ns"].transform("max")
    wait = ((np.minimum(latest, c["end_ns"]) - c["arrival_ns"]) / MS_NS).clip(lower=0.0)
    comm = (c["end_ns"] - c["arrival_ns"]) / MS_NS
    out = c.assign(
        wait_ms=wait, last=latest <= c["arrival_ns"],
        start_skew_ms=(g["_start"].transform("max") - g["_start"].transform("min")) / MS_NS,
        end_skew_ms=(g["end_ns"].transform("max") - g["end_ns"].transform("min")) / MS_NS,
        comm_ms=comm, transfer_ms=(comm - wait).clip(lower=0.0))
    for col in ("op", "bytes"):
        if col not in out:
            out[col] = np.nan
    return out[WAIT_COLUMNS].sort_values(KEY + ["rank"]).reset_index(drop=True)


def straggler_summary(waits: pd.DataFrame) -> pd.DataFrame:
    """Per (job_id, rank): how often the rank arrived last and how long it waited for the others.

    last_arrival_pct = 100 · (collectives where the rank had wait 0) / collectives; wait_ms,
    transfer_ms and comm_ms are totals over the matched collectives; wait_fraction = wait / comm
    (NaN without comm time); mean_start_skew_ms / mean_end_skew_ms average the skews of the
    collectives the rank took part in (the same for every rank of a job). Columns: SUMMARY_COLUMNS.
    wait + transfer = comm and wait_fraction ≤ 1: :func:`collective_waits` caps each wait at its
    comm (:func:`wait_notes` counts where it had to).
    """
    if waits is None or waits.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    g = waits.groupby(["job_id", "rank"], sort=False)
    s = g.agg(collectives=("wait_ms", "size"), last_n=("last", "sum"), mean_wait_ms=("wait_ms", "mean"),
              p90_wait_ms=("wait_ms", lambda w: float(np.quantile(w, 0.9))), wait_ms=("wait_ms", "sum"),
              transfer_ms=("transfer_ms", "sum"), comm_ms=("comm_ms", "sum"),
              mean_start_skew_ms=("start_skew_ms", "mean"), mean_end_skew_ms=("end_skew_ms", "mean")).reset_index()
    s["last_arrival_pct"] = 100.0 * s["last_n"] / s["collectives"]
    s["wait_fraction"] = (s["wait_ms"] / s["comm_ms"].where(s["comm_ms"] > 0)).astype(float)
    s["collectives"] = s["collectives"].astype(np.int64)
    s["rank"] = s["rank"].astype(np.int64)
    order = {j: i for i, j in enumerate(dict.fromkeys(waits["job_id"]))}
    s = s.assign(_o=s["job_id"].map(order)).sort_values(["_o", "rank"])
    return s[SUMMARY_COLUMNS].reset_index(drop=True)


def stragglers_from_rows(rows: pd.DataFrame, ranks: list[int]) -> pd.DataFrame:
    """:func:`collective_waits` of torch.profiler traces, from their comm rows
    (:func:`~dpcore.read.analysis.trace_arrivals.trace_comm_rows`, per rank or all at once: the
    same rows; what the per-rank tables keep instead of the events) and the ranks traced.

    Comm events (kind ``comm``: NCCL kernels on GPU, ``gloo:*`` spans on a gloo worker thread on
    CPU) are the rows; the point-to-point ones (send/recv) are left out, and the rest are matched
    by order: the n-th of every rank within one ProfilerStep (step −1 outside every step) is the
    same collective, because data-parallel ranks issue their collectives in the same order. A
    step in which the ranks saw different numbers of them cannot be matched by order and is
    dropped whole.

    Arrival: on gloo, when the rank enqueued the collective (its ``c10d::*`` op on the calling
    thread, linked in queue order to the gloo span; the span's start where no enqueue links);
    on GPU, when the NCCL kernel started on its stream. The traces must share one clock:
    torch.profiler stamps events with the host's clock, so ranks of one host compare directly;
    traces of several hosts need a clock shift first. ``bytes`` is unknown in traces (NaN);
    start is the event's start (the gloo thread's pick-up, the kernel's start).
    """
    rows = rows[~rows["p2p"].astype(bool)]
    if rows.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    rows = rows[rows["step"].isin(_same_count_steps(rows, ranks))]
    rows = rows.assign(seq=rows.groupby(["rank", "step"]).cumcount().to_numpy(np.int64), bytes=np.nan)
    return collective_waits(rows)


def call_transfer_wait(calls: pd.DataFrame) -> pd.DataFrame:
    """Each rank's time in each collective call split into transfer and wait, across the ranks of
    its job (docs/DESIGN.md "ring step wait vs transfer", applied to a whole call): ``calls`` has
    one row per call and rank (job_id, rank, step, seq, op, time_ms: ``gpu --collectives``' rows,
    the kernel's duration on a GPU). Calls are matched as :func:`stragglers_from_rows` matches
    them: point-to-point calls left out, the n-th call of every rank in one step is the same
    call, and a step whose ranks saw different numbers of calls is dropped. transfer_ms = the
    shortest time of the matched call over the ranks (what moving the data took on the rank that
    waited least: its peers were already there), wait_ms = the rank's time − transfer_ms (≥ 0:
    the part spent waiting inside the kernel for a late peer). Returns ``calls`` with the two
    columns added, NaN where the call is not matched on every rank of the job (or the job has
    one rank)."""
    out = calls.assign(transfer_ms=np.nan, wait_ms=np.nan)
    for _, c in calls.groupby("job_id", sort=False):
        ranks = sorted(int(r) for r in c["rank"].unique())
        c = c[c["op"].astype(str) != "send_recv"]
        if len(ranks) < 2 or c.empty:
            continue
        c = c[c["step"].isin(_same_count_steps(c, ranks))]
        order = c.groupby(["rank", "step"]).cumcount()
        transfer = c["time_ms"].groupby([c["step"], order]).transform("min")
        out.loc[c.index, "transfer_ms"] = transfer
        out.loc[c.index, "wait_ms"] = (c["time_ms"] - transfer).clip(lower=0.0)
    return out


def _same_count_steps(rows: pd.DataFrame, ranks: list[int]) -> pd.Index:
    """Steps in which every rank of the traces has the same number of rows."""
    counts = rows.groupby(["step", "rank"]).size().unstack(fill_value=0).reindex(columns=ranks, fill_value=0)
    return counts.index[counts.min(axis=1) == counts.max(axis=1)]


def partial_rank_note(ranks: int, world_size: int | None) -> str | None:
    """The warning for a set of ``ranks`` ranks out of a ``world_size``-rank job (None when whole
    or unknown): the latest arrival among the ranks present need not be the job's latest."""
    if world_size is None or world_size <= ranks:
        return None
    return (f"only {ranks} of the job's {world_size} ranks are here: each wait is measured against the latest "
            f"of these {ranks}, and a rank not here may be the real straggler")


def wait_notes(waits: pd.DataFrame) -> list[str]:
    """Warnings about the waits themselves: how many collectives had a rank whose comm ended
    before the last rank arrived (its wait is capped at its comm time, see :func:`collective_waits`)."""
    if waits is None or waits.empty:
        return []
    latest = waits.groupby(KEY)["arrival_ns"].transform("max")
    early = waits.loc[waits["end_ns"] < latest, KEY].drop_duplicates()
    if early.empty:
        return []
    n = len(waits.drop_duplicates(KEY))
    return [f"in {len(early)} of {n} collectives a rank's comm ended before the last rank arrived (not possible "
            "for one collective on one clock: clocks or matching are off); its wait is capped at its comm time"]


def arrival_notes_from_rows(rows: pd.DataFrame, ranks: list[int], world_size: int | None = None) -> list[str]:
    """What a reader of :func:`stragglers_from_rows` on these comm rows and ranks must know, one
    line each: a partial rank set (``world_size``, e.g. the traces' ``distributedInfo.world_size``,
    larger than the ranks present), point-to-point events left out, gloo spans whose arrival is
    the worker's start (no enqueue linked), comm events of steps that could not be matched."""
    notes: list[str] = []
    if not ranks:
        return notes
    partial = partial_rank_note(len(ranks), world_size)
    if partial:
        notes.append(partial)
    p2p = rows[rows["p2p"].astype(bool)]
    if len(p2p):
        names = ", ".join(sorted({n.split("(")[0] for n in p2p["op"]}))
        notes.append(f"{len(p2p)} point-to-point comm events ({names}) are not matched as collectives: a send pairs "
                     "with one receive, not with every rank (NCCL runs all_to_all as SendRecv kernels too)")
    rows = rows[~rows["p2p"].astype(bool)]
    gloo = rows[rows["op"].str.startswith("gloo:")]
    unlinked = gloo[~gloo["enqueued"].astype(bool)]
    if len(unlinked):
        notes.append(f"{len(unlinked)} of {len(gloo)} gloo spans have no enqueue (c10d::* op) to link to: their "
                     "arrival is when gloo's worker thread started them, so a rank whose worker was still busy "
                     "looks late")
    unmatched = rows[~rows["step"].isin(_same_count_steps(rows, ranks))]
    if len(unmatched):
        notes.append(f"{len(unmatched)} comm events of steps in which the ranks saw different numbers of them "
                     "are left out (cannot be matched by order)")
    return notes


#: Fewest collectives (matched across ranks) a verdict is drawn from: below it "most of the
#: time" has no meaning and a rank is never named.
MIN_COLLECTIVES = 5
#: Least mean wait (ms per collective) the others must have spent on the last rank before it is
#: named: below it, the skew is the launch jitter of a busy host (1–2 ms between two gloo ranks
#: on a loaded 2-core machine with no injected delay), not a straggler worth acting on.
MIN_WAIT_MS = 5.0


def straggler_verdict(summary: pd.DataFrame, world_size: int | None = None, waits: pd.DataFrame | None = None,
                      host_idle: pd.Series | None = None) -> str:
    """One sentence on one job's :func:`straggler_summary` rows: who arrived last and what it cost
    the others. A rank is named only when it arrived last in at least
    :func:`straggler_threshold_pct` of at least MIN_COLLECTIVES collectives and the others waited
    at least MIN_WAIT_MS on average; otherwise the sentence says which condition failed.

    When no one rank dominates and the job's ``waits`` (its :func:`collective_waits` rows) are
    given, a *set* of stragglers may be named instead (:func:`straggler_set`, whose docstring
    states the rule): a few slow ranks that arrive last together split the "last" between them,
    so none of them reaches the one-rank threshold although together they set the pace. Where
    ``host_idle`` (per rank: the GPU's host-idle % of its trace, :func:`rank_host_idle_pct`) is
    known, the sentence says whether the named rank(s) are also the ranks whose GPUs waited most
    for their CPU: a late arrival caused by a slow host shows there too.

    ``world_size`` (the job's, when known) larger than the ranks in ``summary`` adds that only
    those ranks were compared. The CLI and the Stragglers view both print this sentence."""
    if summary is None or summary.empty:
        return "no collective matched across ranks"
    return _verdict(summary, waits, host_idle) + (f" (among {len(summary)} of {world_size} ranks only)"
                                                  if world_size is not None and world_size > len(summary) else "")


def _verdict(summary: pd.DataFrame, waits: pd.DataFrame | None, host_idle: pd.Series | None) -> str:
    top = summary.sort_values(["last_arrival_pct", "mean_wait_ms"], ascending=[False, True]).iloc[0]
    n = int(summary["collectives"].max())
    often = summary[summary["last_arrival_pct"] >= straggler_threshold_pct(len(summary))]
    if len(often) != 1:  # none dominates, or exact ties: a set of ranks may still arrive last together
        found = straggler_set(waits, summary) if waits is not None else None
        if found is not None:
            return _set_sentence(found, summary, host_idle)
    if len(often) > 1:  # exact ties: several ranks "last" every time, none of them the straggler
        names = ", ".join(str(int(r)) for r in sorted(often["rank"]))
        return f"no consistent straggler (ranks {names} tied as last in most of the {n} collectives)"
    if often.empty:
        return (f"no consistent straggler (most often last: rank {int(top['rank'])}, "
                f"{top['last_arrival_pct']:.0f}% of {n} collectives)")
    if n < MIN_COLLECTIVES:
        return f"too few collectives to name a straggler: {n} matched, at least {MIN_COLLECTIVES} needed"
    others = summary[summary["rank"] != top["rank"]]
    mean_other = float(others["wait_ms"].sum() / max(1, others["collectives"].sum()))
    if mean_other < MIN_WAIT_MS:
        return (f"no straggler worth naming: rank {int(top['rank'])} arrived last in "
                f"{top['last_arrival_pct']:.0f}% of {n} collectives, but the others waited {mean_other:.3g} ms "
                f"on average, less than the {MIN_WAIT_MS:g} ms of a busy host's launch skew")
    return (f"rank {int(top['rank'])} arrived last in {top['last_arrival_pct']:.0f}% of {n} collectives; "
            f"others waited {mean_other:.3g} ms on average") + _host_clause([int(top["rank"])], host_idle)


def _names(ranks: list[int]) -> str:
    """"0 and 6", "0, 3 and 6"."""
    words = [str(r) for r in ranks]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _set_sentence(found: dict, summary: pd.DataFrame, host_idle: pd.Series | None) -> str:
    ranks: list[int] = found["ranks"]
    waits = summary.set_index("rank")["mean_wait_ms"]
    own = " and ".join(f"{waits[r]:.3g}" for r in ranks)
    top = summary.sort_values(["last_arrival_pct", "mean_wait_ms"], ascending=[False, True]).iloc[0]
    return (f"ranks {_names(ranks)} are the stragglers: they were the last {len(ranks)} to arrive in "
            f"{found['pct']:.0f}% of {found['collectives']} collectives; the others waited "
            f"{found['others_wait_ms']:.3g} ms on average, ranks {_names(ranks)} waited {own} ms "
            f"(no one rank dominates: rank {int(top['rank'])} was last in {top['last_arrival_pct']:.0f}%)"
            + _host_clause(ranks, host_idle))


def _host_clause(ranks: list[int], host_idle: pd.Series | None) -> str:
    """"; their GPUs waited for their CPU ..." where every rank's host idle is known, else ""."""
    if host_idle is None:
        return ""
    idle = pd.to_numeric(host_idle, errors="coerce").dropna()
    idle.index = idle.index.astype(int)
    if not set(ranks) <= set(idle.index) or len(idle) <= len(ranks):
        return ""
    mine, rest = idle[idle.index.isin(ranks)], idle[~idle.index.isin(ranks)]
    whose = "its GPU" if len(ranks) == 1 else "their GPUs"
    vals = " and ".join(f"{mine[r]:.0f}" for r in ranks)
    if float(mine.min()) > float(rest.max()):
        return (f"; {whose} waited most for the host ({vals}% host idle against at most {rest.max():.0f}% "
                "for the others): a slow host, not the network")
    return (f"; {whose} did not wait most for the host ({vals}% host idle, others up to {rest.max():.0f}%): "
            "look beyond the host (data, an uneven load)")


def rank_host_idle_pct(ledger: pd.DataFrame) -> pd.Series:
    """Host idle % of each rank's whole-trace GPU window (the ``gpu`` ledger's ``trace`` rows,
    :func:`dpcore.read.analysis.gpu_time.gpu_ledger`; one job's rows), indexed by rank: the share
    of the GPU's time it spent waiting for its CPU to launch. Empty for CPU traces."""
    if ledger is None or ledger.empty:
        return pd.Series(dtype=float)
    whole = ledger[ledger["window"] == "trace"]
    per = whole.groupby("rank")[["idle_host_ms", "span_ms"]].sum()
    out = 100.0 * per["idle_host_ms"] / per["span_ms"].where(per["span_ms"] > 0)
    out.index = out.index.astype(int)
    return out.dropna()


def straggler_set(waits: pd.DataFrame, summary: pd.DataFrame | None = None) -> dict | None:
    """The smallest set of ranks that arrives last together, when one exists, of one job.

    The rule. For k = 2, 3, ... up to N // 2 (N ranks; a set of more than half the ranks is the
    job's pace, not stragglers), in each matched collective take the ranks whose arrival is at or
    after the k-th latest (exact ties at the boundary make that group larger than k: it then is no
    k-set). The k-set seen most often is named when, first, it is the last k in at least
    :func:`straggler_threshold_pct` (N, k) of the collectives (halfway between chance,
    1 / C(N, k), and always, never below 50 %), of at least MIN_COLLECTIVES; second, each of its
    ranks waited less on average than every rank outside it (a straggler waits least: the others
    wait for it); third, the ranks outside it waited at least MIN_WAIT_MS per collective on
    average. The first k that passes wins. Returns {ranks, k, pct, collectives, others_wait_ms}
    or None. ``summary`` (:func:`straggler_summary` of the same waits) is computed when not given."""
    if waits is None or waits.empty:
        return None
    w = waits[["job_id", "step", "seq", "rank", "arrival_ns", "wait_ms"]]
    if w["job_id"].nunique() != 1:
        raise ValueError("straggler_set takes the waits of one job")
    s = summary if summary is not None else straggler_summary(waits)
    ranks = sorted(int(r) for r in w["rank"].unique())
    n_ranks, mean_wait = len(ranks), s.set_index("rank")["mean_wait_ms"]
    order = w.sort_values(KEY + ["arrival_ns"], ascending=[True, True, True, False])
    groups = [(g["rank"].to_numpy(np.int64), g["arrival_ns"].to_numpy(np.float64))
              for _, g in order.groupby(KEY[1:], sort=False)]
    if len(groups) < MIN_COLLECTIVES:
        return None
    for k in range(2, n_ranks // 2 + 1):
        counts: dict[tuple[int, ...], int] = {}
        for rk, arr in groups:
            last = rk[arr >= arr[k - 1]]
            if len(last) == k:
                key = tuple(sorted(int(r) for r in last))
                counts[key] = counts.get(key, 0) + 1
        if not counts:
            continue
        best = max(counts, key=lambda key: (counts[key], -sum(float(mean_wait[r]) for r in key)))
        pct = 100.0 * counts[best] / len(groups)
        inside, outside = mean_wait[list(best)], mean_wait[~mean_wait.index.isin(best)]
        others = s[~s["rank"].isin(best)]
        others_wait = float(others["wait_ms"].sum() / max(1, others["collectives"].sum()))
        if (pct >= straggler_threshold_pct(n_ranks, k) and float(inside.max()) < float(outside.min())
                and others_wait >= MIN_WAIT_MS):
            return {"ranks": list(best), "k": k, "pct": pct, "collectives": len(groups),
                    "others_wait_ms": others_wait}
    return None


def straggler_threshold_pct(world_size: int, k: int = 1) -> float:
    """Share of last arrivals that makes a rank *the* straggler (``k`` = 1), or a set of ``k``
    ranks the stragglers (:func:`straggler_set`): halfway between chance (100 / C(N, k): 100/N
    for one rank) and always (100 %), never below 50 %. With two ranks one of them is last at
    least half of the time by pure chance, so "≥ 50 %" alone would name a straggler in every
    2-rank job."""
    n = max(1, int(world_size))
    return max(50.0, (100.0 / math.comb(n, max(1, min(int(k), n))) + 100.0) / 2.0)

