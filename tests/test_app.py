"""The Streamlit app, driven headless with `streamlit.testing.v1.AppTest`.

Why: every view must render on a realistic run without an exception, compare mode must work,
and an empty, corrupt or foreign profiles folder must give a clear page instead of a traceback.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.fixtures_run import make_corrupt_runs, make_run

APP = str(Path(__file__).resolve().parents[1] / "app.py")
VIEWS = ["Runs", "Overview", "Timeline", "Scaling", "Stragglers", "Ring messages", "Bandwidth", "Buckets", "Traces",
         "New run", "Import"]


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


def problems(at: AppTest) -> list[str]:
    """Exceptions and st.error boxes on the page (a view that failed inside `safely`)."""
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]


def test_every_view_renders(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(two_runs, monkeypatch)
    assert not problems(at)
    assert at.sidebar.selectbox(key="run_a").value == "20250102-120000-mlp"  # newest complete
    for view in VIEWS:
        at.sidebar.radio(key="view").set_value(view).run()
        assert not problems(at), (view, problems(at))
        if view not in ("Runs", "Traces", "New run", "Import"):
            assert at.get("plotly_chart"), f"{view} drew no chart"
    at.sidebar.radio(key="view").set_value("Runs").run()
    warnings = plain(" ".join(w.value for w in at.warning))
    assert "Oversubscribed" in warnings and "data_parallel needs 2 or more GPUs" in warnings


def test_compare_mode(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(two_runs, monkeypatch)
    at.sidebar.toggle(key="compare").set_value(True).run()
    assert at.sidebar.selectbox(key="run_b").value == "20250101-120000-mlp"
    for view in ("Overview", "Scaling", "Timeline"):
        at.sidebar.radio(key="view").set_value(view).run()
        assert not problems(at), (view, problems(at))
        subheaders = [s.value for s in at.subheader]
        assert any("20250101" in s for s in subheaders) and any("20250102" in s for s in subheaders)
    at.sidebar.radio(key="view").set_value("Overview").run()
    assert len(at.get("plotly_chart")) == 3  # comparison + one breakdown per run


def test_timeline_switches_job_and_step(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(two_runs, monkeypatch)
    at.sidebar.radio(key="view").set_value("Timeline").run()
    job = next(s for s in at.selectbox if s.label == "Job")
    job.set_value("ring-ws4").run()
    assert not problems(at)
    step = next(s for s in at.selectbox if s.label == "Step")
    step.set_value(0).run()  # an untraced step: drawn from steps/collectives
    assert not problems(at) and at.get("plotly_chart")


def test_empty_profiles_folder_offers_quick_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(tmp_path, monkeypatch)
    assert not at.exception
    assert "No profiling runs yet" in at.title[0].value
    assert at.button(key="quick").label == "Run a quick CPU profile"


def test_missing_profiles_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = start(tmp_path / "does-not-exist", monkeypatch)
    assert not at.exception and "No profiling runs yet" in at.title[0].value


def test_corrupt_runs_warn_and_the_good_one_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_run(tmp_path, "20230101-000000-good")
    make_corrupt_runs(tmp_path)
    at = start(tmp_path, monkeypatch)
    assert not at.exception
    text = plain(" ".join(w.value for w in at.warning))
    assert "run.json" in text and "steps.csv" in text, text
    assert "20230101-000000-good" in at.sidebar.selectbox(key="run_a").options[-1] or \
        "20230101-000000-good" in " ".join(at.sidebar.selectbox(key="run_a").options)
    at.sidebar.selectbox(key="run_a").set_value("20230101-000000-good").run()
    for view in ("Overview", "Timeline"):
        at.sidebar.radio(key="view").set_value(view).run()
        assert not problems(at), problems(at)


def test_symlink_out_of_the_profiles_folder_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, outside = tmp_path / "profiles", tmp_path / "elsewhere"
    make_run(root, "20230101-000000-good")
    make_run(outside, "20990101-000000-outside")
    (root / "20990101-000000-outside").symlink_to(outside / "20990101-000000-outside")
    at = start(root, monkeypatch)
    assert not at.exception
    assert [o.split(" · ")[0] for o in at.sidebar.selectbox(key="run_a").options] == ["20230101-000000-good"]
    assert any("outside the profiles folder" in plain(w.value) for w in at.warning)


def test_quick_profile_progress_and_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One click starts the profiler; its JSON progress lines are followed and the run is opened.

    The real profiler is replaced by a tiny script that prints the documented progress events and
    writes a fixture run, so the test exercises the subprocess plumbing without training anything.
    """
    from dpcore.read.dashboard import launcher

    run_dir = tmp_path / "20990101-000000-quick"
    script = (
        "import json,sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
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
    assert at.sidebar.selectbox(key="run_a").value == run_dir.name
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
    view draws it."""
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
    for view in ("Overview", "Timeline", "Scaling", "Ring messages", "Traces"):
        at.sidebar.radio(key="view").set_value(view).run()
        assert not problems(at), (view, problems(at))
        if view != "Traces":
            assert at.get("plotly_chart"), f"{view} drew no chart"
