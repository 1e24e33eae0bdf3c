"""Run picker (sidebar), the Runs view and the environment box.

Why the environment box is loud: numbers from an oversubscribed CPU job (more busy threads than
cores) or from a run where a variant was skipped are easy to misread; the warning says so in
plain words next to the numbers instead of in a log nobody reads.

Why runs are picked by folder, not run id: run ids come from run.json, and a copied run
(``cp -r``) keeps its id; the folder name is unique under the profiles folder. Everything from
a run that lands in Markdown goes through :func:`~dpcore.read.dashboard.text.md`.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dpcore.contract import runformat as rf

from dpcore.contract.units import EMPTY
from dpcore.read.dashboard.tables import bucket_text, table_height
from dpcore.read.dashboard.text import md

RUN_COLS = ["run_id", "created", "status", "model", "size", "variants", "world_sizes", "backend", "device", "kinds"]


#: What kind of job each view draws; a run without one is pointed to a run that has it.
VIEW_NEEDS = {"Overview": "train", "Timeline": "train", "Scaling": "train", "Buckets": "train",
              "Traces": "train", "Ring messages": None, "Bandwidth": "allreduce"}


def _has_kind(runs: pd.DataFrame, kind: str) -> pd.Series:
    return runs["kinds"].fillna("").astype(str).str.split(",").apply(lambda ks: kind in ks)


def folders(runs: pd.DataFrame) -> list[str]:
    """The folder name of each run (unique under the profiles folder): the picker's keys."""
    return [Path(str(p)).name for p in runs["path"]]


def default_run(runs: pd.DataFrame) -> str:
    """Folder of the newest complete run with training jobs (the views most people open
    first), else of the newest complete run, else of the newest of any status."""
    runs = runs.assign(_folder=folders(runs))
    done = runs[runs["status"] == "complete"]
    train = done[_has_kind(done, "train")]
    pick = train if not train.empty else done if not done.empty else runs
    return str(pick["_folder"].iloc[0])


def run_with(runs: pd.DataFrame, view: str, folder: str) -> str | None:
    """For a view the chosen run (by folder) has no data for, the newest run's folder that has it (else None)."""
    kind = VIEW_NEEDS.get(view)
    if kind is None:
        return None
    have = runs.assign(_folder=folders(runs))
    have = have[_has_kind(have, kind)]
    if have.empty or folder in set(have["_folder"]):
        return None
    return str(have["_folder"].iloc[0])


def offer_other_run(runs: pd.DataFrame, view: str, folder: str) -> None:
    """Say plainly that this run has nothing for the view, with a one-click switch."""
    other = run_with(runs, view, folder)
    if other is None:
        return
    kind = "all-reduce benchmark" if VIEW_NEEDS[view] == "allreduce" else "training jobs"
    st.info(f"Run {md(folder)} has no {kind}; {md(other)} has.")
    if st.button(f"Open {md(other)}", key=f"open-{view}-{other}"):
        st.session_state["open_run_keep_view"] = other
        st.rerun()


#: How much each shared property counts when choosing the run to compare with: the same kind of
#: jobs first (a training run against an all-reduce benchmark compares nothing), then the model.
LIKENESS = {"kinds": 8, "model": 4, "size": 2, "backend": 1, "world_sizes": 1, "variants": 1, "device": 1}


def default_second(runs: pd.DataFrame, first: str) -> str | None:
    """Folder of the run most like ``first`` (same kind of jobs, then the same model, size,
    backend, world sizes, variants, device; complete beats unfinished), newest on a tie; None
    when there is no other run. Why: comparing a training run with a benchmark is never meant."""
    runs = runs.assign(_folder=folders(runs)).reset_index(drop=True)
    mine = runs[runs["_folder"] == first]
    others = runs[runs["_folder"] != first]
    if others.empty:
        return None
    if mine.empty:
        return str(others["_folder"].iloc[0])
    me = mine.iloc[0]
    score = pd.Series(0.0, index=others.index)
    for col, weight in LIKENESS.items():
        if col in runs:
            score += weight * (others[col].astype(str) == str(me[col])).astype(float)
    score += 0.5 * (others["status"] == "complete").astype(float)
    return str(others.loc[score.idxmax(), "_folder"])  # idxmax: the first (newest) of the best


def run_labels(runs: pd.DataFrame) -> dict[str, str]:
    """{folder: picker label}: "run_id · status", plus the folder where two runs share a run id."""
    ids = [str(r) for r in runs["run_id"]]
    dup = {r for r in ids if ids.count(r) > 1}
    return {f: f"{r} ({f}) · {s}" if r in dup else f"{r} · {s}"
            for f, r, s in zip(folders(runs), ids, runs["status"].astype(str))}


def pick_runs(runs: pd.DataFrame) -> list[str]:
    """Sidebar: one run (default newest complete) and, in compare mode, a second one. Returns
    the chosen runs' folder names (unique, unlike run ids)."""
    labels = run_labels(runs)
    keys = list(labels)
    if st.session_state.get("run_a") not in keys:
        st.session_state["run_a"] = default_run(runs)
    fmt = lambda f: labels.get(f, f)  # noqa: E731 - option labels are plain text, not Markdown
    a = st.sidebar.selectbox("Run", keys, key="run_a", format_func=fmt, help="Runs under the profiles folder, newest first.")
    chosen = [a]
    if len(keys) > 1 and st.sidebar.toggle("Compare with a second run", key="compare"):
        others = [f for f in keys if f != a]
        if st.session_state.get("run_b") not in others:
            st.session_state["run_b"] = default_second(runs, a) or others[0]
        chosen.append(st.sidebar.selectbox("Second run", others, key="run_b", format_func=fmt))
    return chosen


def _threads(env: dict) -> str:
    t = env.get("threads_per_rank")
    if isinstance(t, dict):
        return ", ".join(f"{v} at N={k}" for k, v in t.items())
    return "?" if t is None else str(t)


def environment_box(run) -> None:
    """Backend, devices, cores and threads per rank; plain warnings for oversubscription and skipped jobs."""
    meta = run.meta if isinstance(run.meta, dict) else {}
    env, cfg = meta.get("environment") or {}, meta.get("config") or {}
    devices = env.get("devices")
    devices = ", ".join(map(str, devices)) if isinstance(devices, list) else str(devices or env.get("device", "?"))
    with st.container(border=True):
        st.markdown(f"**{md(meta.get('run_id', run.path.name))}** · status **{md('stale' if rf.is_stale(meta) else meta.get('status', '?'))}** · "
                    f"created {md(meta.get('created', '?'))}")
        c = st.columns(5)
        c[0].metric("backend", str(env.get("backend", "?")))
        c[1].metric("device", str(env.get("device", "?")), help=devices)
        c[2].metric("CPU cores", str(env.get("cpu_cores", "?")), help=f"logical CPUs: {env.get('logical_cpus', '?')}")
        c[3].metric("GPUs", str(env.get("gpus", 0)))
        c[4].metric("model", f"{cfg.get('model', '?')} {cfg.get('size', '') or ''}".strip())
        st.caption(f"Devices: {md(devices)} · threads per rank: {md(_threads(env))} · host {md(env.get('host', '?'))} · "
                   f"torch {md(env.get('torch', '?'))} · batch/rank {md(cfg.get('batch_size', '?'))} · "
                   f"{md(cfg.get('scaling', '?'))} scaling · {md(cfg.get('steps', '?'))} steps")
        jobs = run.jobs
        over = jobs[jobs["oversubscribed"].fillna(False).astype(bool)] if "oversubscribed" in jobs else jobs.iloc[:0]
        if len(over):
            st.warning(f"**Oversubscribed:** {len(over)} job(s) ran more busy threads than this machine has CPU "
                       f"cores ({md(env.get('cpu_cores', '?'))}): {md(', '.join(map(str, over['job_id'])))}. Their timings "
                       "measure CPU contention, not the algorithm; compare them with care.")
        elif env.get("oversubscribed"):
            st.warning("**Oversubscribed:** this run put more busy threads on the machine than it has CPU cores.")
        for _, j in jobs.iterrows():
            reason = j.get("skip_reason")
            if j.get("status") == "skipped" or (isinstance(reason, str) and reason):
                st.warning(f"**Skipped** {md(j['job_id'])}: {md(reason or 'no reason recorded')}")
            elif j.get("status") in ("failed", "interrupted"):
                st.error(f"**{j['status'].capitalize()}** {md(j['job_id'])}: {md(j.get('error') or 'no error text')}")


def runs_view(runs: pd.DataFrame, loaded: list) -> None:
    """Table of every run, then the environment box and the job list of the chosen run(s)."""
    st.caption("Every run folder under the profiles directory, newest first. Pick one in the sidebar "
               "(default: the newest complete run), or switch on *Compare* to put two side by side.")
    cols = [c for c in RUN_COLS if c in runs.columns]
    st.dataframe(runs[cols], hide_index=True, width="stretch", height=table_height(len(runs)), placeholder=EMPTY)
    for run in loaded:
        environment_box(run)
        jobs = run.jobs
        with st.expander(f"Jobs of {md(run.path.name)} ({len(jobs)})"):
            show = [c for c in ["job_id", "kind", "variant", "algo", "world_size", "bucket_mb", "status",
                                "oversubscribed", "skip_reason", "error"] if c in jobs.columns]
            shown = jobs[show].assign(bucket_mb=[bucket_text(v, b) for v, b in zip(jobs["variant"], jobs["bucket_mb"])])
            st.dataframe(shown, hide_index=True, width="stretch", height=table_height(len(shown)), placeholder=EMPTY)
