"""Traces page: the raw torch.profiler traces of a job, opened in Perfetto with one click or
downloaded.

Why the page opens Perfetto itself: a trace is only useful once it is open in a trace viewer; a
download plus a drag-and-drop loses most readers on the way (how the trace reaches Perfetto:
`dpcore.read.dashboard.perfetto`). Download names carry the run id, so files from two runs never
overwrite each other in a Downloads folder. Every file is listed and read through the path
checks of `dpcore.read.dashboard.data` (inside the profiles folder, regular files only).
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import streamlit as st

from dpcore.contract.units import EMPTY, binary_size
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.perfetto import MAX_EMBED_BYTES, open_in_perfetto, too_big
from dpcore.read.dashboard.picker import featured_job
from dpcore.read.dashboard.table_cells import table_height
from dpcore.read.dashboard.text import md
from dpcore.read.rundir.load import Run

INTRO = "The raw torch.profiler traces, for Perfetto or chrome://tracing."


def download_name(run: Run, job: str, file_name: str) -> str:
    """`<run_id>-<job_id>-rank0.json.gz`: the run id (from run.json, else the folder) keeps files of
    two runs apart; anything but letters, digits, '.', '_' and '-' becomes '_'."""
    meta = run.meta if isinstance(run.meta, dict) else {}
    run_id = meta.get("run_id") if isinstance(meta.get("run_id"), str) and meta.get("run_id") else run.path.name
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{run_id}-{job}-{file_name}")


def _perfetto_button(run: Run, job: str, files: dict[str, Path], root: Path) -> None:
    """Pick one trace file and open it in Perfetto with one click (or say why it cannot be)."""
    names = sorted(files, key=lambda n: (n != "merged", n))
    c1, c2 = st.columns([1, 3])
    name = c1.selectbox("Trace to open", names, key=f"tr-open-{run.path}-{job}",
                        help="merged: every rank in one trace, messages drawn as flows")
    path = files[name]
    size = path.stat().st_size
    with c2:
        if too_big(size):
            st.info(f"{path.name} is {binary_size(size)}: above the {binary_size(MAX_EMBED_BYTES)} this page embeds "
                    "for Perfetto. Download it below and drag it onto https://ui.perfetto.dev.")
            return
        open_in_perfetto(data.file_reader(path, root)(), f"{run.path.name} · {job} · {name}",
                         download_name(run, job, path.name), key=f"tr-perfetto-{run.path}-{job}-{name}")


def render(run: Run, root: Path) -> None:
    """Open a trace in Perfetto with one click; download buttons for each rank's trace and the merged one."""
    st.caption("Each file is a torch.profiler Chrome trace (gzip JSON). **Open in Perfetto** opens "
               "https://ui.perfetto.dev in a new tab and hands it the trace from this page (nothing is uploaded; "
               f"traces up to {binary_size(MAX_EMBED_BYTES)}). Or download a file and drag it onto Perfetto, or load "
               "it in `chrome://tracing`. `merged` holds every rank in one trace, messages drawn as flows.")
    rows = []
    for job in run.jobs["job_id"]:
        files = data.trace_files(run, str(job), root)
        if files:
            rows.append((str(job), files))
    if not rows:
        st.info("This run has no traces (run the profiler with profiled steps to record them).")
        return
    ids = [j for j, _ in rows]
    featured = featured_job(run.jobs[run.jobs["job_id"].astype(str).isin(ids)],
                            (run.meta.get("config") or {}).get("bucket_mb"))
    job = st.selectbox("Job", ids, index=ids.index(featured) if featured in ids else 0, key=f"tr-job-{run.path}")
    files = dict(rows)[job]
    _perfetto_button(run, job, files, root)
    cols = st.columns(min(4, len(files)))
    for i, (name, path) in enumerate(sorted(files.items(), key=lambda kv: (kv[0] != "merged", kv[0]))):
        size = path.stat().st_size
        cols[i % len(cols)].download_button(
            f"{md(name)} ({binary_size(size)})", data.file_reader(path, root),  # the label renders Markdown
            file_name=download_name(run, job, path.name),
            mime="application/gzip", key=f"tr-{run.path}-{job}-{name}", on_click="ignore")
    table = pd.DataFrame({"file": [str(p.relative_to(run.path)) for p in files.values()],
                          "size": [binary_size(p.stat().st_size) for p in files.values()],
                          "bytes": [p.stat().st_size for p in files.values()]})
    st.dataframe(table, hide_index=True, height=table_height(len(table)), placeholder=EMPTY)


def page() -> None:
    """The page as Streamlit runs it."""
    ctx = frame.context()
    st.caption(INTRO)
    frame.each_run(lambda run: render(run, ctx.root))


if __name__ == "__main__":
    page()
