"""The read wing's split between loading, analysis and command text.

- ``dpcore.read.report``: one table formatter (table_text.py) and one "is this PATH a run or traces?"
  answer (resolve.py), used by every command.
- ``dpcore.read.analysis``: DataFrames in, DataFrames out: once a run and its traces are loaded,
  no analysis function touches the disk again (checked by making every loader fail).
"""
from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.contract.units import percent
from dpcore.read.analysis import job_summary, step_metrics, timeline
from dpcore.read.report.resolve import resolve
from dpcore.read.report.table_text import csv_table, text_table
from dpcore.read.rundir import load, load_run
from tests import events_path
from tests.events_path import job_trace_events, lanes_of, step_trace_events, trace_step_metrics, traced_job_events
from tests.fixtures_run import make_run

REPORT = Path(__file__).resolve().parents[3] / "dpcore" / "read" / "report"


def test_text_table_two_decimals_and_a_dash_for_empty_cells() -> None:
    """An empty cell reads '—' in every command, as on the dashboard (never 'NaN' or '-')."""
    df = pd.DataFrame({"rank": [0, 1], "overlap_pct": [12.345, np.nan], "source": ["trace", "intervals"]})
    assert text_table(df).splitlines() == [" rank  overlap_pct    source",
                                           "    0        12.35     trace",
                                           "    1            — intervals"]
    # per-column formatters through the same function (the end-of-run table's percentages)
    assert text_table(df[["overlap_pct"]], formatters={"overlap_pct": percent}).splitlines() == [
        "overlap_pct", "      12.3%", "          —"]


def test_csv_table_four_decimals_no_index() -> None:
    df = pd.DataFrame({"job_id": ["a", "b"], "comm_ms": [1.23456, np.nan]})
    assert csv_table(df) == "job_id,comm_ms\na,1.2346\nb,\n"


def test_one_formatter_and_one_resolver_in_report() -> None:
    """Only table_text.py renders tables and only resolve.py decides what a PATH is: a command that
    formats or resolves on its own fails here."""
    for f in sorted(REPORT.glob("*.py")):
        text = f.read_text(encoding="utf-8")
        if f.name != "table_text.py":
            assert not re.search(r"\.to_(string|csv)\(", text), f"{f.name} formats a table itself"
        if f.name != "resolve.py":
            assert "RUN_JSON" not in text and '"run.json"' not in text, f"{f.name} resolves PATH itself"


def test_resolve_run_traces_and_missing(tmp_path: Path) -> None:
    run = make_run(tmp_path / "profiles")
    trace_dir = run / "traces" / "ring-ws2"
    one = sorted(trace_dir.glob("rank*"))[0]
    assert resolve(str(run)) == (run, "run")
    assert resolve(trace_dir) == (trace_dir, "traces")
    assert resolve(one) == (one, "traces")
    (tmp_path / "plain").mkdir()
    assert resolve(tmp_path / "plain") == (tmp_path / "plain", "traces")  # no run.json: traces, maybe none
    with pytest.raises(ValueError, match=r"^no such file or directory: .*nowhere$"):
        resolve(tmp_path / "nowhere")


def test_analyze_and_stragglers_answer_a_missing_path_alike(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    assert main(["analyze", str(missing)]) == 2
    assert main(["stragglers", str(missing)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: no such file or directory: {missing}"] * 2


def test_analysis_never_touches_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Load first (rundir), then make every loader fail: the analysis gives the same numbers
    from the loaded frames alone."""
    run = load_run(make_run(tmp_path / "profiles"))
    job = "bucketed-ws2-b25"
    step = run.traced_steps(job)[0]
    timed = int(run.steps.loc[(run.steps["job_id"] == job) & ~run.steps["profiled"], "step"].iloc[0])
    pairs = list(traced_job_events(run))
    assert job in dict(pairs)
    events = job_trace_events(run, job)
    assert step_trace_events(run, job, timed) is None  # a timed step: not traced, nothing read
    job_lanes = lanes_of(events)
    lanes = timeline(run, job, step, job_lanes)
    assert set(lanes["lane"]) == {"compute", "comm"} and set(lanes["rank"]) == {0, 1}
    per_step = trace_step_metrics(pairs)
    summary = job_summary(run, per_step)
    rows = step_metrics(run.steps, run.collectives, per_step)

    def no_disk(*args: object, **kwargs: object) -> None:
        raise AssertionError("analysis touched the disk")

    monkeypatch.setattr(load.Run, "trace_files", no_disk)
    monkeypatch.setattr(events_path, "read_trace_files", no_disk)
    with pytest.raises(AssertionError, match="touched the disk"):  # the trap works
        job_trace_events(run, job)
    assert timeline(run, job, step, job_lanes).equals(lanes)
    assert not timeline(run, job, timed, None).empty  # from steps.csv and collectives.csv
    assert trace_step_metrics(pairs).equals(per_step)
    assert job_summary(run, per_step).equals(summary)
    assert step_metrics(run.steps, run.collectives, per_step).equals(rows)
    # the trace numbers reach the summary: the job's comm comes from its traces
    assert summary.set_index("job_id").at[job, "comm_source"] == "trace"


def test_summarize_an_allreduce_run_prints_its_bandwidth_table(tmp_path: Path, samples: Path) -> None:
    from dpcore.read.report.allreduce import ALLREDUCE_TABLE
    from dpcore.read.report.summarize import summarize

    if not (samples / "sample-allreduce" / "run.json").exists():
        pytest.skip("sample runs not present")
    out = summarize(str(samples / "sample-allreduce"))
    header = next(line for line in out.splitlines() if line.split()[:1] == ["algo"])
    assert header.split() == ALLREDUCE_TABLE
    assert "16 MiB" in out and "repeats" in out
    # a run written with the correctness check: its #wrong counts are printed, wrong ones loudly
    run = shutil.copytree(samples / "sample-allreduce", tmp_path / "checked")
    meta = json.loads((run / "run.json").read_text())
    for j in meta["jobs"]:
        j["wrong_elements"] = {str(b): (3 if j["id"] == "ring-ws2" and b == 1024 else 0)
                               for b in meta["config"]["sizes"]}
    (run / "run.json").write_text(json.dumps(meta))
    out = summarize(str(run))
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("ring", "native"))]
    assert {r[-1] for r in rows} == {"0", "3"}
    assert "WRONG RESULTS: ring at 2 ranks, 1 KiB: 3 element(s)" in out


def test_analyze_reads_the_ranks_of_a_merged_trace(capsys: pytest.CaptureFixture[str], samples: Path) -> None:
    """The README promotes merged.json.gz and says analyze reads single trace files: its ranks come
    from its process names ('rank 0', 'rank 1'), and each rank's numbers are those of its own file
    (each rank classified apart: read as one rank, rank 1's compute came out 0)."""
    job = samples / "sample-train" / "traces" / "bucketed-ws2-b1"
    if not (job / "merged.json.gz").is_file():
        pytest.skip("sample runs not present")
    assert main(["analyze", str(job / "merged.json.gz"), "--csv"]) == 0
    merged = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert main(["analyze", str(job), "--csv"]) == 0  # the folder: rank0/rank1 files, merged never counts
    per_rank = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(merged["rank"]) == [0, 1] and (merged["compute_ms"] > 0).all()
    pd.testing.assert_frame_equal(merged, per_rank)
    assert main(["analyze", str(job / "merged.json.gz")]) == 0
    assert "a merged trace: ranks 0, 1 read from its process names" in capsys.readouterr().out


def test_summarize_prints_whole_samples_per_second(tmp_path: Path) -> None:
    """samples/s reads as the Overview and profile's end table show it ("2,794"), never "2794.00"."""
    from dpcore.read.report.summarize import run_end_table, summarize

    run = make_run(tmp_path)
    lines = summarize(str(run)).splitlines()
    header = lines[1].split()
    col = header.index("samples/s")
    cells = [ln.split()[col] for ln in lines[2:] if ln.strip() and len(ln.split()) == len(header)]
    assert cells and all(re.fullmatch(r"\d{1,3}(,\d{3})*|—", c) for c in cells), cells
    assert any("," in c for c in cells)  # the synthetic jobs run above 1,000 samples/s
    end = run_end_table(str(run))[0]
    assert all(c in end for c in cells if c != "—")  # the same text as profile's end table


def test_summarize_prints_a_dash_not_nan_for_a_hook_job_without_rows(tmp_path: Path, samples: Path) -> None:
    """A run whose CSVs hold only headers: the comm hooks' compression lines say '—' for every
    number the rows would give (never 'nan'), and keep what run.json holds (the loss)."""
    from dpcore.read.report.summarize import summarize

    run = tmp_path / "run"
    shutil.copytree(samples / "sample-train", run, ignore=shutil.ignore_patterns("traces"))
    for f in run.glob("*.csv"):
        f.write_text(f.read_text().splitlines()[0] + "\n")
    text = summarize(str(run))
    lines = [ln for ln in text.splitlines() if "torch_ddp-ws2-b25-fp16: wire" in ln]
    assert len(lines) == 1 and "nan" not in text
    assert "wire — of — MiB/step (— saved), — collectives/step, step — ms" in lines[0]
    assert "loss after 12 steps 2.307601" in lines[0]
