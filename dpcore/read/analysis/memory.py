"""Memory per rank against step time, and communication volume per step: the two halves of the
trade that sharded data parallelism (ZeRO-1, FSDP) makes (DataFrames in, DataFrames out).

Memory: memory.csv (one row per (job, rank), written by ``dpcore.write.capture.memory``) joined with the
job's step time from :func:`dpcore.read.analysis.summary.job_summary`, the same numbers
``summarize`` prints, so the Memory view and the CLI never disagree on T.

Communication volume: the ``bytes`` column of collectives.csv is the size of the tensor handed
to the collective: the whole buffer for an all-reduce and a broadcast, the full (gathered,
unsharded) buffer for an all-gather and a reduce-scatter, as nccl-tests counts sizes. What we
compare is **bus bytes** per rank per step = Σ bytes · bus_factor(op, N) with nccl-tests' factors
(``dpcore.contract.bandwidth.bus_factor``: all-reduce 2(N−1)/N, all-gather and reduce-scatter
(N−1)/N, broadcast 1; all 0 at N = 1, no peer): what each rank sends over its link with a
bandwidth-optimal (ring) algorithm, whatever algorithm actually ran. :func:`expected_volume` is the one place the
per-variant formulas live (the CLI, the Memory view and docs/metrics.md's table come from it).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dpcore.contract.bandwidth import bus_factor

KINDS = ["param_bytes", "grad_bytes", "optim_bytes", "other_bytes"]
MEMORY_TABLE_COLUMNS = ["job_id", "variant", "world_size", "bucket_mb", "rank", "device", *KINDS, "held_bytes",
                        "activation_bytes", "peak_bytes", "reserved_bytes", "reserve_bytes", "peak_method", "step_ms",
                        "step_ms_p10", "step_ms_p90"]
JOB_MEMORY_COLUMNS = ["job_id", "variant", "world_size", "bucket_mb", "ranks", *KINDS, "held_bytes",
                      "activation_bytes", "peak_bytes", "reserved_bytes", "reserve_bytes",
                      "peak_bytes_max", "peak_method", "step_ms", "step_ms_p10", "step_ms_p90"]
VOLUME_COLUMNS = ["job_id", "variant", "world_size", "op", "calls_per_step", "bytes_per_step", "bus_bytes_per_step",
                  "expected_bytes_per_step", "expected_bus_bytes_per_step", "param_bytes", "replicated_bytes"]
MIB = float(1 << 20)

#: Variants that all-reduce every gradient once per step (DDP and its from-scratch relatives).
ALLREDUCE_VARIANTS = ("naive", "flat", "central", "ring", "overlap", "bucketed", "torch_ddp")
#: Variants that hold less than the whole model state per rank (P must come from elsewhere).
SHARDED_VARIANTS = ("zero1", "torch_zero1", "fsdp", "torch_fsdp")
#: The formula of each variant's expected bus bytes per rank per step (P = trainable parameter
#: bytes, S = bytes of sharded (≥2-D) parameters, R = bytes of replicated (1-D) ones, N ranks).
VOLUME_FORMULAS: dict[str, str] = {
    **{v: "all-reduce of the gradients: 2(N−1)/N·P" for v in ALLREDUCE_VARIANTS},
    "zero1": "all-reduce of the gradients + all-gather of the updated parameters: 2(N−1)/N·P + (N−1)/N·P "
             "= 3(N−1)/N·P (a broadcast of each rank's updated shard instead: 2(N−1)/N·P + P)",
    "torch_zero1": "DDP's all-reduce + one broadcast per rank of its updated shard (ZeroRedundancyOptimizer): "
                   "2(N−1)/N·P + P",
    "fsdp": "all-gather in forward + all-gather in backward + reduce-scatter of the sharded parameters, "
            "all-reduce of the replicated ones: 3(N−1)/N·S + 2(N−1)/N·R",
    "torch_fsdp": "fully_shard shards every parameter: 2 all-gathers + 1 reduce-scatter = 3(N−1)/N·P",
    **{v: "one process: no collectives" for v in ("single", "manual", "data_parallel")},
}


def expected_volume(variant: str, world_size: int, param_bytes: float,
                    replicated_bytes: float = 0.0, param_return: str = "all_gather") -> list[dict]:
    """Expected collectives of one training step on one rank: ``[{op, bytes, bus_bytes}]``.

    ``bytes`` is what collectives.csv's ``bytes`` column should sum to per step for that op
    (full buffer sizes, see the module docstring); ``bus_bytes`` = bytes · bus_factor(op, N).
    ``param_bytes`` P: bytes of the trainable parameters of the whole (unsharded) model;
    ``replicated_bytes`` R: the part of P that ``fsdp`` keeps replicated (1-D parameters);
    ``param_return``: how ``zero1`` sends the updated shards back, ``all_gather`` or
    ``broadcast`` (one per rank; the issue allows both).
    Unknown variants and one-process ones expect nothing. Formulas: :data:`VOLUME_FORMULAS`.
    """
    n, p, r = int(world_size), float(param_bytes), float(replicated_bytes)
    s = max(p - r, 0.0)
    terms: list[tuple[str, float]]
    if n <= 1:
        terms = []
    elif variant in ALLREDUCE_VARIANTS:
        terms = [("all_reduce", p)]
    elif variant == "zero1":
        terms = [("all_reduce", p), (param_return, p)]
    elif variant == "torch_zero1":
        terms = [("all_reduce", p), ("broadcast", p)]
    elif variant == "fsdp":
        terms = [("all_gather", 2 * s), ("reduce_scatter", s)] + ([("all_reduce", r)] if r > 0 else [])
    elif variant == "torch_fsdp":
        terms = [("all_gather", 2 * p), ("reduce_scatter", p)]
    else:
        terms = []
    return [{"op": op, "bytes": b, "bus_bytes": b * bus_factor(op, n)} for op, b in terms]


def memory_table(memory: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per (job, rank): memory.csv's bytes, ``held_bytes`` (= params + grads + optim + other),
    ``activation_bytes`` and the job's step time T (median, p10, p90) from ``summary`` (:func:`job_summary`).

    ``activation_bytes`` = peak − held (≥ 0) is inferred, not measured: memory.csv has no
    activation column. On a GPU the peak is the allocator's (``cuda_allocator``: everything handed
    out during the step), so what the peak holds beyond the tensors the rank keeps is what the
    step allocates on the way: activations saved for backward and temporaries. Without it a GPU
    rank's breakdown stops at a fifth of its peak.

    ``reserve_bytes`` = reserved − peak (≥ 0): what the CUDA caching allocator held from the driver
    beyond the most it handed out (blocks kept cached, fragmentation), from memory.csv's
    ``reserved_bytes`` (torch.cuda.max_memory_reserved); NaN on CPU and for runs recorded before
    it was (their memory.csv has no such column)."""
    if memory is None or memory.empty:
        return pd.DataFrame(columns=MEMORY_TABLE_COLUMNS)
    m = memory.copy()
    for c in KINDS + ["peak_bytes"]:
        m[c] = pd.to_numeric(m[c], errors="coerce")
    m["held_bytes"] = m[KINDS].sum(axis=1, min_count=1)
    m["activation_bytes"] = (m["peak_bytes"] - m["held_bytes"]).clip(lower=0)
    m["reserved_bytes"] = pd.to_numeric(m["reserved_bytes"], errors="coerce") if "reserved_bytes" in m else float("nan")
    m["reserve_bytes"] = (m["reserved_bytes"] - m["peak_bytes"]).clip(lower=0)
    t = summary[["job_id", "bucket_mb", "step_ms", "step_ms_p10", "step_ms_p90"]] if not summary.empty else \
        pd.DataFrame(columns=["job_id", "bucket_mb", "step_ms", "step_ms_p10", "step_ms_p90"])
    out = m.merge(t, on="job_id", how="left")
    return out[MEMORY_TABLE_COLUMNS].sort_values(["job_id", "rank"]).reset_index(drop=True)


def job_memory(table: pd.DataFrame) -> pd.DataFrame:
    """Per job: bytes per rank, mean over ranks (``peak_bytes_max``: the largest rank's peak)."""
    if table is None or table.empty:
        return pd.DataFrame(columns=JOB_MEMORY_COLUMNS)
    g = table.groupby("job_id", sort=False)
    out = g[KINDS + ["held_bytes", "activation_bytes", "peak_bytes", "reserved_bytes", "reserve_bytes"]].mean()
    out["peak_bytes_max"] = g["peak_bytes"].max()
    out["ranks"] = g["rank"].nunique()
    first = g[["variant", "world_size", "bucket_mb", "peak_method", "step_ms", "step_ms_p10", "step_ms_p90"]].first()
    return out.join(first).reset_index()[JOB_MEMORY_COLUMNS]


def summary_memory_columns(memory: pd.DataFrame) -> pd.DataFrame:
    """``summarize``'s memory columns per job (MiB per rank, mean over ranks): job_id, param_mib,
    grad_mib, optim_mib, peak_mib. Empty when memory.csv has no rows (older runs)."""
    cols = ["job_id", "param_mib", "grad_mib", "optim_mib", "peak_mib"]
    if memory is None or memory.empty:
        return pd.DataFrame(columns=cols)
    m = memory.assign(**{c: pd.to_numeric(memory[c], errors="coerce") / MIB
                         for c in ("param_bytes", "grad_bytes", "optim_bytes", "peak_bytes")})
    out = m.groupby("job_id", sort=False)[["param_bytes", "grad_bytes", "optim_bytes", "peak_bytes"]].mean()
    return out.set_axis(cols[1:], axis=1).reset_index()


def model_bytes(memory: pd.DataFrame, job_id: str, variant: str, world_size: int,
                grads: pd.DataFrame | None = None) -> tuple[float, float]:
    """(P, R) for one job's expected volume: P = trainable parameter bytes of the whole model, R =
    the part ``fsdp`` keeps replicated.

    P is a job's own rank-0 ``param_bytes`` when it holds the whole model (not sharded), else
    that of the run's unsharded jobs (same model in every job of a run), else the sum of the
    job's gradient sizes in grads.csv. R (fsdp only) follows from its rank's holding R + S/N:
    R = (N·param_bytes − P)/(N − 1), clipped to [0, P] (shard padding makes it a slight over-estimate).
    """
    mem = memory if memory is not None else pd.DataFrame(columns=["job_id", "variant", "param_bytes"])
    pb = pd.to_numeric(mem["param_bytes"], errors="coerce") if not mem.empty else pd.Series(dtype=float)
    full = mem[~mem["variant"].isin(SHARDED_VARIANTS)] if not mem.empty else mem
    own = pb[mem["job_id"] == job_id] if not mem.empty else pb
    if variant not in SHARDED_VARIANTS and len(own):
        p = float(own.max())
    elif len(full):
        p = float(pb[full.index].median())
    elif grads is not None and not grads.empty and (grads["job_id"] == job_id).any():
        g = grads[grads["job_id"] == job_id]
        first = g[(g["rank"] == g["rank"].min()) & (g["step"] == g["step"].min())]
        p = float(first.drop_duplicates("param")["bytes"].sum())
    else:
        return np.nan, 0.0
    r = 0.0
    n = int(world_size)
    if variant == "fsdp" and n > 1 and len(own):
        r = float(np.clip((n * float(own.mean()) - p) / (n - 1), 0.0, p))
    return p, r


def comm_volume(collectives: pd.DataFrame, jobs: pd.DataFrame, memory: pd.DataFrame,
                grads: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (job, op): measured bytes and bus bytes per rank per step next to the expected ones.

    Measured = Σ collectives.csv ``bytes`` of the op in a (rank, step), mean over the job's
    (rank, step) pairs that logged any collective (steps ≥ 0: the start-up broadcast of the
    parameters is not a step's). Expected = :func:`expected_volume` with P and R from
    :func:`model_bytes` (``zero1`` judged by the op it returns parameters with: broadcasts when
    it logged broadcasts and no all-gather). An op measured but not expected (or the reverse)
    has 0 on the other side. An op with any collective of unknown bytes (an empty cell) has
    NaN measured bytes: unknown reads as unknown, never as 0.
    """
    if collectives is None or collectives.empty:
        return pd.DataFrame(columns=VOLUME_COLUMNS)
    # an empty bytes cell is unknown (an imported trace without collective metadata), not 0 bytes
    c = collectives.assign(bytes=pd.to_numeric(collectives["bytes"], errors="coerce"))
    c = c[pd.to_numeric(c["step"], errors="coerce") >= 0]
    info = jobs.drop_duplicates("job_id").set_index("job_id") if jobs is not None and not jobs.empty else None
    rows = []
    for job_id, g in c.groupby("job_id", sort=False):
        known = info is not None and job_id in info.index
        variant = str(info.at[job_id, "variant"]) if known and info is not None else ""
        ws = pd.to_numeric(pd.Series([info.at[job_id, "world_size"] if known and info is not None else None]),
                           errors="coerce").iloc[0]
        n = int(ws) if np.isfinite(ws) and ws >= 1 else int(g["rank"].nunique())
        pairs = g[["rank", "step"]].drop_duplicates().shape[0]
        measured = g.groupby("op").agg(calls=("bytes", "size"),
                                       nbytes=("bytes", lambda b: b.sum(min_count=len(b))))  # NaN if any unknown
        p, r = model_bytes(memory, job_id, variant, n, grads)
        ret = "broadcast" if "broadcast" in measured.index and "all_gather" not in measured.index else "all_gather"
        expected = {t["op"]: t for t in expected_volume(variant, n, p, r, ret)} if np.isfinite(p) else {}
        for op in list(measured.index) + [o for o in expected if o not in measured.index]:
            got = measured.loc[op] if op in measured.index else None
            nb = float(got["nbytes"]) / pairs if got is not None else 0.0
            exp = expected.get(op)
            rows.append({"job_id": job_id, "variant": variant, "world_size": n, "op": op,
                         "calls_per_step": float(got["calls"]) / pairs if got is not None else 0.0,
                         "bytes_per_step": nb, "bus_bytes_per_step": nb * bus_factor(op, n),
                         "expected_bytes_per_step": exp["bytes"] if exp else (0.0 if expected else np.nan),
                         "expected_bus_bytes_per_step": exp["bus_bytes"] if exp else (0.0 if expected else np.nan),
                         "param_bytes": p, "replicated_bytes": r})
    return pd.DataFrame(rows, columns=VOLUME_COLUMNS)


def volume_totals(volume: pd.DataFrame) -> pd.DataFrame:
    """Per job: Σ over ops of measured and expected bus bytes per rank per step, and their ratio."""
    cols = ["job_id", "variant", "world_size", "bus_bytes_per_step", "expected_bus_bytes_per_step", "ratio"]
    if volume is None or volume.empty:
        return pd.DataFrame(columns=cols)
    out = volume.groupby(["job_id", "variant", "world_size"], sort=False)[
        ["bus_bytes_per_step", "expected_bus_bytes_per_step"]].sum(min_count=1).reset_index()
    exp = out["expected_bus_bytes_per_step"]
    out["ratio"] = (out["bus_bytes_per_step"] / exp).where(exp > 0)
    return out[cols]


def summary_volume_columns(collectives: pd.DataFrame, jobs: pd.DataFrame, memory: pd.DataFrame,
                           grads: pd.DataFrame | None = None) -> pd.DataFrame:
    """``summarize``'s volume columns per job: job_id, bus_mib_per_step (measured) and
    expected_bus_mib_per_step (:func:`expected_volume`), per rank. Empty without collectives."""
    t = volume_totals(comm_volume(collectives, jobs, memory, grads))
    if t.empty:
        return pd.DataFrame(columns=["job_id", "bus_mib_per_step", "expected_bus_mib_per_step"])
    return pd.DataFrame({"job_id": t["job_id"], "bus_mib_per_step": t["bus_bytes_per_step"] / MIB,
                         "expected_bus_mib_per_step": t["expected_bus_bytes_per_step"] / MIB})
