"""Scaling page: what adding ranks buys, in the run's own scaling mode (weak or strong).

Why the resources sentence and the noisy warning beside the chart: an efficiency is only as good
as the machine under it; threads per rank, pinning and oversubscription decide whether T(1) and
T(N) differ by what data parallelism adds or by what the machine took away. Numbers come from
`dpcore.read.analysis.scaling` (on `job_summary`), the figure from `dpcore.read.plots.scaling`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read import analysis
from dpcore.read.analysis.summary import shared_gpu_line
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.columns import NUM, SUMMARY_CONFIG
from dpcore.read.dashboard.formulas import FORMULAS, scaling_caption
from dpcore.read.dashboard.table_cells import bucket_text, table_height
from dpcore.read.dashboard.text import md
from dpcore.read.plots.scaling import scaling_figure, shared_ranges
from dpcore.read.rundir.load import Run

INTRO = "What adding ranks buys: step time, throughput, speedup and efficiency against world size."


@st.cache_data(show_spinner=False, max_entries=16)
def scaling(_run: Run, run_key: tuple, mode: str) -> pd.DataFrame:
    """`scaling` of the run's job summary in ``mode``; the run's own bucket size is the default
    cell of bucketed variants."""
    bucket = (_run.meta.get("config") or {}).get("bucket_mb")
    bucket = bucket if isinstance(bucket, (int, float)) else None  # foreign run.json: ignore
    return analysis.scaling(data.cached_summary(_run, run_key), mode, default_bucket=bucket)


@st.cache_data(show_spinner=False, max_entries=16)
def scaling_chart(_run: Run, run_key: tuple, mode: str, ranges: tuple = ()) -> go.Figure:
    """The four panels (``ranges``: shared y-ranges in compare mode)."""
    return scaling_figure(scaling(_run, run_key, mode), mode, ranges=ranges)


NOTHING_TO_SCALE = ("Every job of this run ran at world size {n}: there is nothing to scale. Speedup and "
                    "efficiency compare a variant's step time at two or more world sizes; profile with "
                    "`--world-sizes 1,2,...` (one GPU per rank on NCCL) to see them. The step times are on Overview.")


def on_gpu(meta: dict) -> bool:
    """Whether the run's ranks trained on GPUs (run.json's environment says ``cuda``)."""
    env = meta.get("environment") if isinstance(meta, dict) else None
    env = env if isinstance(env, dict) else {}
    return str(env.get("device") or "").startswith("cuda")


def measured_how(meta: dict) -> str:
    """One sentence on the resources behind T(1) and T(N): threads per rank and core pinning.

    Empty on a GPU run: there the step runs on the devices, and threads and pinning only feed the
    launching thread, so the sentence would explain the wrong resource."""
    env = meta.get("environment") if isinstance(meta, dict) else None
    env = env if isinstance(env, dict) else {}
    if on_gpu(meta):
        return ""
    tpr = env.get("threads_per_rank")
    if isinstance(tpr, dict):  # runs written before the equal-threads policy: one value per world size
        vals = sorted({str(v) for v in tpr.values()})
        if len(vals) > 1:
            return ("Caution: this run gave ranks of different world sizes different thread counts "
                    f"({md(', '.join(f'N={k}: {v}' for k, v in tpr.items()))}), so efficiency mixes the cost of "
                    "communication with the loss of threads.")
        tpr = vals[0] if vals else None
    if tpr is None:
        return ""
    pin = env.get("pinning")
    pinned = (" each rank pinned to its own cores" if pin == "per-rank"
              else " ranks not pinned to cores" if pin else "")
    return (f"Every job ran with {md(tpr)} thread(s) per rank{',' if pinned else ''}{pinned}, "
            "so T(1) and T(N) differ only by what data parallelism adds.")


def _scaling_mode(run: Run) -> str:
    cfg = run.meta.get("config") or {} if isinstance(run.meta, dict) else {}
    mode = str(cfg.get("scaling") or "weak").lower()
    return mode if mode in ("weak", "strong") else "weak"


def render(run: Run, peers: list[Run] | None = None) -> None:
    """Step time, throughput, speedup and efficiency against world size, in the run's scaling mode.
    ``peers``: the runs shown together in compare mode; their panels then share y-axes."""
    mode = _scaling_mode(run)
    key = data.key(run)
    df = scaling(run, key, mode)
    shared = shared_gpu_line(data.cached_summary(run, key))
    own = df[~df["gpus_shared"].astype(bool)] if "gpus_shared" in df else df
    sizes = sorted(set(pd.to_numeric(df["world_size"], errors="coerce").dropna().astype(int)))
    real = sorted(set(pd.to_numeric(own["world_size"], errors="coerce").dropna().astype(int)))
    if len(sizes) == 1:
        st.info(NOTHING_TO_SCALE.format(n=sizes[0]))
        return
    if shared:  # one line, above the chart: its speedups would otherwise read as scaling
        st.warning(md(shared[0].upper() + shared[1:]) + "." + (
            "" if len(real) > 1 else f" Without them every job ran at world size {real[0]}: there is nothing "
            "to scale." if real else ""))
    ranges = shared_ranges([scaling(r, data.key(r), _scaling_mode(r)) for r in peers]) \
        if peers and len(peers) > 1 else ()
    st.plotly_chart(scaling_chart(run, key, mode, ranges), key=f"sc-{run.path}")
    st.caption(scaling_caption(mode) + " " + measured_how(run.meta))
    if not df.empty:
        _noise_warning(df)
        cfg_cols = {"variant": st.column_config.TextColumn("variant"), "world_size": NUM("N", format="%d"),
                    "step_ms": SUMMARY_CONFIG["step_ms"], "step_ms_p10": SUMMARY_CONFIG["step_ms_p10"],
                    "step_ms_p90": SUMMARY_CONFIG["step_ms_p90"], "throughput": SUMMARY_CONFIG["throughput"],
                    "speedup": NUM("S(N)", help=FORMULAS["speedup_" + mode], format="%.2f"),
                    "ideal_speedup": NUM("ideal S(N)", format="%.0f"),
                    "efficiency": NUM("efficiency", help=FORMULAS["efficiency_" + mode], format="%.1f%%"),
                    "oversubscribed": st.column_config.CheckboxColumn("oversub.", help="More busy threads than "
                                                                      "CPU cores: timings measure contention."),
                    "noisy": SUMMARY_CONFIG["noisy"],
                    "suspect": st.column_config.TextColumn("suspect", help="Why S(N) and efficiency may be off "
                                                           "even where this cell is steady: its T(1) is noisy, "
                                                           "efficiency is above 100% on one host, or its ranks "
                                                           "shared a GPU (then it is no scaling point)."),
                    "gpus_shared": st.column_config.CheckboxColumn("GPU shared", help="More ranks than GPUs "
                                                                   "(run.json gpus_shared): the ranks took turns "
                                                                   "on one GPU, so this is no scaling point."),
                    "bucket_mb": SUMMARY_CONFIG["bucket_mb"]}
        shown = df.assign(bucket_mb=[bucket_text(v, b) for v, b in zip(df["variant"], df["bucket_mb"])],
                          efficiency=100 * df["efficiency"])
        keep = [c for c in cfg_cols if c in shown.columns and (c != "gpus_shared" or bool(shown[c].any()))]
        st.dataframe(shown[keep], hide_index=True, column_config=cfg_cols,
                     width="stretch", placeholder=EMPTY, height=table_height(len(shown)))


def _noise_warning(df: pd.DataFrame) -> None:
    """Say which cells are noisy (their own spread: the flag Overview shows for the same job) and,
    apart, which speedups rest on a noisy T(1) or came out superlinear."""
    def cells(mask: pd.Series) -> str:
        return ", ".join(f"{v} ×{n}" for v, n in zip(df.loc[mask, "variant"], df.loc[mask, "world_size"]))

    parts = []
    if df["noisy"].any():
        parts.append(f"Noisy measurements: {md(cells(df['noisy']))}: their step times spread more than 1.5× "
                     "between p10 and p90 (the same flag as on Overview).")
    suspect = (df["suspect"].fillna("").astype(str) != "") & ~df.get("gpus_shared", False)
    if suspect.any():
        why = "; ".join(f"{v} ×{n}: {md(w)}" for v, n, w in
                        zip(df.loc[suspect, "variant"], df.loc[suspect, "world_size"], df.loc[suspect, "suspect"]))
        parts.append(f"Speedup and efficiency in doubt: {why} (a noisy T(1) moves every ratio built on it; above "
                     "100% on one host is noise).")
    if parts:
        st.warning(" ".join(parts) + " Another process probably competed for the cores: re-run on an idle "
                   "machine before trusting them.")


def page() -> None:
    """The page as Streamlit runs it (in compare mode both runs' panels share y-axes)."""
    ctx = frame.context()
    st.caption(INTRO)
    frame.each_run(lambda run: render(run, peers=ctx.loaded))


if __name__ == "__main__":
    page()
