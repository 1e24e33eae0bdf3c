"""No run-provided text is ever rendered as markup (issue 25 item 4).

A run someone sends you is text anyone can edit: job ids, the model, backend and device in
run.json, trace file names. Rendered raw, Markdown in ``st.metric`` values and tooltips or
download labels made the browser fetch external images and show live links; HTML in Plotly
titles, ticks, legends and hovers did the same inside the charts. The run below carries such
text in every one of those places; every page is visited and every widget and figure checked.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dpcore.contract import runformat as rf
from dpcore.read.dashboard.pages import PAGES
from tests.app_pages import APP, open_page, problems
from tests.fixtures_run import make_run

TAG = "<b>B"  # plotly bolds what follows an unclosed <b>
LINK = "![i](http:e.png)"
JOB = f"r{TAG}**J**{LINK}%{{x}}"  # one path component (no "/"): a valid, if hostile, job id
OLD = "ring-ws2"


def hostile_run(root: Path) -> Path:
    run = make_run(root, "20250101-000000-hostile", steps=3, profiled=1)
    meta = json.loads((run / rf.RUN_JSON).read_text())
    for j in meta["jobs"]:
        if j["id"] == OLD:
            j["id"] = JOB
    meta["environment"].update(backend=f"gloo{TAG}", device=f"**cpu**{LINK}", devices=[f"x86{LINK}"])
    meta["config"].update(model="mlp<a href='http:evil'>L</a>", size=LINK)
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    for table in ("steps", "collectives", "messages"):
        f = run / rf.table_file(table)
        df = pd.read_csv(f)
        df["job_id"] = df["job_id"].replace(OLD, JOB)
        df.to_csv(f, index=False)
    tdir = rf.trace_dir(run, JOB)
    shutil.move(rf.trace_dir(run, OLD), tdir)
    shutil.copy(tdir / rf.MERGED_TRACE, tdir / f"**f**{TAG}{LINK}.json.gz")
    return run


def _markdown_bodies(at: AppTest) -> list[str]:
    """Every string the page hands to Streamlit that Streamlit renders as Markdown."""
    out = [m.proto.body for m in at.get("metric")] + [m.proto.help for m in at.get("metric")]
    out += [m.proto.label for m in at.get("metric")]
    out += [b.proto.label for b in at.get("download_button")] + [b.proto.help for b in at.get("download_button")]
    out += [e.value for e in [*at.markdown, *at.caption, *at.warning, *at.info, *at.error, *at.subheader]]
    out += [e.label for e in at.expander]
    return out


@pytest.fixture(scope="module")
def visited(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], list[str], list[str]]]:
    """Each page of the dashboard on the hostile run: (Markdown bodies, chart specs, problems)."""
    root = tmp_path_factory.mktemp("profiles")
    hostile_run(root)
    mp = pytest.MonkeyPatch()
    mp.setenv("DPCORE_PROFILES", str(root))
    try:
        at = AppTest.from_file(APP, default_timeout=120)
        at.run()
        out = {}
        for page in PAGES:
            open_page(at, page.title)
            if page.title == "Traces":  # the hostile job's files
                at.selectbox(key=next(k for k in (s.key for s in at.selectbox) if k and k.startswith("tr-job"))
                             ).set_value(JOB).run()
            out[page.title] = (_markdown_bodies(at), [c.proto.spec for c in at.get("plotly_chart")], problems(at))
        return out
    finally:
        mp.undo()


@pytest.mark.parametrize("title", [p.title for p in PAGES])
def test_no_page_renders_run_text_as_markup(visited, title):
    bodies, specs, errs = visited[title]
    assert not errs, errs
    for body in bodies:  # Markdown: escaped, so no image, link or bold survives
        assert "](" not in body and "**cpu**" not in body and "**f**" not in body and "**J**" not in body, body
    for spec in specs:  # Plotly: tags and %{...} from the run arrive as entities
        raw = spec.replace("\\u003c", "<").replace("\\u003e", ">")
        assert TAG not in raw and "<a href='http:evil'>" not in raw and "e.png)%{x}" not in raw, title


def test_the_hostile_text_is_shown_escaped(visited):
    """The text is there, as text: the Runs page's metrics and the Traces page's download label."""
    runs = " ".join(visited["Runs"][0])
    assert r"gloo\<b\>B" in runs and r"\*\*cpu\*\*\!\[i\]\(http\:e.png\)" in runs, runs
    assert any(r"\*\*f\*\*" in b for b in visited["Traces"][0])
    shown = " ".join(s for _, specs, _ in visited.values() for s in specs)
    assert "&lt;b&gt;B" in shown and "&#37;{x}" in shown  # a job id drawn in some chart
