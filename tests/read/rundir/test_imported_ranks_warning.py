"""The run loader's "ran N ranks but has rows for ..." warning: an import of one rank of an
8-rank job has rows for that rank only, which is what an import is (its note says so), so the
loader does not warn on every command; a run dpcore recorded itself with a rank's rows missing,
or an import missing rows of a rank it imported, still warns."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.read.importer.write_run import import_traces
from dpcore.read.rundir.load import load_run
from tests.synthetic import gpu_trace

MI300 = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "tracelens_mi300_resnet_ddp_1r"
WARNING = "ran 8 rank(s) but has rows for"


def _import_one_of_eight(tmp_path: Path) -> Path:
    src = tmp_path / "src" / "rank0.json"
    src.parent.mkdir()
    src.write_text(json.dumps(gpu_trace(0, 8, steps=3, kernels_per_step=20)))
    return import_traces(src.parent, tmp_path / "out").run_dir


def test_an_import_of_one_rank_of_eight_loads_without_the_warning(tmp_path: Path) -> None:
    run_dir = _import_one_of_eight(tmp_path)
    run = load_run(run_dir)
    assert run.jobs["world_size"].tolist() == [8]
    assert not [w for w in run.warnings if "but has rows for" in w], run.warnings


def test_the_same_rows_in_a_recorded_run_still_warn(tmp_path: Path) -> None:
    """The same run.json with kind ``profile``: dpcore recorded all 8 ranks, 7 are missing."""
    run_dir = _import_one_of_eight(tmp_path)
    meta = json.loads((run_dir / "run.json").read_text())
    meta["kind"] = "profile"
    (run_dir / "run.json").write_text(json.dumps(meta))
    warnings = load_run(run_dir).warnings
    assert any(WARNING in w and "(missing: 1, 2, 3, 4, 5, 6, 7)" in w for w in warnings), warnings


def test_an_import_missing_rows_of_an_imported_rank_warns(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for r in (0, 1):
        (src / f"rank{r}.json").write_text(json.dumps(gpu_trace(r, 8, steps=3, kernels_per_step=20)))
    run_dir = import_traces(src, tmp_path / "out").run_dir
    steps = pd.read_csv(run_dir / "steps.csv")
    steps[steps["rank"] == 0].to_csv(run_dir / "steps.csv", index=False)
    warnings = load_run(run_dir).warnings
    assert any("ran 2 rank(s) but has rows for rank(s) 0 (missing: 1)" in w for w in warnings), warnings


@pytest.mark.slow
@pytest.mark.skipif(not MI300.is_dir(), reason="../shared/traces/ is not beside the checkout")
def test_summarize_of_an_imported_mi300x_rank_prints_no_warning(tmp_path: Path) -> None:
    """`dpcore import` of rank 0 of the 8-rank MI300X resnet job, then `summarize`: the import's
    note, never the loader's rank warning."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["import", str(MI300), "--out", str(tmp_path / "out")]) == 0
    run_dir = next((tmp_path / "out").iterdir())
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["summarize", str(run_dir)]) == 0
    assert "but has rows for" not in out.getvalue() + err.getvalue()
    assert "1 of the job's 8 ranks is here" in out.getvalue()  # the import's own note says it
