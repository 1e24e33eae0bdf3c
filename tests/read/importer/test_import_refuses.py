"""``import`` refuses what cannot be one job's traces, by file name, exit 2 (issue 25, item 11):
a JSON list of numbers, a metadata-only trace, a rank beyond any world, ranks of different world
sizes or of different runs, and an ``--out`` that is a file or empty. Nothing is written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpcore.cli import main
from tests.synthetic import gpu_trace


def _write(path: Path, doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _shifted(rank: int, world_size: int, shift_us: float) -> dict:
    doc = gpu_trace(rank, world_size, steps=2, kernels_per_step=5)
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] += shift_us
    return doc


def _refused(argv: list[str], needle: str, out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err, err
    assert not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".")]


def test_a_json_list_of_numbers_is_no_trace(tmp_path, capsys) -> None:
    _write(tmp_path / "in" / "rank0.json", [1, 2, 3])
    _refused(["import", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
             "rank0.json: no trace events", tmp_path / "out", capsys)


def test_a_metadata_only_trace_is_no_trace(tmp_path, capsys) -> None:
    _write(tmp_path / "in" / "rank0.json", {"traceEvents": [],
                                              "distributedInfo": {"rank": 0, "world_size": 1}})
    _refused(["import", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
             "no trace events (an empty or metadata-only trace)", tmp_path / "out", capsys)


def test_a_rank_beyond_its_world_is_refused(tmp_path, capsys) -> None:
    doc = gpu_trace(0, 2, steps=2, kernels_per_step=5)
    doc["distributedInfo"]["rank"] = 10**12
    _write(tmp_path / "in" / "rank0.json", doc)
    _refused(["import", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
             "rank 1000000000000 cannot be a rank of its world of 2; valid ranks: 0..1",
             tmp_path / "out", capsys)
    del doc["distributedInfo"]["world_size"]  # no world size: bounded by MAX_RANK
    _write(tmp_path / "in" / "rank0.json", doc)
    _refused(["import", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
             "rank 1000000000000 cannot be a rank of a job; valid ranks: 0..1048575",
             tmp_path / "out", capsys)


def test_ranks_of_different_world_sizes_are_not_one_job(tmp_path, capsys) -> None:
    _write(tmp_path / "in" / "rank0.json", gpu_trace(0, 2, steps=2, kernels_per_step=5))
    _write(tmp_path / "in" / "rank1.json", gpu_trace(1, 4, steps=2, kernels_per_step=5))
    _refused(["import", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
             "traces of different world sizes", tmp_path / "out", capsys)


def test_ranks_of_different_runs_are_not_one_job(tmp_path, capsys) -> None:
    # same host (no host_name: one clock), rank 1 recorded an hour after rank 0 ended
    _write(tmp_path / "in" / "rank0.json", _shifted(0, 2, 0.0))
    _write(tmp_path / "in" / "rank1.json", _shifted(1, 2, 3600e6))
    _refused(["import", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
             "never overlap in time are not one job", tmp_path / "out", capsys)


def test_ranks_of_one_job_still_import(tmp_path, capsys) -> None:
    for r in range(2):
        _write(tmp_path / "in" / f"rank{r}.json", _shifted(r, 2, 0.0))
    assert main(["import", str(tmp_path / "in"), "--out", str(tmp_path / "out")]) == 0
    runs = [p for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")]
    assert len(runs) == 1 and json.loads((runs[0] / "run.json").read_text())["jobs"][0]["ranks"] == [0, 1]


@pytest.mark.parametrize("kind", ["file", "empty"])
def test_import_out_that_cannot_hold_a_run_is_exit_2(kind, tmp_path, capsys, monkeypatch) -> None:
    """Like ``profile --out``: a file in the way, or '' (which would be the current folder)."""
    _write(tmp_path / "in" / "rank0.json", _shifted(0, 1, 0.0))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "afile"
    out.write_text("x")
    arg = str(out) if kind == "file" else ""
    needle = "not a folder (a file is in the way)" if kind == "file" else "--out is empty"
    rc = main(["import", str(tmp_path / "in"), "--out", arg])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and needle in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "in"]  # nothing written


# --- the dashboard's Import page reads only under one allowed folder (issue 25, item 8) --------

def _page(root: Path):
    from streamlit.testing.v1 import AppTest
    script = ("from pathlib import Path\nimport streamlit as st\n"
              "from dpcore.read.dashboard.pages.import_traces import render\n"
              f"render(Path({str(root)!r}))\n")
    return AppTest.from_string(script, default_timeout=60).run()


def _import_from_page(at, path: str):
    at.radio(key="imp-source").set_value("A folder or file on this machine").run()
    at.text_input(key="imp-path").input(path).run()
    return at.button(key="imp-go").click().run()


def test_confined_refuses_what_lies_outside(tmp_path: Path) -> None:
    from dpcore.contract.errors import UsageError
    from dpcore.read.dashboard.pages.import_traces import confined
    allowed = (tmp_path / "allowed").resolve()
    (allowed / "job").mkdir(parents=True)
    assert confined(str(allowed / "job"), allowed) == allowed / "job"
    assert confined("job", allowed) == allowed / "job"  # relative: from the allowed folder
    (allowed / "escape").symlink_to(tmp_path)
    for bad in ("/", "/etc", "../", str(allowed / "job" / ".." / ".."), str(allowed / "escape"), "  "):
        with pytest.raises(UsageError):
            confined(bad, allowed)


def test_the_page_imports_only_under_the_allowed_folder(tmp_path: Path, monkeypatch) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    for r in range(2):
        _write(outside / f"rank{r}.json", _shifted(r, 2, 0.0))
        _write(allowed / "job" / f"rank{r}.json", _shifted(r, 2, 0.0))
    (allowed / "sneaky").mkdir()
    (allowed / "sneaky" / "rank0.json").symlink_to(outside / "rank0.json")  # a file leading out
    monkeypatch.setenv("DPCORE_IMPORT_ROOT", str(allowed))
    root = tmp_path / "profiles"
    at = _page(root)
    for path, needle in ((str(outside), "is outside"), ("/", "is outside"),
                         (str(allowed / "sneaky"), "leads outside")):
        at = _import_from_page(at, path)
        assert any(needle in e.value for e in at.error), [e.value for e in at.error]
        assert "open_run" not in at.session_state
        assert not root.exists() or not [p for p in root.iterdir() if not p.name.startswith(".")]
    at = _import_from_page(at, str(allowed / "job"))
    assert not at.error and at.session_state["open_run"]
