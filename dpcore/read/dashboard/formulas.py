"""Metric formulas exactly as docs/DESIGN.md defines them, shown beside every number in the app.

Why one table: the CLI, the docs and the app must explain a number the same way; keeping the
wording here makes the help texts consistent across pages.
"""
from __future__ import annotations

FORMULAS: dict[str, str] = {
    "step_ms": "Step time T: wall time from the step's start to the optimizer step's end "
               "(CUDA events on GPU, perf_counter on CPU). Median over timed steps and ranks.",
    "compute_ms": "Compute: forward + backward + optimizer work of the main thread, minus the time it spent inside "
                  "communication calls (launching a collective, a blocking one, waiting) on CPU; compute kernels "
                  "on GPU. Ms of T: T × compute's share of the traced steps.",
    "comm_ms": "Comm time C = |union of the rank's collective intervals in the step|; none at world size 1 "
               "(no peer: a collective moves nothing).",
    "overlapped_ms": "Overlapped comm = |comm ∩ compute|: communication hidden under compute.",
    "exposed_ms": "Exposed comm E = |comm \\ compute|: communication the step waits for.",
    "other_ms": "Other = T − compute − E ≥ 0: time in communication calls under which no communication ran, "
                "idle, Python outside the phases (and at world size 1 the collectives' own calls).",
    "overlap_pct": "Overlap % = |comm ∩ compute| / |comm| (Holistic Trace Analysis), per rank per step.",
    "comm_fraction": "Comm fraction = E / T: what communication costs the step (Σ E / Σ T over the traced "
                     "steps, mean over ranks; never above 1).",
    "comm_ops": "Collective calls per step per rank.",
    "comm_bytes": "Bytes all-reduced per step per rank.",
    "throughput": "Throughput = global samples per step / T (samples/s).",
    "speedup_weak": "Weak scaling (fixed batch per rank): S(N) = N·T(1)/T(N).",
    "efficiency_weak": "Weak scaling efficiency = T(1)/T(N).",
    "speedup_strong": "Strong scaling (fixed global batch): S(N) = T(1)/T(N).",
    "efficiency_strong": "Strong scaling efficiency = S(N)/N.",
    "algbw": "algbw = bytes / t (t = median time of one all-reduce).",
    "busbw": "busbw = algbw · 2(N−1)/N for all-reduce (nccl-tests); (N−1)/N for reduce-scatter "
             "and all-gather; 1 for broadcast.",
    "comm_source": "Where compute, comm, exposed comm and overlap come from: 'trace' = the torch.profiler trace "
                   "of the traced steps (gloo spans / NCCL kernels); 'intervals' = the recorded collectives "
                   "(collectives.csv) against the step's phases minus the recorded communication calls "
                   "(comm_calls.csv), used when the trace misses communication the recording saw. Both apply "
                   "the same definitions; the gap says how far apart they are on the same steps.",
    "ring_wait": "For each ring step: transfer = the shortest matching send→recv time across ranks; wait = the rest.",
}

BREAKDOWN_CAPTION = (
    "Each bar is one step (median T) of one job, split by each part's share of the traced steps, so the "
    "parts add up to T: "
    "compute with no communication in flight, communication **hidden** under compute (overlapped), "
    "communication the step **waits** for (exposed, E = |comm \\ compute|), and other time. "
    "Blocking variants (`naive`, `flat`, `central`, `ring`) wait for all their communication after backward; "
    "`overlap`, `bucketed` and `torch_ddp` start all-reduces from gradient hooks during backward, "
    "so they can hide it under the rest of backward: how much depends on how early the first "
    "bucket is ready (one bucket holding every gradient hides almost nothing)."
)


def scaling_caption(mode: str) -> str:
    """Caption for the Scaling page in the run's own scaling mode (weak or strong)."""
    return (f"This run used **{mode} scaling**. {FORMULAS['speedup_' + mode]} {FORMULAS['efficiency_' + mode]} "
            "The dashed line is perfect scaling. Points drawn as × were oversubscribed: more busy threads than "
            "CPU cores, so their slowdown comes from the machine, not from the algorithm.")
