"""Damaged run content is named, never silently averaged (issue 25 items 5, 6 and 9).

Item 5: a missing, truncated or unreadable rank trace used to change a job's overlap with no
word (rank 0's trace removed: 52 % -> 5 %; truncated: silently the interval method). Now such a
job's numbers are its recorded intervals over every rank, and one line names the file.
Item 6: duplicated rows, negative or infinite step times, a missing rank and a job id listed
twice became wrong numbers with exit 0. Item 9: crafted job ids (``../..``, absolute paths)
made the CLI read outside the run.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dpcore.contract import runformat as rf
from dpcore.read.report.summarize import summary_table
from dpcore.read.rundir import RunLoadError, load_run
from tests.app_pages import data_problems, open_page
from tests.fixtures_run import make_run

ROOT = Path(__file__).resolve().parents[3]
JOB = "bucketed-ws2-b25"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("tpl"), "20250101-000000-t", steps=3, profiled=1)


@pytest.fixture(scope="module")
def intact(template: Path) -> pd.DataFrame:
    return summary_table(load_run(template)).set_index("job_id")


def copy(template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / template.name))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcore", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


# --- item 5: rank traces -----------------------------------------------------------------------

def _damage(run: Path, how: str) -> Path:
    f = rf.trace_dir(run, JOB) / rf.rank_trace_name(0)
    if how == "missing":
        f.unlink()
    elif how == "truncated":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    else:  # unreadable: not a trace at all
        f.write_bytes(b"this is not json")
    return f


@pytest.mark.parametrize("how", ["missing", "truncated", "unreadable"])
def test_a_damaged_rank_trace_is_named_and_the_job_uses_every_ranks_intervals(template, intact, tmp_path, capsys,
                                                                              how):
    run = copy(template, tmp_path)
    f = _damage(run, how)
    assert intact.loc[JOB, "comm_source"] == "trace"  # intact, the trace is the source
    s = summary_table(load_run(run)).set_index("job_id")
    row = s.loc[JOB]
    assert row["comm_source"] == "intervals"
    assert row["overlap_pct"] == pytest.approx(intact.loc[JOB, "overlap_pct_intervals"])  # every rank's
    other = s.drop(index=JOB)
    pd.testing.assert_frame_equal(other, intact.drop(index=JOB))  # no other job changed
    out = cli("summarize", str(run), "--csv")
    assert out.returncode == 0, out.stderr
    named = [ln for ln in out.stderr.splitlines() if f"job {JOB}" in ln]
    assert len(named) == 1 and str(f) in named[0] and "recorded intervals of all ranks" in named[0], out.stderr


@pytest.mark.parametrize("how", ["missing", "sparse"])
def test_the_dashboard_names_a_missing_or_hostile_rank_trace(template, tmp_path, monkeypatch, how):
    """The default page reads every job's traces: a sparse 2 GiB rank trace once kept it from
    rendering for 300 s; now the page renders (AppTest's timeout is the guard) and names it."""
    from streamlit.testing.v1 import AppTest

    run = copy(template, tmp_path)
    f = _damage(run, "missing" if how == "missing" else "unreadable")
    if how == "sparse":
        with open(f, "wb") as fh:  # {"traceEvents":[ then a 2 GiB hole: no disk used
            fh.write(b'{"traceEvents":[')
            fh.truncate(2 << 30)
    monkeypatch.setenv("DPCORE_PROFILES", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.run()
    open_page(at, "Overview")
    assert not at.exception
    shown = " ".join(data_problems(at)).replace("\\", "")
    assert f.name in shown and JOB in shown, shown
    assert how == "missing" or "no complete event" in shown, shown


# --- item 6: CSV content -----------------------------------------------------------------------

def _steps(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / rf.table_file("steps"))


def _write_steps(run: Path, df: pd.DataFrame) -> None:
    df.to_csv(run / rf.table_file("steps"), index=False)


def test_duplicated_rows_do_not_double_throughput(template, intact, tmp_path):
    run = copy(template, tmp_path)
    s = _steps(run)
    _write_steps(run, pd.concat([s, s[s["job_id"] == JOB]]))
    loaded = load_run(run)
    assert any("duplicate row" in w and JOB in w for w in loaded.warnings), loaded.warnings
    assert summary_table(loaded).set_index("job_id").loc[JOB, "throughput"] == pytest.approx(
        intact.loc[JOB, "throughput"])


def test_duplicated_collectives_do_not_double_the_bytes(template, intact, tmp_path):
    run = copy(template, tmp_path)
    f = run / rf.table_file("collectives")
    c = pd.read_csv(f)
    pd.concat([c, c[c["job_id"] == JOB]]).to_csv(f, index=False)
    loaded = load_run(run)
    assert any("collectives.csv" in w and "duplicate row" in w and JOB in w for w in loaded.warnings)
    row = summary_table(loaded).set_index("job_id").loc[JOB]
    assert row["bus_mib_per_step"] == pytest.approx(intact.loc[JOB, "bus_mib_per_step"])


@pytest.mark.parametrize("value", [-5.0, float("inf")])
def test_negative_or_infinite_step_times_are_dropped_and_named(template, tmp_path, value):
    run = copy(template, tmp_path)
    s = _steps(run)
    hit = s.index[(s["job_id"] == JOB) & (s["step"] == 0) & (s["rank"] == 1)]
    s.loc[hit, "step_ms"] = value
    _write_steps(run, s)
    loaded = load_run(run)
    assert any("negative, infinite" in w and JOB in w for w in loaded.warnings), loaded.warnings
    mine = loaded.steps[loaded.steps["job_id"] == JOB]
    assert len(mine) == (s["job_id"] == JOB).sum() - 1 and (mine["step_ms"] > 0).all()
    row = summary_table(loaded).set_index("job_id").loc[JOB]
    assert 0 < row["step_ms"] < 1e6 and row["throughput"] > 0


def test_a_missing_rank_is_named_with_the_ranks_the_numbers_cover(template, tmp_path):
    run = copy(template, tmp_path)
    s = _steps(run)
    _write_steps(run, s[~((s["job_id"] == JOB) & (s["rank"] == 0))])
    out = cli("summarize", str(run))
    assert out.returncode == 0
    assert f"job {JOB} ran 2 rank(s) but has rows for rank(s) 1 (missing: 0); its numbers cover rank(s) 1 only" \
        in out.stderr, out.stderr


def test_a_job_id_listed_twice_is_listed_once(template, tmp_path):
    run = copy(template, tmp_path)
    meta = json.loads((run / rf.RUN_JSON).read_text())
    meta["jobs"].append(dict(meta["jobs"][2]))
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    loaded = load_run(run)
    assert loaded.jobs["job_id"].is_unique
    assert any("listed more than once" in w for w in loaded.warnings)
    table = summary_table(loaded)
    assert table["job_id"].is_unique


def test_an_intact_run_has_no_warning(template, samples):
    assert load_run(template).warnings == ()
    assert load_run(samples / "sample-train").warnings == ()


# --- item 9: job ids that leave the run --------------------------------------------------------

@pytest.mark.parametrize("command", ["summarize", "analyze", "stragglers"])
@pytest.mark.parametrize("crafted", ["../../outside", "ABSOLUTE"])
def test_the_cli_refuses_job_ids_that_leave_the_run(template, tmp_path, command, crafted):
    """A job id that points outside the run (relative or absolute) is refused in one line, exit
    2, before any file it points at is read (the dashboard refused them already)."""
    run = copy(template, tmp_path / "runs")
    outside = run.parent / "outside"  # what ../../outside resolves to from runs/<run>/traces/
    outside.mkdir()
    shutil.copy(rf.trace_dir(run, "ring-ws2") / rf.rank_trace_name(0), outside / rf.rank_trace_name(0))
    crafted = str(outside) if crafted == "ABSOLUTE" else crafted
    assert (run / rf.TRACES_DIR / crafted / rf.rank_trace_name(0)).is_file()  # the bait is there
    meta = json.loads((run / rf.RUN_JSON).read_text())
    old = meta["jobs"][0]["id"]
    meta["jobs"][0]["id"] = crafted
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    s = _steps(run)
    _write_steps(run, s.assign(job_id=s["job_id"].replace(old, crafted)))
    out = cli(command, str(run))
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert out.stderr.count("\n") == 1 and "is not a job id" in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(RunLoadError, match="would lead outside the run"):
        load_run(run)


def test_whatif_refuses_a_crafted_job_argument(template):
    out = cli("whatif", str(template), "--job", "../../../etc")
    assert out.returncode == 2 and out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
