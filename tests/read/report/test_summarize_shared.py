"""summarize says in one line which jobs' ranks shared a GPU (no scaling point), and its CSV has
the ``gpus_shared`` column."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

from dpcore.read.report.summarize import summarize
from tests.fixtures_run import make_run


def test_summarize_names_the_shared_gpu_jobs(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    for j in meta["jobs"]:
        j["gpus_shared"] = j.get("id") == "ring-ws2"
    (run / "run.json").write_text(json.dumps(meta))
    text = summarize(str(run))
    lines = [ln for ln in text.splitlines() if "shared a GPU" in ln]
    assert lines == ["note: ranks shared a GPU in ring-ws2: their processes took turns on one device, so their "
                     "step times compare GPU sharing, not scaling; they are no scaling point (no speedup or "
                     "efficiency)."]
    csv = pd.read_csv(io.StringIO(summarize(str(run), csv=True)))
    cols = list(csv.columns)
    assert cols[cols.index("trace_inflation") + 1] == "gpus_shared"
    assert bool(csv.set_index("job_id").at["ring-ws2", "gpus_shared"])
    assert int(csv["gpus_shared"].astype(bool).sum()) == 1
