"""Hostile or broken profiles folders: one bad run must never take the dashboard down.

Why: the profiles folder holds whatever people copy into it (other machines' runs, hand-edited
run.json files, symlinks, named pipes). Each case here was a reported defect: a malformed run
crashed the page, a special file hung it or exhausted memory, a symlink made it read outside
the folder, and run data was rendered as Markdown.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dpcore.contract import runformat as rf
from dpcore.contract import tracefile as tf
from dpcore.read import rundir as R
from dpcore.read.rundir import load
from dpcore.read.traces import read_trace
from tests.app_pages import data_problems, open_page
from tests.fixtures_run import make_run

APP = str(Path(__file__).resolve().parents[3] / "app.py")
GOOD = "20230101-000000-good"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small complete run, copied by the tests that damage it."""
    return make_run(tmp_path_factory.mktemp("tpl"), GOOD, steps=3, profiled=1)


def copy_run(template: Path, root: Path, name: str) -> Path:
    dst = root / name
    shutil.copytree(template, dst)
    return dst


def edit_meta(run: Path, **changes: object) -> None:
    meta = json.loads((run / rf.RUN_JSON).read_text())
    meta.update(changes)
    (run / rf.RUN_JSON).write_text(json.dumps(meta))


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the body blocks, e.g. on opening a FIFO."""
    def _alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for more than {seconds} s")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def plain(markdown: str) -> str:
    """What a Markdown body shows: backslash escapes removed."""
    return re.sub(r"\\(.)", r"\1", markdown)


def start(root: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("DPCORE_PROFILES", str(root))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    return at


# --- 1. malformed run.json ----------------------------------------------------------------------

BAD_SHAPES = {"config-str": {"config": "x"}, "environment-list": {"environment": [1, 2]},
              "jobs-str": {"jobs": "x"}, "jobs-of-ints": {"jobs": [1, 2]}, "run_id-list": {"run_id": [1]}}


@pytest.mark.parametrize("change", list(BAD_SHAPES), ids=list(BAD_SHAPES))
def test_malformed_run_json_shape_is_one_warning(template: Path, tmp_path: Path, change: str) -> None:
    copy_run(template, tmp_path, GOOD)
    bad = copy_run(template, tmp_path, "20240101-000000-bad")
    edit_meta(bad, **BAD_SHAPES[change])
    runs, warnings = R.list_runs(tmp_path)
    assert list(runs["run_id"]) == [GOOD]
    assert len(warnings) == 1 and str(bad / rf.RUN_JSON) in warnings[0], warnings
    with pytest.raises(R.RunLoadError, match="run.json"):
        R.load_run(bad)


def test_deeply_nested_run_json_is_one_warning(template: Path, tmp_path: Path) -> None:
    copy_run(template, tmp_path, GOOD)
    bad = tmp_path / "20240101-000000-deep"
    bad.mkdir()
    (bad / rf.RUN_JSON).write_text('{"run_id": "x", "config": ' + "[" * 200_000 + "]" * 200_000 + "}")
    runs, warnings = R.list_runs(tmp_path)
    assert list(runs["run_id"]) == [GOOD]
    assert len(warnings) == 1 and "run.json" in warnings[0] and "nested" in warnings[0], warnings


def test_non_utf8_folder_name_is_skipped_with_a_warning(template: Path, tmp_path: Path) -> None:
    copy_run(template, tmp_path, GOOD)
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/run-\xff\xfe"))
    shutil.copytree(template, odd)
    runs, warnings = R.list_runs(tmp_path)
    assert list(runs["run_id"]) == [GOOD]
    assert len(warnings) == 1 and "UTF-8" in warnings[0]
    warnings[0].encode("utf-8")  # printable and hashable by Streamlit's cache


def test_app_survives_malformed_runs(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy_run(template, tmp_path, GOOD)
    edit_meta(copy_run(template, tmp_path, "20240101-000000-cfg"), config="x")
    edit_meta(copy_run(template, tmp_path, "20240102-000000-env"), environment=[1, 2])
    shutil.copytree(template, Path(os.fsdecode(bytes(tmp_path) + b"/run-\xff")))
    at = start(tmp_path, monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    assert [o.split(" · ")[0] for o in at.sidebar.selectbox(key="run_a").options] == [GOOD]
    assert len(data_problems(at)) == 1 and data_problems(at)[0].count("\n- ") >= 2  # one box, a line per run
    for title in ("Overview", "Runs"):
        open_page(at, title)
        assert not at.exception and not at.error


# --- 2. special files ---------------------------------------------------------------------------

def test_fifo_csv_is_refused_without_blocking(template: Path, tmp_path: Path) -> None:
    run = copy_run(template, tmp_path, GOOD)
    (run / "steps.csv").unlink()
    os.mkfifo(run / "steps.csv")
    refused = "steps.csv.*not a regular file|not a regular file.*steps.csv"
    with deadline(5), pytest.raises(R.RunLoadError, match=refused):
        R.load_run(run)
    with deadline(5):
        runs, warnings = R.list_runs(tmp_path)
    assert runs.empty and "steps.csv" in warnings[0]


def test_fifo_run_json_is_refused_without_blocking(template: Path, tmp_path: Path) -> None:
    run = copy_run(template, tmp_path, GOOD)
    (run / rf.RUN_JSON).unlink()
    os.mkfifo(run / rf.RUN_JSON)
    with deadline(5), pytest.raises(R.RunLoadError, match="run.json"):
        R.load_run(run)


def test_device_file_is_refused(template: Path, tmp_path: Path) -> None:
    run = copy_run(template, tmp_path, GOOD)
    (run / "collectives.csv").unlink()
    (run / "collectives.csv").symlink_to("/dev/zero")
    with deadline(5), pytest.raises(R.RunLoadError, match="collectives.csv"):
        R.load_run(run)


def test_oversized_run_file_is_refused(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = copy_run(template, tmp_path, GOOD)
    monkeypatch.setattr(load, "MAX_RUN_FILE_BYTES", 100)
    with pytest.raises(R.RunLoadError, match="larger than"):
        R.load_run(run)


def test_fifo_and_oversized_traces_are_refused(template: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    run = copy_run(template, tmp_path, GOOD)
    trace = rf.trace_dir(run, "ring-ws2") / rf.rank_trace_name(0)
    os.mkfifo(tmp_path / "pipe.json")
    with deadline(5), pytest.raises(tf.TraceFormatError, match="not a regular file"):
        read_trace(tmp_path / "pipe.json")
    with deadline(5), pytest.raises(tf.TraceFormatError, match="not a regular file"):
        list(tf.iter_trace_bytes("/dev/zero"))
    monkeypatch.setattr(tf, "MAX_TRACE_FILE_BYTES", 10)
    with pytest.raises(tf.TraceFormatError, match="larger than"):
        read_trace(trace)


# --- 3. symlinks out of the profiles folder -----------------------------------------------------

def test_run_folder_linked_outside_is_not_read(template: Path, tmp_path: Path) -> None:
    """The folder is refused before any of its files is opened: its run.json is a FIFO that
    would block a reader."""
    from dpcore.read.dashboard import data

    root, outside = tmp_path / "profiles", tmp_path / "elsewhere"
    root.mkdir()
    copy_run(template, root, GOOD)
    out = copy_run(template, outside, "20990101-000000-out")
    (out / rf.RUN_JSON).unlink()
    os.mkfifo(out / rf.RUN_JSON)
    (root / out.name).symlink_to(out)
    with deadline(5), pytest.raises(R.RunLoadError, match="outside"):
        R.load_run(root / out.name, root=root)
    with deadline(10):
        runs, warnings = data.cached_runs(root)
    assert list(runs["run_id"]) == [GOOD]
    assert any("outside the profiles folder" in w for w in warnings)


def test_run_file_linked_outside_is_not_read(template: Path, tmp_path: Path) -> None:
    root = tmp_path / "profiles"
    run = copy_run(template, root, GOOD)
    secret = tmp_path / "secret.csv"
    shutil.copy(run / "steps.csv", secret)
    (run / "steps.csv").unlink()
    (run / "steps.csv").symlink_to(secret)
    with pytest.raises(R.RunLoadError, match="steps.csv.*outside"):
        R.load_run(run, root=root)
    with pytest.raises(R.RunLoadError, match="steps.csv is a link that leads outside"):
        R.load_run(run)  # an explicit path (the CLI): no run file is read through a link out of the run


def test_rank_trace_linked_outside_is_not_used(template: Path, tmp_path: Path) -> None:
    from dpcore.read.dashboard import data

    root = tmp_path / "profiles"
    run = copy_run(template, root, GOOD)
    trace = rf.trace_dir(run, "ring-ws2") / rf.rank_trace_name(1)
    secret = tmp_path / "secret.json.gz"
    shutil.move(trace, secret)
    trace.symlink_to(secret)
    loaded = R.load_run(run, root=root)
    assert trace not in loaded.rank_trace_files("ring-ws2")
    assert "rank1" not in loaded.trace_files("ring-ws2")
    assert trace not in data.cached_run(run, root.resolve()).rank_trace_files("ring-ws2")
    assert trace not in R.load_run(run).rank_trace_files("ring-ws2")  # nor the CLI's: it leaves the run


# --- 6. duplicate run ids, Markdown injection ---------------------------------------------------

def test_duplicate_run_ids_open_their_own_folders(template: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    copy_run(template, tmp_path, GOOD)
    copy = copy_run(template, tmp_path, GOOD + "-copy")
    edit_meta(copy, created="2026-01-01T00:00:00+00:00")
    at = start(tmp_path, monkeypatch)
    box = at.sidebar.selectbox(key="run_a")
    assert len(set(box.options)) == 2, box.options
    open_page(at, "Runs")
    for folder in (GOOD, GOOD + "-copy"):
        at.sidebar.selectbox(key="run_a").set_value(folder).run()
        assert not at.exception
        jobs = [plain(e.label) for e in at.expander if e.label.startswith("Jobs of")]
        assert len(jobs) == 1 and jobs[0].startswith(f"Jobs of {folder} ("), jobs


def test_run_data_is_not_rendered_as_markdown(template: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    image = "![x](https://example.invalid/track.png)"
    run = copy_run(template, tmp_path, GOOD)
    meta = json.loads((run / rf.RUN_JSON).read_text())
    meta["run_id"] = f"**bold** {image}"
    meta["jobs"][0].update(status="failed", error=f"boom {image} [link](https://example.invalid)")
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    at = start(tmp_path, monkeypatch)
    open_page(at, "Runs")
    assert not at.exception
    bodies = [e.value for e in [*at.markdown, *at.error, *at.warning, *at.info, *at.caption]]
    shown = " ".join(bodies)
    assert "boom" in shown and "**bold**" in plain(shown)
    for body in bodies:
        assert "](" not in body and "**bold**" not in body, body


def test_a_run_whose_writer_died_is_listed_stale(tmp_path, monkeypatch):
    """A launcher killed with -9 leaves its run 'running' forever; the dashboard lists it 'stale'
    (its owner pid is gone on this host), while a live owner's run stays 'running'."""
    import json
    import socket
    import subprocess
    import sys

    from dpcore.read.dashboard import data
    from tests.fixtures_run import make_run
    root = tmp_path / "profiles"
    root.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for run_id, pid in (("20250101-000000-dead", dead.pid), ("20250102-000000-live", os.getpid())):
        run = make_run(root, run_id)
        meta = json.loads((run / "run.json").read_text())
        meta.update(status="running", owner={"pid": pid, "host": socket.gethostname()})
        (run / "run.json").write_text(json.dumps(meta))
    runs, warnings = data.cached_runs(root.resolve())
    status = dict(zip(runs["run_id"], runs["status"]))
    assert status == {"20250101-000000-dead": "stale", "20250102-000000-live": "running"}, (status, warnings)


def test_a_damaged_cell_skips_its_row_with_a_warning_not_the_run(tmp_path, capsys, samples):
    """One unreadable number in steps.csv (and garbage rows in grads.csv / memory.csv, files
    written by hand) used to fail every command on the run ('invalid literal for int()'); now
    that row is skipped, named by line, and everything else is read."""
    import shutil

    from dpcore.cli import main
    from dpcore.read.rundir import load_run

    sample = samples / "sample-train"
    if not sample.is_dir():
        pytest.skip("no committed sample run")
    run = tmp_path / "damaged"
    shutil.copytree(sample, run)
    lines = (run / "steps.csv").read_text().splitlines()
    cells = lines[3].split(",")
    cells[5] = "x"  # the step column of file line 4
    lines[3] = ",".join(cells)
    (run / "steps.csv").write_text("\n".join(lines) + "\n")
    with open(run / "grads.csv", "a") as f:
        f.write("bucketed-ws2-b25,0,notanint,3,x,12,\n")
    good = load_run(sample)
    bad = load_run(run)
    assert len(bad.steps) == len(good.steps) - 1 and len(bad.grads) == len(good.grads)
    assert bad.steps["step"].dtype.kind == "i"
    assert any("steps.csv: 1 row(s) with unreadable numbers skipped (line 4)" in w for w in bad.warnings)
    assert any("grads.csv: 1 row(s)" in w for w in bad.warnings)
    assert main(["summarize", str(run), "--csv"]) == 0
    captured = capsys.readouterr()
    assert "warning:" in captured.err and "job_id,variant" in captured.out
    assert main(["whatif", str(run), "--job", "bucketed-ws2-b25", "--world-sizes", "2", "--csv"]) == 0
