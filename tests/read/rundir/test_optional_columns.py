"""memory.csv's ``reserved_bytes`` (the CUDA allocator's peak reserve) is optional: a run recorded
before it existed still loads, with the column empty, and the Memory views show the reserve only
where it was recorded."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.contract import runformat as rf
from dpcore.read.analysis.memory import job_memory, memory_table
from dpcore.read.plots.memory import INFERRED_LABEL, MIB, RESERVE_LABEL, memory_breakdown_figure
from dpcore.read.rundir import load_run
from dpcore.read.rundir.load import RunLoadError
from tests.fixtures_run import make_run

OLD_HEADER = ("job_id,rank,variant,world_size,device,param_bytes,grad_bytes,optim_bytes,other_bytes,peak_bytes,"
              "peak_method\n")
ROW = "single-ws1,0,single,1,cuda:0,1048576,1048576,0,0,4194304,cuda_allocator"
NO_T = pd.DataFrame(columns=["job_id", "bucket_mb", "step_ms", "step_ms_p10", "step_ms_p90"])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("opt"), steps=3, profiled=1)


def test_memory_csv_declares_reserved_bytes_optional() -> None:
    assert "reserved_bytes" in rf.MEMORY_COLUMNS and rf.OPTIONAL_COLUMNS["memory"] == ("reserved_bytes",)


def test_an_old_memory_csv_without_reserved_bytes_loads(run: Path) -> None:
    (run / "memory.csv").write_text(OLD_HEADER + ROW + "\n")
    mem = load_run(run).memory
    assert mem["peak_bytes"].tolist() == [4194304] and mem["reserved_bytes"].isna().all()
    table = memory_table(mem, NO_T)
    assert np.isnan(table.at[0, "reserve_bytes"])
    names = [t.name for t in memory_breakdown_figure(table).data]
    assert INFERRED_LABEL in names and RESERVE_LABEL not in names  # no reserve drawn where none was recorded


def test_a_required_column_is_still_required(run: Path) -> None:
    (run / "memory.csv").write_text(OLD_HEADER.replace(",peak_bytes", "") + ROW.replace(",4194304", "") + "\n")
    with pytest.raises(RunLoadError, match="missing columns peak_bytes"):
        load_run(run)


def test_a_recorded_reserve_is_split_above_the_peak(run: Path) -> None:
    """4 MiB peak (2 MiB held: 2 MiB activations), 6 MiB reserved: 2 MiB of allocator reserve."""
    (run / "memory.csv").write_text(OLD_HEADER.replace("\n", ",reserved_bytes\n") + ROW + ",6291456\n")
    table = memory_table(load_run(run).memory, NO_T)
    assert table.at[0, "reserved_bytes"] == 6291456 and table.at[0, "reserve_bytes"] == 2 * MIB
    assert job_memory(table).at[0, "reserve_bytes"] == 2 * MIB
    fig = memory_breakdown_figure(table)
    assert next(t for t in fig.data if t.name == RESERVE_LABEL).x[0] == pytest.approx(2.0)
    assert sum(float(t.x[0]) for t in fig.data if t.type == "bar") == pytest.approx(6.0)  # bars reach reserved


@pytest.mark.parametrize("recorded", [True, False])
def test_memory_page_shows_the_reserve_where_recorded(run: Path, monkeypatch: pytest.MonkeyPatch,
                                                      recorded: bool) -> None:
    from streamlit.testing.v1 import AppTest

    from tests.app_pages import APP, open_page, problems

    header = OLD_HEADER.replace("\n", ",reserved_bytes\n") if recorded else OLD_HEADER
    (run / "memory.csv").write_text(header + ROW + (",6291456" if recorded else "") + "\n")
    monkeypatch.setenv("DPCORE_PROFILES", str(run.parent))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    open_page(at, "Memory")
    assert not problems(at)
    captions = " ".join(c.value for c in at.caption)
    shown = at.dataframe[0].value
    if recorded:
        assert "Allocator reserve (dotted) = reserved − peak" in captions
        assert shown["reserve_mib"].tolist() == [pytest.approx(2.0)]
    else:
        assert "was not recorded in this run's memory.csv" in captions and shown["reserve_mib"].isna().all()
