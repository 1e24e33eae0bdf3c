"""Ranks sharing a GPU are no scaling point. ``profile`` on a 1-GPU machine runs world size 2 as two
processes taking turns on the one GPU (run.json's per-job ``gpus_shared``); their step time against
world size 1 measures the sharing, not data parallelism. job_summary carries the flag, scaling
leaves such a job's speedup and efficiency empty with the reason, summarize says why in one line,
and the figures mark the job."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.read.analysis.summary import SHARED_SUSPECT, job_summary, scaling, shared_gpu_line
from dpcore.read.plots.overview import breakdown_figure
from dpcore.read.plots.scaling import scaling_figure
from dpcore.read.rundir.load import load_run
from tests.fixtures_run import make_run


def _shared_run(tmp_path: Path) -> Path:
    """The synthetic run with its world-size-2 jobs marked as sharing one GPU (as profile writes
    on a 1-GPU machine) and the others not."""
    run = make_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    for j in meta["jobs"]:
        j["gpus_shared"] = j.get("world_size") == 2
    (run / "run.json").write_text(json.dumps(meta))
    return run


def test_a_shared_gpu_job_is_no_scaling_point(tmp_path: Path) -> None:
    run = load_run(_shared_run(tmp_path))
    s = job_summary(run, None)
    flags = s.set_index("job_id")["gpus_shared"]
    assert bool(flags["ring-ws2"]) and not bool(flags["ring-ws4"]) and not bool(flags["single-ws1"])
    sc = scaling(s, "weak").set_index(["variant", "world_size"])
    ring2, ring4 = sc.loc[("ring", 2)], sc.loc[("ring", 4)]
    assert np.isnan(ring2["speedup"]) and np.isnan(ring2["efficiency"]) and bool(ring2["gpus_shared"])
    assert ring2["suspect"] == SHARED_SUSPECT and np.isfinite(ring2["step_ms"])
    t1 = float(sc.loc[("ring", 1), "step_ms"])
    assert ring4["speedup"] == 4 * t1 / ring4["step_ms"] and not bool(ring4["gpus_shared"])
    line = shared_gpu_line(s)
    assert line.startswith("ranks shared a GPU in 8 jobs at world size 2: their processes took turns on one device")
    one = shared_gpu_line(s[s["job_id"] != "ring-ws4"].assign(gpus_shared=s["job_id"] == "ring-ws2"))
    assert one.startswith("ranks shared a GPU in ring-ws2: ")
    assert line.endswith("they are no scaling point (no speedup or efficiency)")
    # the figures mark it: an open diamond in the scaling panels, "(shared GPU)" under its bar
    fig = scaling_figure(scaling(s, "weak"))
    assert any(t.name == "◇ = ranks shared a GPU" for t in fig.data)
    labels = set(breakdown_figure(s).data[0].x)
    assert "ring ×2 (shared GPU)" in labels and "ring ×4" in labels


def test_runs_without_the_field_scale_as_before(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path))
    s = job_summary(run, None)
    assert not s["gpus_shared"].any() and shared_gpu_line(s) == ""
    sc = scaling(s, "weak")
    assert np.isfinite(pd.to_numeric(sc["speedup"])).all()


def test_whatif_measures_no_shared_gpu_job(tmp_path: Path) -> None:
    from dpcore.read.whatif.cells import measured_cells

    s = job_summary(load_run(_shared_run(tmp_path)), None)
    assert set(measured_cells(s, "bucketed")["job_id"]) == {"bucketed-ws1-b25", "bucketed-ws4-b25"}


@pytest.mark.slow
def test_overview_and_scaling_pages_say_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Overview and Scaling pages show the one line (and draw); Stragglers draws its verdict."""
    from streamlit.testing.v1 import AppTest

    from tests.app_pages import APP, open_page, problems

    root = tmp_path / "profiles"
    _shared_run(root)
    monkeypatch.setenv("DPCORE_PROFILES", str(root))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    for page in ("Overview", "Scaling"):
        open_page(at, page)
        assert not problems(at), (page, problems(at))
        said = [w.value for w in at.warning if "shared a GPU" in w.value]
        assert said and said[0].startswith("Ranks shared a GPU in 8 jobs at world size 2"), (page, said)
    open_page(at, "Stragglers")
    assert not problems(at) and at.get("plotly_chart")
