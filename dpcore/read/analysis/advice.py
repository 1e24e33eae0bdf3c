"""What to do about an idle GPU, by its cause: the recommendation of the ``gpu`` command and the
GPU page (both call :func:`advice`).

Why a table by cause. The GPU time ledger charges each host gap (the GPU idle because the CPU had
not launched the next kernel yet) to the outermost CPU op the launching thread was in
(``top_idle_cause``). "Launch overhead: CUDA graphs or torch.compile" is the remedy only when the
CPU was busy launching many small kernels; a host gap inside ``gloo:all_reduce`` is gloo reducing
CUDA tensors on the CPU (NCCL with a GPU per rank is the remedy), one inside the DataLoader is the
step waiting for its batch, ``aten::item`` is the CPU waiting for the GPU, ``aten::to`` a copy from
pageable memory, the optimizer a loop of small per-parameter kernels. Each of those has its own
remedy and its own reason, declared below in :data:`HOST_REMEDIES` (first match wins; the
:data:`LAUNCH_REMEDY` where none matches). Device idle (work was queued, the GPU still idled)
has no CPU op to blame; :data:`DEVICE_REMEDIES` maps what the window shows to a remedy.

Pure Python on one ledger row (:data:`~dpcore.read.analysis.gpu_time.LEDGER_COLUMNS`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Remedy:
    """One cause and what to do about it. ``pattern``: a regular expression (case-insensitive)
    searched in the cause's name (the CPU op's name; for :data:`DEVICE_REMEDIES` the ledger
    column whose share names the cause); ``what``: the cause in words; ``remedy``: what to
    change; ``reason``: why that helps, i.e. what the GPU was waiting for."""

    pattern: str
    what: str
    remedy: str
    reason: str

    def matches(self, cause: str) -> bool:
        """Whether ``cause`` (a CPU op's name) is this remedy's cause."""
        return bool(self.pattern) and re.search(self.pattern, cause, re.IGNORECASE) is not None


#: Host-idle causes (the outermost CPU op over the gap) to remedies, in the order they are tried.
HOST_REMEDIES: tuple[Remedy, ...] = (
    Remedy(r"^gloo:|ProcessGroupGloo", "a host-side collective (gloo)",
           "NCCL with one GPU per rank (init_process_group(\"nccl\"))",
           "gloo runs the collective on the CPU: it copies the CUDA tensors to the host, reduces there and "
           "copies back while the GPU waits; NCCL reduces on the GPUs, and DDP overlaps it with backward"),
    Remedy(r"^(nccl|c10d::|record_param_comms)|\bbarrier\b",
           "a collective the CPU waited in",
           "asynchronous collectives (async_op=True, or DDP's bucketed overlap), and `dpcore stragglers` "
           "to find the rank that arrives late",
           "the launching thread blocked until its peers arrived, so nothing was queued for the GPU meanwhile"),
    Remedy(r"dataloader|DataLoaderIter", "the data loader",
           "DataLoader(num_workers=N, pin_memory=True, persistent_workers=True)",
           "the step waited for its next batch: loading and collating ran in the training process"),
    Remedy(r"^aten::(item|_local_scalar_dense|nonzero|is_nonzero|equal)$|synchroniz",
           "a host-device synchronisation",
           "keeping values on the GPU inside the step: no .item(), .cpu(), print or bool(tensor) per step "
           "(log every N steps)",
           "the CPU waited for the GPU to hand back a value, so the launch queue ran dry behind it"),
    Remedy(r"^aten::(to|_to_copy|copy_)$|memcpy", "a host-device copy",
           "pinned host memory and non_blocking=True copies (pin_memory=True in the DataLoader), or moving "
           "the data to the GPU once, before the loop",
           "a copy from pageable host memory is synchronous: the CPU waits for it before it launches anything "
           "else"),
    Remedy(r"optimizer|zero_grad|_foreach_", "the optimizer",
           "a fused or foreach optimizer (e.g. torch.optim.AdamW(..., fused=True)), zero_grad(set_to_none=True), "
           "or torch.compile of the optimizer step",
           "a per-parameter optimizer launches a few small kernels for every tensor: the CPU's launch rate, not "
           "the GPU, sets its pace"),
)
#: Where no cause above matches: Python between operators, the model's own ops, a user range.
LAUNCH_REMEDY = Remedy("", "launch overhead",
                       "fewer, larger kernels (a larger batch, fused ops), CUDA graphs or "
                       "torch.compile(mode=\"reduce-overhead\")",
                       "the CPU launches many small kernels more slowly than the GPU runs them")
#: Device idle (queued work, an idle GPU) by what the window shows: the ledger column whose share
#: of the span names the cause, tried in order, each above :data:`DEVICE_SHARE`.
DEVICE_REMEDIES: tuple[Remedy, ...] = (
    Remedy("idle_device_ms", "a dependency",
           "fewer cross-stream waits (events between streams, a synchronous memcpy on another stream) and a "
           "look at the Timeline for what the kernels after each gap waited on",
           "the kernels were launched in time but could not start: a stream waited on another or on an event"),
)
#: A window's host idle is blamed on its top cause when the window is host-bound or that one
#: cause alone idles the GPU this share of the span (below it the cause is noise to act on).
CAUSE_SHARE = 0.25
#: Device idle above this share of the span gets :data:`DEVICE_REMEDIES`' remedy.
DEVICE_SHARE = 0.25


def remedy_for(cause: str) -> Remedy:
    """The :data:`HOST_REMEDIES` entry of a host-idle cause (a CPU op's name), else
    :data:`LAUNCH_REMEDY`."""
    return next((r for r in HOST_REMEDIES if r.matches(cause)), LAUNCH_REMEDY)


def advice(row: pd.Series | dict) -> str:
    """One recommendation for a GPU ledger row, by the cause of its idle, or "" where none is clear.

    Host-bound (host idle over half the window), or one cause idling the GPU at least
    CAUSE_SHARE of it: the top cause's remedy and reason (:func:`remedy_for`). Else device idle
    above DEVICE_SHARE: :data:`DEVICE_REMEDIES`. Else ""."""
    span = float(row["span_ms"])
    if not span > 0:
        return ""
    cause, cause_ms = str(row.get("top_idle_cause") or ""), float(row.get("top_idle_cause_ms") or 0.0)
    host_ms = float(row["idle_host_ms"])
    if bool(row["host_bound"]) or (cause and cause_ms >= CAUSE_SHARE * span):
        r = remedy_for(cause)
        lead = (f"host-bound: the GPU waited {host_ms:.3g} ms ({100 * host_ms / span:.0f} % of the span) for the CPU"
                if bool(row["host_bound"]) else
                f"the GPU waited {cause_ms:.3g} ms ({100 * cause_ms / span:.0f} % of the span) for the CPU")
        named = f"; the top cause is {cause} ({cause_ms:.3g} ms), {r.what}" if cause else f"; {r.what}"
        return f"{lead}{named}: {r.remedy}. Why: {r.reason}."
    for r in DEVICE_REMEDIES:
        ms = float(row.get(r.pattern) or 0.0)
        if ms > DEVICE_SHARE * span:
            return (f"the GPU idles {ms:.3g} ms ({100 * ms / span:.0f} % of the span) with work already queued "
                    f"({r.what}): {r.remedy}. Why: {r.reason}.")
    return ""
