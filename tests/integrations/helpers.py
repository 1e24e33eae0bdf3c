"""What the integration tests share: a free port, and opening a run in the CLI and the app."""
from __future__ import annotations

import socket
from pathlib import Path

from streamlit.testing.v1 import AppTest

from dpcore.cli import main
from tests.app_pages import APP, open_page, problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def opens_everywhere(run_dir: Path, capsys, monkeypatch, pages=("Overview", "Timeline"),
                     charts: dict[str, int] | None = None) -> str:
    """``summarize`` prints the run's job (exit 0) and the dashboard's pages draw it without a
    problem (``charts``: at least this many charts on a page); returns summarize's CSV."""
    assert main(["summarize", str(run_dir), "--csv"]) == 0
    csv = capsys.readouterr().out
    monkeypatch.setenv("DPCORE_PROFILES", str(run_dir.parent))
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.sidebar.selectbox(key="run_a").set_value(run_dir.name).run()
    for title in pages:
        open_page(at, title)
        assert not problems(at), (title, problems(at))
        assert len(at.get("plotly_chart")) >= (charts or {}).get(title, 1), f"{title} drew too few charts"
    return csv
