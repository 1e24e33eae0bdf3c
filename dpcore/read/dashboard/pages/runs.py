"""Runs page: every run under the profiles folder, then the environment box and the job list of
the picked run(s).

Why the environment box is loud: numbers from an oversubscribed CPU job (more busy threads than
cores) or from a run where a variant was skipped are easy to misread; the warning says so in
plain words next to the numbers instead of in a log nobody reads.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from dpcore.contract import runformat as rf
from dpcore.contract.config import model_size_text
from dpcore.contract.units import EMPTY
from dpcore.read.dashboard import frame
from dpcore.read.dashboard.table_cells import bucket_text, table_height
from dpcore.read.dashboard.text import md
from dpcore.read.rundir.load import Run

RUN_COLS = ["run_id", "created", "status", "model", "size", "variants", "world_sizes", "backend", "device", "kinds"]


def _threads(env: dict) -> str:
    t = env.get("threads_per_rank")
    if isinstance(t, dict):
        return ", ".join(f"{v} at N={k}" for k, v in t.items())
    return NOT_RECORDED if t is None else str(t)


#: What the box says for a value run.json does not hold (an imported run has no model or cores).
NOT_RECORDED = "not recorded"


def known(value: object) -> str:
    """A run.json value as text, or :data:`NOT_RECORDED` (never "None" or "?")."""
    return NOT_RECORDED if value is None or value == "" else str(value)


def devices_text(devices: object, device: object = None) -> str:
    """The run's devices, each name once with its count ("8 × NVIDIA H200", not the name 8
    times), in the order first seen; else the device kind; else :data:`NOT_RECORDED`."""
    if isinstance(devices, list) and devices:
        counts: dict[str, int] = {}
        for d in map(str, devices):
            counts[d] = counts.get(d, 0) + 1
        return ", ".join(f"{n} × {d}" if n > 1 else d for d, n in counts.items())
    return known(devices or device)


def model_text(cfg: dict) -> str:
    """The model and its size (``model_size_text``), or :data:`NOT_RECORDED` (an imported run)."""
    model = cfg.get("model")
    return f"{model} {model_size_text(cfg)}".strip() if model else NOT_RECORDED


def environment_box(run: Run) -> None:
    """Backend, devices, cores and threads per rank; plain warnings for oversubscription and skipped jobs."""
    meta = run.meta if isinstance(run.meta, dict) else {}
    env, cfg = meta.get("environment") or {}, meta.get("config") or {}
    devices = devices_text(env.get("devices"), env.get("device"))
    with st.container(border=True):
        status = "stale" if rf.is_stale(meta) else meta.get("status", "?")
        st.markdown(f"**{md(meta.get('run_id', run.path.name))}** · status **{md(status)}** · "
                    f"created {md(meta.get('created', '?'))}")
        c = st.columns(5)
        # metric values and help tooltips render Markdown: every value here comes from run.json
        c[0].metric("backend", md(known(env.get("backend"))))
        c[1].metric("device", md(known(env.get("device"))), help=md(devices))
        c[2].metric("CPU cores", md(known(env.get("cpu_cores"))),
                    help=f"logical CPUs: {md(known(env.get('logical_cpus')))}")
        c[3].metric("GPUs", md(env.get("gpus", 0)))
        c[4].metric("model", md(model_text(cfg)))
        st.caption(f"Devices: {md(devices)} · threads per rank: {md(_threads(env))} · "
                   f"host {md(known(env.get('host')))} · "
                   f"torch {md(known(env.get('torch')))} · batch/rank {md(known(cfg.get('batch_size')))} · "
                   f"{md(known(cfg.get('scaling')))} scaling · {md(known(cfg.get('steps')))} steps")
        jobs = run.jobs
        over = jobs[jobs["oversubscribed"].fillna(False).astype(bool)] if "oversubscribed" in jobs else jobs.iloc[:0]
        if len(over):
            st.warning(f"**Oversubscribed:** {len(over)} job(s) ran more busy threads than this machine has CPU "
                       f"cores ({md(env.get('cpu_cores', '?'))}): "
                       f"{md(', '.join(map(str, over['job_id'])))}. Their timings "
                       "measure CPU contention, not the algorithm; compare them with care.")
        elif env.get("oversubscribed"):
            st.warning("**Oversubscribed:** this run put more busy threads on the machine than it has CPU cores.")
        for _, j in jobs.iterrows():
            reason = j.get("skip_reason")
            if j.get("status") == "skipped" or (isinstance(reason, str) and reason):
                st.warning(f"**Skipped** {md(j['job_id'])}: {md(reason or 'no reason recorded')}")
            elif j.get("status") in ("failed", "interrupted"):
                st.error(f"**{j['status'].capitalize()}** {md(j['job_id'])}: {md(j.get('error') or 'no error text')}")


def render(runs: pd.DataFrame, loaded: list[Run]) -> None:
    """Table of every run, then the environment box and the job list of the chosen run(s)."""
    st.caption("Every run folder under the profiles directory, newest first. Pick one in the sidebar "
               "(default: the newest complete run with training jobs, else the newest complete run), or switch on "
               "*Compare* to put two runs of the same kind side by side.")
    cols = [c for c in RUN_COLS if c in runs.columns]
    st.dataframe(runs[cols], hide_index=True, width="stretch", height=table_height(len(runs)), placeholder=EMPTY,
                 column_config={"variants": st.column_config.TextColumn("variants", width="large"),
                                "size": st.column_config.TextColumn("size", help="mlp: its --width; transformer: "
                                                                    "its --size (the other knob does not apply)")})
    for run in loaded:
        environment_box(run)
        jobs = run.jobs
        with st.expander(f"Jobs of {md(run.path.name)} ({len(jobs)})"):
            show = [c for c in ["job_id", "kind", "variant", "algo", "world_size", "bucket_mb", "status",
                                "oversubscribed", "skip_reason", "error"] if c in jobs.columns]
            shown = jobs[show].assign(bucket_mb=[bucket_text(v, b) for v, b in zip(jobs["variant"], jobs["bucket_mb"])])
            st.dataframe(shown, hide_index=True, width="stretch", height=table_height(len(shown)), placeholder=EMPTY)


def page() -> None:
    """The page as Streamlit runs it."""
    ctx = frame.context()
    frame.safely(lambda: render(ctx.runs, ctx.loaded), "The run list")


if __name__ == "__main__":
    page()
