"""Memory page: memory per rank against step time for every variant, and the bytes each variant
moves per step next to what its algorithm should move.

Why one page for both: sharded data parallelism (ZeRO-1, FSDP) buys memory with communication;
a user deciding between DDP and FSDP needs both halves side by side. Numbers come from
`dpcore.read.analysis.memory` (step time from `job_summary`, the numbers `summarize` prints),
figures from `dpcore.read.plots.memory`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read.analysis.memory import MIB, VOLUME_FORMULAS, comm_volume, job_memory, memory_table, volume_totals
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.formulas import FORMULAS
from dpcore.read.plots.memory import memory_breakdown_figure, memory_tradeoff_figure, volume_figure
from dpcore.read.plots.style import variant_rank
from dpcore.read.rundir.load import Run

INTRO = "Memory per rank against step time for every variant, and the bytes each one moves per step."

NUM = st.column_config.NumberColumn
HELD = ("held = parameters + gradients + optimizer state + other, each tensor storage counted once "
        "(tied weights, views into one bucket buffer); a storage in two kinds counts in the first.")
PEAK = {"cuda_allocator": "peak = torch.cuda.max_memory_allocated over one step (everything the allocator "
                          "handed out, activations and temporaries included)",
        "tensor_storage+saved_activations": "peak = the largest of four samples in one step (after forward, "
                                            "backward, gradient sync, optimizer step) of the held tensors' "
                                            "storages, plus after forward the activations saved for backward; "
                                            "temporaries inside an operator are not seen (a lower bound)",
        "tensor_storage": "peak = the largest of four samples in one step of the held tensors' storages "
                          "(activations not counted; a lower bound)"}
INFERRED = ("Activations + temporaries (hatched) = peak − held: inferred, since memory.csv records no "
            "activation column; it is what the step allocates beyond the tensors the rank keeps.")
RESERVE = ("The CUDA caching allocator's reserve (memory it keeps cached beyond what it handed out, "
           "torch.cuda.max_memory_reserved) was not recorded in this run's memory.csv (runs before dpcore "
           "recorded it), so it is not shown: nvidia-smi reports the peak plus that reserve plus the CUDA context.")
RESERVE_SHOWN = ("Allocator reserve (dotted) = reserved − peak, measured: torch.cuda.max_memory_reserved over the "
                 "same step, what the CUDA caching allocator held from the driver beyond the most it handed out "
                 "(blocks kept cached for reuse, fragmentation). nvidia-smi adds the CUDA context to peak + reserve.")
MEMORY_CONFIG = {
    "world_size": NUM("N", format="%d"),
    "ranks": NUM("ranks", format="%d"),
    "param_mib": NUM("params (MiB)", help="Parameter bytes this rank holds (its shard when sharded).", format="%.3f"),
    "grad_mib": NUM("grads (MiB)", help="Gradient bytes this rank holds after the gradient sync.", format="%.3f"),
    "optim_mib": NUM("optimizer (MiB)", help="Optimizer state this rank keeps (Adam: 2 × its parameters).",
                     format="%.3f"),
    "other_mib": NUM("other (MiB)", help="Communication buffers and gathered copies the variant reports.",
                     format="%.3f"),
    "held_mib": NUM("held (MiB)", help=HELD, format="%.3f"),
    "activation_mib": NUM("activations + temp. (MiB)", help="Inferred, not measured: peak − held, what the step "
                          "allocates beyond the tensors the rank keeps (activations saved for backward, "
                          "temporaries).", format="%.3f"),
    "peak_mib": NUM("peak (MiB)", help="Peak per rank, mean over ranks; see 'peak method'.", format="%.3f"),
    "peak_max_mib": NUM("peak, max rank (MiB)", format="%.3f"),
    "reserve_mib": NUM("allocator reserve (MiB)", help="torch.cuda.max_memory_reserved − peak over the measured "
                       "step: cached by the CUDA allocator, not handed out. Empty on CPU and in older runs.",
                       format="%.3f"),
    "step_ms": NUM("step T (ms)", help=FORMULAS["step_ms"], format="%.2f"),
}
VOLUME_CONFIG = {
    "world_size": NUM("N", format="%d"),
    "calls_per_step": NUM("calls / step", format="%.1f"),
    "mib_per_step": NUM("handed MiB / step", help="Σ collectives.csv bytes per rank per step: the size of "
                                                   "the tensor handed to the collective.", format="%.3f"),
    "bus_mib_per_step": NUM("bus MiB / step", help="handed bytes · bus factor (2(N−1)/N all-reduce, (N−1)/N "
                                                   "all-gather / reduce-scatter, 1 broadcast; 0 for every op "
                                                   "at N = 1: no peer).", format="%.3f"),
    "expected_bus_mib_per_step": NUM("expected bus MiB / step", format="%.3f"),
    "param_mib": NUM("P (MiB)", help="Trainable parameter bytes of the whole model.", format="%.3f"),
}


@st.cache_data(show_spinner=False, max_entries=16)
def tables(_run: Run, run_key: tuple) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per (job, rank), per job, comm volume per (job, op)) of the run (cached per file stamp)."""
    table = memory_table(_run.memory, data.cached_summary(_run, run_key))
    return table, job_memory(table), comm_volume(_run.collectives, _run.jobs, _run.memory, _run.grads)


@st.cache_data(show_spinner=False, max_entries=16)
def charts(_run: Run, run_key: tuple) -> tuple[go.Figure, go.Figure, go.Figure]:
    """The trade (scatter), what each rank holds (bars), bytes moved against expected."""
    table, jobs, volume = tables(_run, run_key)
    return (memory_tradeoff_figure(jobs, "Memory per rank against step time: the trade"),
            memory_breakdown_figure(table, "What each rank holds"),
            volume_figure(volume, "Bytes moved per rank per step: measured vs expected"))


def _mib(df: pd.DataFrame, cols: dict[str, str]) -> pd.DataFrame:
    return df.assign(**{new: pd.to_numeric(df[old], errors="coerce") / MIB for old, new in cols.items()})


def _reserve_text(table: pd.DataFrame, methods: list[str]) -> str:
    """The caption's line on the allocator's reserve: what it shows where recorded, why not where not."""
    if "cuda_allocator" not in methods:
        return ""
    return f" {RESERVE_SHOWN}" if table["reserve_bytes"].notna().any() else f" {RESERVE}"


def render(run: Run) -> None:
    """The trade (scatter), the breakdown per rank (stacked bars), the per-job table, and the
    communication volume against the expected formulas, each with its formula beside it."""
    key = data.key(run)
    table, jobs, volume = tables(run, key)
    trade, breakdown, vol = charts(run, key)
    if table.empty:
        st.info("This run has no memory.csv rows (recorded since dpcore measured memory per rank; "
                "older runs and all-reduce benchmarks lack it).")
    else:
        left, right = st.columns(2)
        with left:
            st.plotly_chart(trade, key=f"mem-trade-{run.path}")
        with right:
            st.plotly_chart(breakdown, key=f"mem-bars-{run.path}")
        shown = _mib(jobs, {"param_bytes": "param_mib", "grad_bytes": "grad_mib", "optim_bytes": "optim_mib",
                            "other_bytes": "other_mib", "held_bytes": "held_mib",
                            "activation_bytes": "activation_mib", "peak_bytes": "peak_mib",
                            "peak_bytes_max": "peak_max_mib", "reserve_bytes": "reserve_mib"})
        shown = shown.assign(_o=variant_rank(shown["variant"])).sort_values(["_o", "world_size", "job_id"])
        st.dataframe(shown[["job_id", "variant", "world_size", "ranks", "param_mib", "grad_mib", "optim_mib",
                            "other_mib", "held_mib", "activation_mib", "peak_mib", "peak_max_mib", "reserve_mib",
                            "step_ms", "peak_method"]],
                     hide_index=True, width="stretch", column_config=MEMORY_CONFIG, placeholder=EMPTY)
        methods = [m for m in dict.fromkeys(table["peak_method"].dropna().astype(str)) if m in PEAK]
        st.caption(f"MiB = 2^20 bytes, per rank (mean over ranks). {HELD} "
                   + " ".join(f"{PEAK[m].capitalize()} ({m})." for m in methods)
                   + f" {INFERRED}" + _reserve_text(table, methods)
                   + f" {FORMULAS['step_ms']}")
    st.subheader("Communication volume per step")
    st.plotly_chart(vol, key=f"mem-vol-{run.path}")
    if volume.empty:
        return
    totals = volume_totals(volume)
    shown = _mib(volume, {"bytes_per_step": "mib_per_step", "bus_bytes_per_step": "bus_mib_per_step",
                          "expected_bus_bytes_per_step": "expected_bus_mib_per_step", "param_bytes": "param_mib"})
    st.dataframe(shown[["job_id", "variant", "world_size", "op", "calls_per_step", "mib_per_step",
                        "bus_mib_per_step", "expected_bus_mib_per_step", "param_mib"]],
                 hide_index=True, width="stretch", column_config=VOLUME_CONFIG, placeholder=EMPTY)
    variants = [v for v in dict.fromkeys(totals["variant"].astype(str)) if v in VOLUME_FORMULAS]
    st.caption("Bus bytes per rank per step = Σ bytes · bus factor of each collective (nccl-tests: "
               f"{FORMULAS['busbw']}); `bytes` is the size of the tensor handed to the collective (the full, "
               "gathered buffer for all-gather and reduce-scatter). Expected, with P = trainable parameter "
               "bytes, N ranks: " + "; ".join(f"**{v}**: {VOLUME_FORMULAS[v]}" for v in variants) + ". At N = 1 a "
               "rank has no peer: its collectives (a ZeRO-1 job's broadcasts too) hand over bytes that cross no "
               "link, so every bus factor is 0 there.")


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
