"""The committed samples (scripts/make_sample.sh) give the pages that need a special run something to
show: Live (live.csv), Buckets' compression chart (an fp16 comm-hook job), Hang (a hung job's
dumps) and What-if (the calibration recorded in training).

Why: a newcomer opens the samples first; a page that only says "no data" there is a page they
never learn to read.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dpcore.read.rundir import load_run
from tests.app_pages import APP, heading, open_page, problems
from tests.conftest import samples_in_checkout

pytestmark = pytest.mark.skipif(not samples_in_checkout("sample-hang"),
                                reason="sample runs not present (bash scripts/make_sample.sh)")


def test_the_training_sample_holds_live_rows_comm_hooks_and_calibrations(samples: Path) -> None:
    train = load_run(samples / "sample-train")
    live = (samples / "sample-train" / "live.csv").read_text().splitlines()
    assert len(live) > 100  # every rank's timed steps of every job, as they came
    jobs = json.loads((samples / "sample-train" / "run.json").read_text())["jobs"]  # as recorded
    assert len(jobs) == len(train.jobs)
    hooked = [j for j in jobs if j.get("comm_hook") == "fp16"]
    assert hooked and all(j["variant"] == "torch_ddp" and j["world_size"] == 2 and j["status"] == "complete"
                          for j in hooked)
    sources = [j for j in jobs if j["variant"] in ("bucketed", "torch_ddp") and j["world_size"] == 2
               and j["status"] == "complete" and not j.get("comm_hook")]
    # every what-if source job carries its calibration (the fitted rates themselves are the
    # what-if model's to judge, not the samples')
    assert sources and all(isinstance(j.get("whatif_calibration"), dict)
                           and math.isfinite(j["whatif_calibration"]["ms_per_mib"])
                           and j["whatif_calibration"]["plans"] for j in sources)


def test_the_hang_sample_holds_a_hung_job(samples: Path) -> None:
    hang = load_run(samples / "sample-hang")
    assert [j["status"] for j in hang.meta["jobs"]] == ["failed"]
    dumps = samples / "sample-hang" / "hang" / hang.meta["jobs"][0]["id"]
    assert {p.name for p in dumps.iterdir()} >= {"rank0.fr.json", "rank1.fr.json", "verdict.json",
                                                  "rank0.stack.txt", "rank1.stack.txt"}


def test_live_buckets_and_hang_draw_on_the_samples(monkeypatch: pytest.MonkeyPatch, samples: Path) -> None:
    monkeypatch.setenv("DPCORE_PROFILES", str(samples))
    at = AppTest.from_file(APP, default_timeout=180).run()
    assert at.sidebar.selectbox(key="run_a").value == "sample-train"
    open_page(at, "Live")
    assert not problems(at) and heading(at) == "Live"
    assert at.get("plotly_chart") and not any("No live rows" in i.value for i in at.info)
    open_page(at, "Buckets")
    assert not problems(at)
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert len(specs) == 2 and any("fp16" in s for s in specs)  # compression, then the sweep
    at.sidebar.selectbox(key="run_a").select("sample-hang").run()
    open_page(at, "Hang")
    assert not problems(at) and heading(at) == "Hang"
    assert at.selectbox(key="hang-job-sample-hang").value == "flat-ws2"
    assert at.get("plotly_chart")
