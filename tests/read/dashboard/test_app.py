"""The Streamlit app, driven headless with `streamlit.testing.v1.AppTest`.

Why: every page must render on a realistic run without an exception or a "could not be drawn"
box, compare mode and the run hand-offs must work, and an empty, corrupt or foreign profiles
folder must give a clear page instead of a traceback.
"""
from __future__ import annotations

import gc
import json
import re
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dpcore.read.dashboard.pages import FOLDER, PAGES
from tests.app_pages import APP, data_problems, heading, open_page, problems
from tests.fixtures_run import make_corrupt_runs, make_run

#: Pages that draw no chart: what each shows instead is checked in test_every_page_renders.
NO_CHART = {"Runs", "Traces", "New run", "Import", "Live", "Hang", "GPU"}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("profiles")
    make_run(root, "20250101-120000-mlp")
    make_run(root, "20250102-120000-mlp", seed=1)
    return root


def start(root: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("DPCORE_PROFILES", str(root))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    return at


def plain(markdown: str) -> str:
    """What a Markdown body shows: run data is backslash-escaped (dpcore.read.dashboard.text.md)."""
    return re.sub(r"\\(.)", r"\1", markdown)


def test_every_page_is_a_file_with_a_stable_address() -> None:
    """One file per page, each listed once; the URL paths are addresses people bookmark."""
    assert sorted(p.file for p in PAGES) == sorted(f.name for f in FOLDER.glob("*.py") if f.name != "__init__.py")
    assert {p.title: p.url_path for p in PAGES} == {
        "Runs": "runs", "Overview": "overview", "Timeline": "timeline", "GPU": "gpu", "Scaling": "scaling",
        "Stragglers": "stragglers", "Memory": "memory", "Ring messages": "ring-messages", "Bandwidth": "bandwidth",
        "Buckets": "buckets", "What-if": "what-if", "Traces": "traces", "New run": "new-run", "Import": "import",
        "Live": "live", "Hang": "hang"}
    assert [p.title for p in PAGES if p.default] == ["Overview"]


def test_every_page_renders(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(two_runs, monkeypatch)
    assert not problems(at) and heading(at) == "Overview"  # the default page
    assert at.sidebar.selectbox(key="run_a").value == "20250102-120000-mlp"  # newest complete
    for page in PAGES:
        open_page(at, page.title)
        assert not problems(at), (page.title, problems(at))
        assert heading(at) == page.title
        if page.title not in NO_CHART:
            assert at.get("plotly_chart"), f"{page.title} drew no chart"
        elif page.title == "Runs":
            assert at.dataframe[0].value["run_id"].tolist() == ["20250102-120000-mlp", "20250101-120000-mlp"]
        elif page.title == "Traces":
            assert any(b.proto.label.startswith("merged") for b in at.get("download_button"))
        elif page.title == "New run":
            assert at.button(key="FormSubmitter:new_run-Start profile").label == "Start profile"
        elif page.title == "Import":
            assert at.button(key="imp-go").disabled  # nothing to import yet
        elif page.title in ("Live", "Hang"):  # the synthetic runs have no live.csv, no hang/
            assert at.info, page.title
        elif page.title == "GPU":  # the synthetic runs were traced on CPUs
            assert any("No GPU events" in i.value for i in at.info)
    open_page(at, "Runs")
    warnings = plain(" ".join(w.value for w in at.warning))
    assert "Oversubscribed" in warnings and "data_parallel needs 2 or more GPUs" in warnings


def test_a_failing_page_part_says_could_not_be_drawn() -> None:
    """What `problems` looks for: `frame.safely` turns an exception into one error box."""
    def page() -> None:
        from dpcore.read.dashboard.frame import safely
        safely(lambda: 1 / 0, "The thing")
        import streamlit as st
        st.write("the rest of the page")

    at = AppTest.from_function(page, default_timeout=30).run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The thing could not be drawn: ZeroDivisionError: division by zero"]
    assert problems(at) and at.markdown[-1].value == "the rest of the page"


def test_a_finished_import_or_profile_opens_the_run_on_the_overview(
        two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(two_runs, monkeypatch)
    open_page(at, "Timeline")
    at.session_state["open_run"] = "20250101-120000-mlp"  # what the Import page and the launcher leave
    at.run()
    assert not problems(at), problems(at)
    assert heading(at) == "Overview" and at.sidebar.selectbox(key="run_a").value == "20250101-120000-mlp"
    assert "open_run" not in at.session_state
    open_page(at, "Scaling")  # the run stays picked on the next page
    assert at.sidebar.selectbox(key="run_a").value == "20250101-120000-mlp"


def test_compare_mode(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(two_runs, monkeypatch)
    at.sidebar.toggle(key="compare").set_value(True).run()
    assert at.sidebar.selectbox(key="run_b").value == "20250101-120000-mlp"
    for title in ("Overview", "Scaling", "Timeline"):
        open_page(at, title)
        assert not problems(at), (title, problems(at))
        subheaders = [s.value for s in at.subheader]
        assert any("20250101" in s for s in subheaders) and any("20250102" in s for s in subheaders)
        assert at.sidebar.toggle(key="compare").value  # compare mode survives the page switch
    open_page(at, "Overview")
    assert len(at.get("plotly_chart")) == 3  # comparison + one breakdown per run


def test_timeline_switches_job_and_step(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(two_runs, monkeypatch)
    open_page(at, "Timeline")
    job = next(s for s in at.selectbox if s.label == "Job")
    job.set_value("ring-ws4").run()
    assert not problems(at)
    step = next(s for s in at.selectbox if s.label == "Step")
    step.set_value(0).run()  # an untraced step: drawn from steps/collectives
    assert not problems(at) and at.get("plotly_chart")


def test_empty_profiles_folder_offers_quick_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(tmp_path, monkeypatch)
    assert not at.exception
    assert "No profiling runs yet" in heading(at)
    assert at.button(key="quick").label == "Run a quick CPU profile"
    for page in PAGES:  # every page shows the landing; New run and Import work below it
        open_page(at, page.title)
        assert not problems(at), (page.title, problems(at))
        assert heading(at) == "No profiling runs yet" and at.button(key="quick")
        assert bool(at.get("form")) == (page.title == "New run"), page.title
        assert bool([b for b in at.button if b.key == "imp-go"]) == (page.title == "Import"), page.title


def test_missing_profiles_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(tmp_path / "does-not-exist", monkeypatch)
    assert not at.exception and "No profiling runs yet" in heading(at)


def test_corrupt_runs_warn_and_the_good_one_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_run(tmp_path, "20230101-000000-good")
    make_corrupt_runs(tmp_path)
    at = start(tmp_path, monkeypatch)
    assert not at.exception
    text = plain(" ".join(data_problems(at)))
    assert "run.json" in text and "steps.csv" in text, text
    assert "20230101-000000-good" in at.sidebar.selectbox(key="run_a").options[-1] or \
        "20230101-000000-good" in " ".join(at.sidebar.selectbox(key="run_a").options)
    at.sidebar.selectbox(key="run_a").set_value("20230101-000000-good").run()
    for title in ("Overview", "Timeline"):
        open_page(at, title)
        assert not problems(at), problems(at)


def test_symlink_out_of_the_profiles_folder_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, outside = tmp_path / "profiles", tmp_path / "elsewhere"
    make_run(root, "20230101-000000-good")
    make_run(outside, "20990101-000000-outside")
    (root / "20990101-000000-outside").symlink_to(outside / "20990101-000000-outside")
    at = start(root, monkeypatch)
    assert not at.exception
    assert [o.split(" · ")[0] for o in at.sidebar.selectbox(key="run_a").options] == ["20230101-000000-good"]
    assert any("outside the profiles folder" in plain(w) for w in data_problems(at))


def test_quick_profile_progress_and_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One click starts the profiler; its JSON progress lines are followed and the run is opened.

    The real profiler is replaced by a tiny script that prints the documented progress events and
    writes a fixture run, so the test exercises the subprocess plumbing without training anything.
    """
    from dpcore.read.dashboard import launcher

    run_dir = tmp_path / "20990101-000000-quick"
    script = (
        "import json,sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})\n"
        "from tests.fixtures_run import make_run\n"
        "print('not json, ignored')\n"
        f"print(json.dumps(dict(event='job_start', job_id='ring-ws2', job_index=1, jobs_total=1, steps_total=2)))\n"
        f"print(json.dumps(dict(event='step', job_id='ring-ws2', job_index=1, jobs_total=1, step=1, steps_total=2)))\n"
        f"make_run({str(tmp_path)!r}, {run_dir.name!r}, steps=2, profiled=0)\n"
        f"print(json.dumps(dict(event='run_end', run_dir={str(run_dir)!r}, status='complete')))\n"
    )
    real_build = launcher.build_command
    monkeypatch.setattr(launcher, "build_command", lambda *a, **k: [sys.executable, "-c", script])
    at = start(tmp_path, monkeypatch)
    at.button(key="quick").click().run()
    launch = at.session_state["launch"]
    launch.proc.wait(timeout=60)
    deadline = time.monotonic() + 10  # the reader thread may still be copying the last lines
    while not any("run_end" in line for line in launch.out) and time.monotonic() < deadline:
        time.sleep(0.05)
    at.run()
    at.run()
    assert not at.exception
    assert at.sidebar.selectbox(key="run_a").value == run_dir.name and heading(at) == "Overview"
    assert any("Profile finished" in s.value for s in at.success)
    assert real_build(tmp_path, "mlp", "tiny", ["ring"], [1, 2], 5, 25.0, [1.0, 5.0])[-2:] == ["--bucket-sweep", "1,5"]


def test_failed_profile_shows_its_errors_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpcore.read.dashboard import launcher

    script = ("import json,sys\n"
              "print(json.dumps(dict(event='job_end', job_id='ring-ws2', job_index=1, jobs_total=1, status='failed',"
              " error='rank 1: RuntimeError: Connection reset by peer')))\n"
              "sys.stderr.write('dpcore: error: --steps must be >= 1, got 0\\n'); sys.exit(2)\n")
    monkeypatch.setattr(launcher, "build_command", lambda *a, **k: [sys.executable, "-c", script])
    at = start(tmp_path, monkeypatch)
    at.button(key="quick").click().run()
    launch = at.session_state["launch"]
    launch.proc.wait(timeout=60)
    deadline = time.monotonic() + 10
    while not launch.err and time.monotonic() < deadline:
        time.sleep(0.05)
    at.run()
    at.run()
    assert not at.exception
    errors = plain(" ".join(e.value for e in at.error))
    assert "exited with code 2" in errors and "rank 1: RuntimeError: Connection reset by peer" in errors
    assert "--steps must be >= 1, got 0" in " ".join(c.value for c in at.code)


def test_progress_parsing_is_defensive() -> None:
    from dpcore.read.dashboard.launcher import parse_event, progress_of

    lines = ["garbage", "[1,2]", '{"event": "job_start", "job_index": "x", "jobs_total": null}',
             json.dumps(dict(event="step", job_index=2, jobs_total=4, step=5, steps_total=10)), "{broken"]
    events = [e for e in map(parse_event, lines) if e]
    assert len(events) == 2
    frac, text, run_dir = progress_of(events)
    assert frac == pytest.approx(1.5 / 4) and "step 5/10" in text and run_dir is None


def test_real_profile_started_from_the_page_opens_and_every_view_draws(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end, no fakes: the empty page's one-click profile runs the real
    `python -m dpcore profile` (shrunk to two 2-rank jobs), the run opens by itself, and every
    page draws it."""
    from dpcore.read.dashboard import launcher

    monkeypatch.setitem(launcher.QUICK, "variants", ["flat", "ring"])
    monkeypatch.setitem(launcher.QUICK, "world_sizes", [2])
    monkeypatch.setitem(launcher.QUICK, "steps", 4)
    at = start(tmp_path, monkeypatch)
    assert any("No profiling runs yet" in t.value for t in at.title)
    at.button(key="quick").click().run()
    launch = at.session_state["launch"]
    assert launch.proc.wait(timeout=240) == 0, "\n".join(launch.out[-20:])
    deadline = time.monotonic() + 10
    while not any("run_end" in line for line in launch.out) and time.monotonic() < deadline:
        time.sleep(0.05)
    at.run()
    at.run()
    assert not problems(at)
    run_id = at.sidebar.selectbox(key="run_a").value
    assert (tmp_path / run_id / "run.json").exists()
    for page in PAGES:
        open_page(at, page.title)
        assert not problems(at), (page.title, problems(at))
        if page.title == "What-if":  # flat and ring only: no bucketed job to start from, and it says so
            assert any("starts from a completed `bucketed`" in i.value for i in at.info)
        elif page.title == "Bandwidth":  # a training run only: said once, no empty chart
            assert [i.value for i in at.info] == ["This run has no all-reduce benchmark: "
                                                  "`python -m dpcore allreduce` measures one."]
            assert not at.get("plotly_chart")
        elif page.title == "Scaling":  # one world size (2): nothing to scale, and no one-point charts
            assert any("ran at world size 2: there is nothing to scale" in i.value for i in at.info)
            assert not at.get("plotly_chart")
        elif page.title == "Buckets":  # one bucket size, no hook: said in a line, no empty chart
            assert any("This run has no bucket sweep" in i.value for i in at.info)
            assert not at.get("plotly_chart")
        elif page.title not in NO_CHART:
            assert at.get("plotly_chart"), f"{page.title} drew no chart"


def test_a_failing_summary_table_keeps_the_overview_chart(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Overview's table guards itself, so a failing table leaves the chart above it."""
    from dpcore.read.dashboard import table_cells

    def broken(*_: object, **__: object) -> None:
        raise ValueError("bad table")

    monkeypatch.setattr(table_cells, "overview_rows", broken)
    at = start(two_runs, monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == [
        "The summary table of run 20250102-120000-mlp could not be drawn: ValueError: bad table"]
    assert len(at.get("plotly_chart")) == 1 and not at.dataframe


def test_a_cold_first_visit_shows_the_steps_while_the_traces_are_read(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose traces the server has not read yet: while they are read, the page shows each
    job's step time from steps.csv (the numbers the summary shows, job_summary's) under a line
    saying what is read. Once read, the preview is gone and the page is drawn, with the run
    picker (nothing waits for the browser). The read is stopped midway here (st.stop in its
    place) to see the page as it is during it."""
    import streamlit as st

    from dpcore.read.analysis import job_summary
    from dpcore.read.dashboard import data
    from dpcore.read.rundir import load_run

    run = make_run(tmp_path / "profiles", "20250103-120000-mlp", seed=3)
    real = data.cached_trace_steps
    monkeypatch.setattr(data, "cached_trace_steps", lambda *_: st.stop())  # reading, not done
    at = start(tmp_path / "profiles", monkeypatch)
    assert not at.exception and heading(at) == "Overview"
    assert any(i.value.startswith("Reading the traces of run 20250103-120000-mlp once") for i in at.info)
    shown = at.dataframe[0].value.set_index("job_id")
    want = job_summary(load_run(run), None).set_index("job_id")
    assert shown["step_ms"].round(6).fillna(-1).tolist() == want["step_ms"].round(6).fillna(-1).tolist()
    assert shown.loc["ring-ws2", "step_ms"] > 0 and not at.get("plotly_chart")  # the page waits for the traces
    monkeypatch.setattr(data, "cached_trace_steps", real)
    at.run()  # the read done: the page, no preview
    assert not problems(at) and len(at.get("plotly_chart")) == 1
    assert not any(i.value.startswith("Reading the traces") for i in at.info)
    assert at.sidebar.selectbox(key="run_a").value == "20250103-120000-mlp"
    at.run()  # warm: nothing is read again, nothing previewed
    assert not any(i.value.startswith("Reading the traces") for i in at.info) and len(at.dataframe) == 1
    assert gc.get_freeze_count() == 0  # AppTest is no served app: server_gc leaves this process alone


def test_pickers_drawn_after_the_page_sit_under_the_title_and_pick_what_it_shows(
        two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """app.py draws the page before the run pickers (picker.planned_runs: the first chart after a
    reload comes sooner) into their place under the sidebar's title; the page must show the run
    the picker shows, on the first run (the default) and after a pick."""
    at = start(two_runs, monkeypatch)
    # depth first, the navigation left out: the pickers inside their block, under the title
    shown = [type(e).__name__ for e in at.sidebar if type(e).__name__ != "SpecialBlock"]
    assert shown == ["Title", "Caption", "Block", "Selectbox", "Toggle"], shown
    assert at.sidebar.selectbox(key="run_a").value == "20250102-120000-mlp"  # newest complete
    newest = at.dataframe[0].value
    at.sidebar.selectbox(key="run_a").set_value("20250101-120000-mlp").run()
    assert not problems(at)
    picked = at.dataframe[0].value
    assert not picked.equals(newest)  # the page followed the picker in the same run
    # and it is the table of that run, as a session opened on it shows
    monkeypatch.setenv("DPCORE_PROFILES", str(two_runs))
    fresh = AppTest.from_file(APP, default_timeout=60)
    fresh.session_state["run_a"] = "20250101-120000-mlp"
    fresh.run()
    assert fresh.sidebar.selectbox(key="run_a").value == "20250101-120000-mlp"
    assert fresh.dataframe[0].value.equals(picked)
