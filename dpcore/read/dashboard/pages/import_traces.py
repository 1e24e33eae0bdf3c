"""Import page: traces you already have -> a run, then open it.

Why in the app: the people with traces (from ``tensorboard_trace_handler``, torchtitan, their
own ``export_chrome_trace``) are often not at a terminal; the page does what
``python -m dpcore import`` does (the same :func:`dpcore.read.importer.write_run.import_traces`) and then
opens the new run on its Overview. Traces come from a path on this machine (a folder, searched
recursively, or one file) or are uploaded; uploads are written to a temporary folder only for
the import (the run keeps its own copies under ``traces/``).

Why a path must lie under one allowed folder (:func:`allowed_root`): whoever reaches the page
can have any file the server can read copied into a run and offered for download, and ``/``
walks the whole file system. So a path is resolved (``..`` and symbolic links followed) and
refused unless it is inside the folder the dashboard was started in, or the one
``DPCORE_IMPORT_ROOT`` names; every trace file found must lie inside it too.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import streamlit as st

from dpcore.contract.errors import UsageError
from dpcore.contract.runformat import TRACE_SUFFIXES
from dpcore.read.dashboard import frame
from dpcore.read.dashboard.picker import OPEN_ON_OVERVIEW
from dpcore.read.dashboard.text import md
from dpcore.read.importer.write_run import import_traces

INTRO = "Traces you already have (torch.profiler, tensorboard_trace_handler, torchtitan) as a run."
LOCAL, UPLOAD = "A folder or file on this machine", "Upload trace files"
#: Environment variable naming the one folder local imports may read (default: the folder the
#: dashboard was started in).
IMPORT_ROOT_ENV = "DPCORE_IMPORT_ROOT"


def allowed_root() -> Path:
    """The folder whose contents the page may import: ``$DPCORE_IMPORT_ROOT`` or the cwd."""
    return Path(os.environ.get(IMPORT_ROOT_ENV) or Path.cwd()).expanduser().resolve()


def confined(text: str, allowed: Path) -> Path:
    """The path typed on the page, resolved, if it lies under ``allowed`` (a relative path is
    taken from ``allowed``); else one UsageError line naming the folder and how to change it."""
    if not text.strip():
        raise UsageError("give a folder of traces (or one trace file)")
    path = Path(text.strip()).expanduser()
    resolved = (path if path.is_absolute() else allowed / path).resolve()
    if not resolved.is_relative_to(allowed):
        raise UsageError(f"{text.strip()} is outside {allowed}, the folder this dashboard imports "
                         f"from; copy the traces under it, or start the dashboard with "
                         f"{IMPORT_ROOT_ENV}=<folder>")
    return resolved


def save_uploads(files: list[tuple[str, bytes]], folder: Path) -> Path:
    """Write uploaded (name, bytes) into ``folder`` under safe, distinct base names; returns it.

    Why renamed: an upload's name is whatever the browser sent; only its base name, made of
    letters, digits and ``._-``, lands on disk, so no name can point outside ``folder``.
    """
    used: set[str] = set()
    for i, (name, data) in enumerate(files):
        base = re.sub(r"[^A-Za-z0-9._-]", "_", Path(name).name).lstrip(".") or f"trace{i}.json"
        if not base.endswith(TRACE_SUFFIXES):
            raise UsageError(f"not a Chrome trace file (*.json, *.json.gz): {name}")
        while base in used:
            base = f"{i}_{base}"
        used.add(base)
        (folder / base).write_bytes(data)
    return folder


def _run_import(source: str, uploads: list, name: str, iteration: int | None, root: Path) -> str | None:
    """Import; the new run's id, or None after showing the one-line error."""
    label = name.strip() or None
    try:
        if source == LOCAL:
            allowed = allowed_root()
            result = import_traces(confined(st.session_state.get("imp-path", ""), allowed), root, label,
                                   iteration=iteration, within=allowed)
        else:
            with tempfile.TemporaryDirectory(prefix="dpcore-upload-") as tmp:
                folder = save_uploads([(f.name, f.getvalue()) for f in uploads], Path(tmp))
                result = import_traces(folder, root, label, iteration=iteration)
    except (UsageError, ValueError, OSError) as exc:
        st.error(f"Import failed: {md(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__}")
        return None
    return result.run_dir.name


def render(root: Path) -> None:
    """Path or uploads, a name, Import; on success ``st.session_state['open_run']`` is the new run
    (app.py then selects it and shows its Overview) and the app reruns."""
    st.caption("Turn torch.profiler traces into a run: steps from the ProfilerStep#N markers, collectives from "
               "the gloo spans or NCCL kernels, phases where the trace names them (else shown as missing). "
               "Layouts: rank<r>.json, tensorboard_trace_handler's *.pt.trace.json[.gz], torchtitan's "
               f"iteration_<k>/rank<r>_trace.json (the latest iteration unless you pick one). Written to `{root}`.")
    source = st.radio("Traces from", [LOCAL, UPLOAD], key="imp-source", horizontal=True)
    uploads: list = []
    if source == LOCAL:
        st.text_input(f"Path (under {allowed_root()})", key="imp-path",
                      placeholder="/path/to/profile_trace or /path/to/rank0.json")
    else:
        uploads = st.file_uploader("Trace files (one per rank)", type=["json", "gz"], accept_multiple_files=True,
                                   key="imp-files") or []
    c = st.columns(2)
    name = c[0].text_input("Name (added to the run id)", key="imp-name", placeholder="e.g. my-ddp-job")
    it = c[1].text_input("Iteration (torchtitan layout; empty = latest)", key="imp-iteration")
    ready = bool(st.session_state.get("imp-path", "").strip()) if source == LOCAL else bool(uploads)
    if not st.button("Import", type="primary", key="imp-go", disabled=not ready):
        return
    if it.strip() and not it.strip().isdigit():
        st.error(f"Iteration must be a whole number, got {it!r}")
        return
    run_id = _run_import(source, uploads, name, int(it) if it.strip() else None, root)
    if run_id is not None:
        st.session_state[OPEN_ON_OVERVIEW] = run_id
        st.rerun()


def page() -> None:
    """The page as Streamlit runs it (also while the profiles folder is still empty)."""
    ctx = frame.context()
    st.caption(INTRO)
    frame.safely(lambda: render(ctx.root), "The import")


if __name__ == "__main__":
    page()
