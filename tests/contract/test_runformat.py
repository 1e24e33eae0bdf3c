"""The run-format contract (dpcore.contract.runformat) against docs/DESIGN.md and odd writers."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from dpcore.contract import runformat as rf
from dpcore.read.rundir import load_run

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
#: Where new requirements of the shared contract arrive (beside the checkout; absent on a user's clone).
SHARED_DESIGN = ROOT.parent / "shared" / "DESIGN.md"


def _design_columns(table: str, design: Path = DESIGN) -> list[str]:
    """The column list docs/DESIGN.md gives for ``<table>.csv`` (prose, so parse it loosely)."""
    text = design.read_text(encoding="utf-8")
    if table == "allreduce":
        m = re.search(r"allreduce\.csv\s+one row per \(allreduce job, size\):\s*(.*?)\ntraces/", text, re.S)
    else:
        m = re.search(rf"{table}\.csv columns:(.*?)\n\n", text, re.S)
    assert m, f"docs/DESIGN.md has no column list for {table}.csv"
    body = re.sub(r"\([^)]*\)", "", m.group(1))  # drop "(bool)", "(time the main thread ...)"
    cells = (c.strip().strip(".").strip() for c in re.split(r"[,\n]", body))
    return [c for c in cells if c]


@pytest.mark.parametrize("table", sorted(rf.TABLES))
def test_columns_match_design(table: str) -> None:
    """Every table the code writes has exactly the columns docs/DESIGN.md documents."""
    assert rf.TABLES[table] == _design_columns(table)


@pytest.mark.skipif(not SHARED_DESIGN.exists(), reason="../shared/DESIGN.md is not beside the checkout")
@pytest.mark.parametrize("table", sorted(rf.DESIGN_TABLES))
def test_repository_contract_keeps_the_shared_one(table: str) -> None:
    """docs/DESIGN.md carries the shared contract's tables unchanged (new requirements arrive there)."""
    assert _design_columns(table) == _design_columns(table, SHARED_DESIGN)


@pytest.mark.parametrize("text,want", [("True", True), ("False", False), ("true", True), ("1", True),
                                       ("0", False), ("", False), (True, True), (0, False), (1.0, True),
                                       (float("nan"), False), (" FALSE ", False)])
def test_parse_bool_reads_every_spelling(text, want) -> None:
    assert rf.parse_bool(text) is want


def test_parse_bool_rejects_garbage_and_parse_bools_treats_it_as_untraced() -> None:
    with pytest.raises(ValueError, match="True/False"):
        rf.parse_bool("maybe")
    assert rf.parse_bools(["True", "maybe", "0", "1"]) == [True, False, False, True]


@pytest.mark.parametrize("cell,want", [("", None), (None, None), ("123", 123), (123, 123), (-1, None),
                                       ("1.7e3", 1700), ("nan", None)])
def test_parse_ns(cell, want) -> None:
    assert rf.parse_ns(cell) == want


def test_parse_ns_rejects_text_and_format_round_trips() -> None:
    with pytest.raises(ValueError, match="nanosecond"):
        rf.parse_ns("yesterday")
    assert rf.format_ns(None) == "" and rf.format_ns(-1) == "" and rf.format_ns(5) == 5
    assert rf.parse_ns(rf.format_ns(None)) is None and rf.parse_ns(rf.format_ns(42)) == 42


def test_job_ids_and_trace_paths() -> None:
    assert rf.job_id("bucketed", 2, 25.0) == "bucketed-ws2-b25"
    assert rf.job_id("torch_ddp", 4, 0.5) == "torch_ddp-ws4-b0.5"
    assert rf.job_id("ring", 2, 25.0) == "ring-ws2"
    assert rf.allreduce_job_id("native", 4) == "native-ws4"
    assert rf.trace_dir("/r", "ring-ws2") == Path("/r/traces/ring-ws2")
    assert rf.rank_trace_name(3) == "rank3.json.gz"
    assert [rf.trace_key(n) for n in ("rank0.json.gz", "merged.json", "notes.txt", ".json")] == \
        ["rank0", "merged", None, None]
    assert rf.is_rank_trace("rank12") and not rf.is_rank_trace("merged") and not rf.is_rank_trace("rankx")
    with pytest.raises(ValueError, match="valid: steps, collectives, messages, allreduce, grads, memory, comm_calls"):
        rf.table_file("jobs")


def test_loader_reads_profiled_however_it_was_written(tmp_path: Path) -> None:
    """A hand-written or foreign steps.csv with 1/0 or true/false gives the same traced steps."""
    run = tmp_path / "r"
    (run / rf.TRACES_DIR / "j").mkdir(parents=True)
    (run / rf.TRACES_DIR / "j" / rf.rank_trace_name(0)).write_text('{"traceEvents": []}')
    (run / rf.RUN_JSON).write_text('{"run_id": "r", "config": {}, "jobs": [{"id": "j", "kind": "train"}]}')
    rows = [{c: 0 for c in rf.STEP_COLUMNS} | {"job_id": "j", "step": s, "profiled": p, "step_ms": 1.0}
            for s, p in enumerate(["1", "0", "true", "False"])]
    pd.DataFrame(rows, columns=rf.STEP_COLUMNS).to_csv(run / rf.table_file("steps"), index=False)
    loaded = load_run(run)
    assert loaded.steps["profiled"].tolist() == [True, False, True, False]
    assert loaded.traced_steps("j") == [0, 2]
    (run / rf.TRACES_DIR / "j" / rf.rank_trace_name(0)).unlink()
    assert load_run(run).traced_steps("j") == []  # profiled, but the traces are gone


def test_committed_samples_written_before_the_contract_still_load(samples: Path) -> None:
    if not (samples / "sample-train").is_dir():
        pytest.skip("the sample run sample-train is absent")
    run = load_run(samples / "sample-train")
    assert set(rf.STEP_COLUMNS) <= set(run.steps.columns) and run.steps["profiled"].dtype == bool
    assert run.traced_steps("bucketed-ws2-b25") == sorted(
        run.steps.loc[(run.steps.job_id == "bucketed-ws2-b25") & run.steps.profiled, "step"].unique())
    assert len(run.traced_steps("bucketed-ws2-b25")) == run.meta["config"]["profile_steps"]
