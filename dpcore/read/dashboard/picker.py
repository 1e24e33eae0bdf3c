"""The sidebar's run picker (one run, or two in compare mode) and the offer of a run that has
data for the page when the picked one has none.

Why runs are picked by folder, not run id: run ids come from run.json, and a copied run
(``cp -r``) keeps its id; the folder name is unique under the profiles folder. Everything from
a run that lands in Markdown goes through :func:`~dpcore.read.dashboard.text.md`.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from dpcore.read.dashboard import data
from dpcore.read.dashboard.pages import PageSpec
from dpcore.read.dashboard.text import md
from dpcore.read.rundir.load import Run

#: Session keys that open a run: OPEN_ON_OVERVIEW (a profile or an import started from the app has
#: finished: app.py selects it and shows its Overview), OPEN_HERE (the "Open <run>" button of a
#: page the picked run has no data for: app.py selects it and the page stays).
OPEN_ON_OVERVIEW, OPEN_HERE = "open_run", "open_run_keep_page"


def _has_kind(runs: pd.DataFrame, kind: str) -> pd.Series:
    return runs["kinds"].fillna("").astype(str).str.split(",").apply(lambda ks: kind in ks)


def folders(runs: pd.DataFrame) -> list[str]:
    """The folder name of each run (unique under the profiles folder): the picker's keys."""
    return [Path(str(p)).name for p in runs["path"]]


def default_run(runs: pd.DataFrame) -> str:
    """Folder of the newest complete run with training jobs (the pages most people open
    first), else of the newest complete run, else of the newest of any status."""
    runs = runs.assign(_folder=folders(runs))
    done = runs[runs["status"] == "complete"]
    train = done[_has_kind(done, "train")]
    pick = train if not train.empty else done if not done.empty else runs
    return str(pick["_folder"].iloc[0])


def run_with(runs: pd.DataFrame, kind: str | None, folder: str) -> str | None:
    """When the chosen run (by folder) has no job of ``kind`` ('train', 'allreduce'; None: any
    run will do), the newest run's folder that has one (else None)."""
    if kind is None:
        return None
    have = runs.assign(_folder=folders(runs))
    have = have[_has_kind(have, kind)]
    if have.empty or folder in set(have["_folder"]):
        return None
    return str(have["_folder"].iloc[0])


def offer_other_run(runs: pd.DataFrame, page: PageSpec, folder: str) -> None:
    """Say plainly that this run has nothing for the page, with a one-click switch (app.py
    selects the run on the rerun; the page stays)."""
    other = run_with(runs, page.needs, folder)
    if other is None:
        return
    kind = "all-reduce benchmark" if page.needs == "allreduce" else "training jobs"
    st.info(f"Run {md(folder)} has no {kind}; {md(other)} has.")
    if st.button(f"Open {md(other)}", key=f"open-{page.title}-{other}"):
        st.session_state[OPEN_HERE] = other
        st.rerun()


#: How much each shared property counts when choosing the run to compare with: the same kind of
#: jobs first (a training run against an all-reduce benchmark compares nothing), then the model.
LIKENESS = {"kinds": 8, "model": 4, "size": 2, "backend": 1, "world_sizes": 1, "variants": 1, "device": 1}


def _kinds(value: object) -> set[str]:
    return {k for k in str(value if isinstance(value, str) else "").split(",") if k}


def comparable(runs: pd.DataFrame, first: str) -> list[str]:
    """Folders of the other runs that share a kind of job (train, allreduce) with ``first``, newest
    first: a training run against an all-reduce benchmark has no number in common."""
    runs = runs.assign(_folder=folders(runs))
    mine = runs[runs["_folder"] == first]
    if mine.empty:
        return [f for f in runs["_folder"] if f != first]
    kinds = _kinds(mine["kinds"].iloc[0])
    return [f for f, k in zip(runs["_folder"], runs["kinds"]) if f != first and kinds & _kinds(k)]


def default_second(runs: pd.DataFrame, first: str) -> str | None:
    """Folder of the run most like ``first`` (same kind of jobs, then the same model, size,
    backend, world sizes, variants, device; complete beats unfinished), newest on a tie; None
    when there is no other run of the same kind (:func:`comparable`). Why: comparing a training run
    with a benchmark is never meant."""
    runs = runs.assign(_folder=folders(runs)).reset_index(drop=True)
    mine = runs[runs["_folder"] == first]
    others = runs[runs["_folder"].isin(comparable(runs.drop(columns="_folder"), first))]
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


#: The most characters of a run's label that the sidebar's picker (about 230 px) shows whole.
LABEL_CHARS = 30


#: How wide (px) a label the sidebar's picker shows whole may be, in its font (Source Sans, 14 px):
#: the picker draws 190 px of it (measured in Chromium, 1400 px window), so 30 characters did not
#: always fit ("interrupted · 2026120…300-cc4b" is 190.2 px; capitals and m/w much more).
LABEL_PX = 185.0
#: Advance widths (px) of that font, measured with a canvas in Chromium: narrow and wide glyphs,
#: capitals 8, the rest (digits, lowercase) 7.
_NARROW = dict.fromkeys("ijlI.,:;'|!()[] ", 3.5) | dict.fromkeys("frt-·", 4.5)
_WIDE = dict.fromkeys("mwMW", 10.7) | {"…": 13.3}


def label_px(text: str) -> float:
    """The approximate width of ``text`` in the picker's font (px)."""
    return sum(_NARROW.get(c) or _WIDE.get(c) or (8.0 if c.isupper() else 7.0) for c in text)


def fit_label(text: str, most: int = LABEL_CHARS, most_px: float = LABEL_PX) -> str:
    """``text`` whole if it fits the picker (at most ``most`` characters and ``most_px`` wide),
    else its start and end around "…" (a run id's date and its suffix are the parts that tell
    runs apart), as many characters as fit."""
    if len(text) <= most and label_px(text) <= most_px:
        return text
    for n in range(min(most, len(text) - 1), 1, -1):
        head = (n - 1) // 2
        cut = text[:head] + "…" + text[len(text) - (n - 1 - head):]
        if label_px(cut) <= most_px:
            return cut
    return text[:1] + "…"


def run_labels(runs: pd.DataFrame) -> dict[str, str]:
    """{folder: picker label}: the run id, "status · " before it where the run is not complete,
    plus the folder where two runs share a run id; at most LABEL_CHARS characters (the run id cut
    in the middle), so that the sidebar's picker shows it whole (a timestamped run id with
    " · failed" after it was cut). The status goes first: a cut never takes it."""
    ids = [str(r) for r in runs["run_id"]]
    dup = {r for r in ids if ids.count(r) > 1}
    out = {}
    for f, r, s in zip(folders(runs), ids, runs["status"].astype(str)):
        name = f"{r} ({f})" if r in dup else r
        prefix = "" if s == "complete" else f"{s} · "
        out[f] = prefix + fit_label(name, LABEL_CHARS - len(prefix), LABEL_PX - label_px(prefix))
    return out


def planned_runs(runs: pd.DataFrame) -> list[str]:
    """The runs the pickers of :func:`pick_runs` will show (folder names): their values in the
    session, or the defaults (newest complete run; in compare mode, the second run's default),
    written into the session so the pickers open on them. Draws nothing.

    Why apart from the widgets: app.py draws the page first and the pickers after it, into
    their place in the sidebar (the first chart after a reload came about 0.9x as late
    in A/B runs both ways, docs/measurements.md, when the select box and toggle bundles were no longer
    evaluated before it); a widget's value is in the session before the script runs, so the page
    gets the same runs the pickers then show."""
    keys = list(run_labels(runs))
    if st.session_state.get("run_a") not in keys:
        st.session_state["run_a"] = default_run(runs)
    a = st.session_state["run_a"]
    chosen = [a]
    if len(keys) > 1 and st.session_state.get("compare"):
        others = comparable(runs, a)
        if others:
            if st.session_state.get("run_b") not in others:
                st.session_state["run_b"] = default_second(runs, a) or others[0]
            chosen.append(st.session_state["run_b"])
    return chosen


def pick_runs(runs: pd.DataFrame, where: DeltaGenerator | None = None) -> list[str]:
    """Sidebar (or ``where``, a place in it): one run (default newest complete) and, in compare
    mode, a second one, opening on :func:`planned_runs`' values. Returns the chosen runs' folder
    names (unique, unlike run ids)."""
    box = st.sidebar if where is None else where
    planned_runs(runs)
    labels = run_labels(runs)
    keys = list(labels)
    fmt = lambda f: labels.get(f, f)  # noqa: E731 - option labels are plain text, not Markdown
    a = box.selectbox("Run", keys, key="run_a", format_func=fmt,
                      help="Runs under the profiles folder, newest first; a run that is not complete "
                           "shows its status.")
    chosen = [a]
    if len(keys) > 1 and box.toggle("Compare with a second run", key="compare"):
        others = comparable(runs, a)
        if not others:
            kinds = runs.loc[[f == a for f in folders(runs)], "kinds"]
            what = " or ".join(sorted(_kinds(kinds.iloc[0]) if len(kinds) else set())) or "the same kind of"
            box.info(f"No other run has {md(what)} jobs to compare with {md(a)}: a training run and an "
                     "all-reduce benchmark have no number in common.")
            return chosen
        chosen.append(box.selectbox("Second run", others, key="run_b", format_func=fmt,
                                    help="Runs with the same kind of jobs (training, all-reduce)."))
    return chosen


def load_picked(runs: pd.DataFrame, chosen: list[str], root: Path) -> list[Run]:
    """The chosen runs (folder names) loaded through the cache; a run that cannot be loaded is
    named in a warning and left out."""
    paths = dict(zip(folders(runs), runs["path"]))
    loaded = []
    for folder in chosen:
        try:
            loaded.append(data.cached_run(paths[folder], root))
        except Exception as exc:  # noqa: BLE001 - RunLoadError names the file; anything else is still a bad run
            st.warning(f"Run {md(folder)} could not be loaded: {md(exc)}")
    return loaded


#: The variants a job picker opens on, in order: DDP (what most users run), then its from-scratch
#: twin, then the hook-based overlap; every page that picks one job uses :func:`featured_job`.
FEATURED_VARIANTS = ("torch_ddp", "bucketed", "overlap")


def featured_job(jobs: pd.DataFrame, bucket_mb: object = None) -> str | None:
    """The job a job picker opens on, the same on every page: a complete training job of the first
    of FEATURED_VARIANTS the run has (else any variant), at its largest world size, with the run's
    own ``--bucket-mb`` where the variant ran a sweep. None when ``jobs`` has no complete training job."""
    ok = jobs
    if "kind" in ok:
        ok = ok[ok["kind"] == "train"]
    if "status" in ok:
        ok = ok[ok["status"] == "complete"]
    if ok.empty:
        return None
    rank = {v: i for i, v in enumerate(FEATURED_VARIANTS)}
    bucket = pd.to_numeric(ok["bucket_mb"], errors="coerce") if "bucket_mb" in ok else pd.Series(float("nan"),
                                                                                                 index=ok.index)
    try:
        want = float(bucket_mb)
    except (TypeError, ValueError):
        want = float("nan")
    order = pd.DataFrame({"v": ok["variant"].map(lambda v: rank.get(v, len(rank))),
                          "ws": -pd.to_numeric(ok["world_size"], errors="coerce").fillna(0),
                          "b": ~((bucket - want).abs() < 1e-9), "i": range(len(ok))}, index=ok.index)
    best = order.sort_values(["v", "ws", "b", "i"]).index[0]
    return str(ok.at[best, "job_id"])
