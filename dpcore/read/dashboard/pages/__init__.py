"""The dashboard's pages, one file each, and the one list that names them (:data:`PAGES`).

Why files: Streamlit's multipage convention (``st.Page`` / ``st.navigation``) runs a page as a
script; app.py builds the navigation from :data:`PAGES` and runs the chosen file. A page file runs
its page only under ``if __name__ == "__main__":`` (how Streamlit executes it), so tests import
its functions without drawing anything.

Why the URL path is spelled out here: it is the page's address (``/timeline``), what a bookmark or
a link keeps; a file rename must not change it. Overview is the default page, served at ``/``.
This module imports no Streamlit: tests read the list to visit every page.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FOLDER = Path(__file__).resolve().parent


@dataclass(frozen=True)
class PageSpec:
    """One page: its file in this folder, navigation label (also the heading and the browser tab),
    URL path, Material icon, and the kind of job it draws (a run without one is pointed to a
    run that has it; None: any run); ``traces``: its numbers use the jobs' traces (the page then
    names the jobs whose rank traces are missing or unreadable)."""
    file: str
    title: str
    url_path: str
    icon: str
    needs: str | None = None
    default: bool = False
    traces: bool = False

    @property
    def path(self) -> Path:
        return FOLDER / self.file


PAGES: tuple[PageSpec, ...] = (
    PageSpec("runs.py", "Runs", "runs", ":material/folder_open:"),
    PageSpec("overview.py", "Overview", "overview", ":material/bar_chart:", needs="train", default=True, traces=True),
    PageSpec("timeline.py", "Timeline", "timeline", ":material/view_timeline:", needs="train", traces=True),
    PageSpec("gpu.py", "GPU", "gpu", ":material/developer_board:", needs="train", traces=True),
    PageSpec("scaling.py", "Scaling", "scaling", ":material/trending_up:", needs="train", traces=True),
    PageSpec("live.py", "Live", "live", ":material/monitor_heart:"),
    PageSpec("stragglers.py", "Stragglers", "stragglers", ":material/hourglass_top:"),
    PageSpec("hang.py", "Hang", "hang", ":material/pending:"),
    PageSpec("memory.py", "Memory", "memory", ":material/memory:", traces=True),
    PageSpec("ring_messages.py", "Ring messages", "ring-messages", ":material/cycle:"),
    PageSpec("bandwidth.py", "Bandwidth", "bandwidth", ":material/speed:", needs="allreduce"),
    PageSpec("buckets.py", "Buckets", "buckets", ":material/inventory_2:", needs="train", traces=True),
    PageSpec("whatif.py", "What-if", "what-if", ":material/tune:", traces=True),
    PageSpec("traces.py", "Traces", "traces", ":material/download:", needs="train"),
    PageSpec("new_run.py", "New run", "new-run", ":material/play_arrow:"),
    PageSpec("import_traces.py", "Import", "import", ":material/upload_file:"),
)


def spec(title: str) -> PageSpec:
    """The page with this title (KeyError naming the titles there are)."""
    for p in PAGES:
        if p.title == title:
            return p
    raise KeyError(f"no dashboard page titled {title!r}; pages: {', '.join(p.title for p in PAGES)}")
