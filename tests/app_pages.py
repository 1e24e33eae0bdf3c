"""Driving the dashboard's pages in Streamlit's AppTest: open a page by its title, read which
page is shown, and collect what went wrong on it.

Why a helper: app.py builds the navigation from `dpcore.read.dashboard.pages.PAGES` (one file per
page); AppTest switches pages by file path, relative to app.py. Tests name pages by title.
"""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from dpcore.read.dashboard.pages import spec

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")


def open_page(at: AppTest, title: str) -> AppTest:
    """Switch to the page titled ``title`` and run the app (call ``at.run()`` once before)."""
    return at.switch_page(str(spec(title).path.relative_to(ROOT))).run()


def heading(at: AppTest) -> str:
    """The main area's first title: the page's title (or the empty folder's landing)."""
    return at.main.title[0].value if len(at.main.title) else ""


def problems(at: AppTest) -> list[str]:
    """Exceptions and st.error boxes on the page (a page part that failed inside `frame.safely`
    shows "<what> could not be drawn: ..." as an error box)."""
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]


def data_problems(at: AppTest) -> list[str]:
    """The lines of the collapsed problem boxes (``frame.problem_list``: unreadable runs skipped,
    problems with a run's data), Markdown as rendered (escapes kept)."""
    return [m.value for e in at.expander if e.icon == ":material/warning:" for m in e.markdown]
