"""A fresh 2-rank run of every variant reads the same through the per-rank tables as through its
events read whole (tests/events_path.py, the reference).

Why: every command and view reads traces as the tables each reader declares
(:class:`dpcore.read.traces.rank_table.RankTable`), reduced rank by rank in workers and cached.
Each table must equal its reduction applied to all ranks' events at once, on what the variants
write today (gloo ranks, every variant's collectives, merged traces beside the rank traces): the
overlap rows, the comm rows, the Timeline's lanes and drawn frame, import's rows, the GPU tables
(empty on a CPU run), and that on a miss, from the cache, and with worker processes.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dpcore.contract.config import VARIANTS
from dpcore.read.analysis.comm_overlap import OVERLAP_TABLE, overlap_from_trace
from dpcore.read.analysis.lanes import LANE_EVENTS_TABLE, trace_lanes
from dpcore.read.analysis.timeline import timeline
from dpcore.read.analysis.trace_arrivals import COMM_TABLE, trace_comm_rows
from dpcore.read.importer.rows import IMPORT_TABLES, rank_rows
from dpcore.read.ranks import Scale
from dpcore.read.rundir import list_runs, load_run
from dpcore.read.tables import GPU_TABLES, job_lanes, job_rank_tables, run_trace_steps
from tests.events_path import job_trace_events, lanes_of, trace_step_metrics, traced_job_events

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profiles")
    cmd = [sys.executable, "-m", "dpcore", "profile", "--variants", "all", "--world-sizes", "2",
           "--steps", "3", "--warmup", "1", "--out", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    runs, warnings = list_runs(out)
    assert not warnings and len(runs) == 1
    return Path(runs["path"].iloc[0])


def _by_rank(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("rank", kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("scale", [Scale(cache=False, workers=1), Scale(workers=2), Scale(workers=1)],
                         ids=["no-cache", "miss-workers", "hit"])
def test_every_table_is_its_reduction_of_all_events(run_dir: Path, scale: Scale) -> None:
    run = load_run(run_dir)
    pairs = list(traced_job_events(run))
    assert len({job.split("-ws")[0] for job, _ in pairs}) >= len(VARIANTS) - 2  # (almost) every variant traced
    pd.testing.assert_frame_equal(run_trace_steps(run, scale), trace_step_metrics(pairs))
    need = (OVERLAP_TABLE, COMM_TABLE, LANE_EVENTS_TABLE, *IMPORT_TABLES, *GPU_TABLES)
    events = dict(pairs)
    compared = 0
    for job, tables in job_rank_tables(run, scale, need):
        ev = events[job]
        whole = {"overlap": OVERLAP_TABLE.typed(overlap_from_trace(ev)),
                 "comm": COMM_TABLE.typed(trace_comm_rows(ev).drop(columns="job_id")),
                 "lanes": trace_lanes(ev)}
        for name, want in whole.items():
            # the lanes: reduced from each rank's cached lane events (every step)
            got = pd.concat([trace_lanes(t.frames["lane_events"]) if name == "lanes" else t.frames[name]
                             for t in sorted(tables, key=lambda t: t.rank)], ignore_index=True)
            pd.testing.assert_frame_equal(_by_rank(got), _by_rank(want), check_exact=True, obj=f"{job} {name}")
            compared += len(want)
        for t in tables:
            want = rank_rows(ev[ev["rank"] == t.rank])
            for table in IMPORT_TABLES:
                rows = table.typed(want[table.name])
                if table.name == "import_facts":  # host and the metadata's facts come from the file, not the events
                    rows = rows[["ts_min", "end_max", "ranks", "gpu"]]
                pd.testing.assert_frame_equal(t.frames[table.name][list(rows.columns)], rows, check_exact=True,
                                              obj=f"{job} rank {t.rank} {table.name}")
            assert all(t.frames[g.name].empty for g in GPU_TABLES)  # a CPU run: no GPU rows
        compared += 1
    assert compared > 1000


def test_every_traced_step_draws_the_same_timeline(run_dir: Path) -> None:
    run = load_run(run_dir)
    drawn = 0
    for job in run.jobs["job_id"]:
        steps = run.traced_steps(job)
        if not steps:
            continue
        from_events = lanes_of(job_trace_events(run, job))
        from_tables = job_lanes(run, job)
        for step in steps:
            want = timeline(run, job, step, from_events)
            pd.testing.assert_frame_equal(timeline(run, job, step, from_tables), want, check_exact=True)
            one = job_lanes(run, job, steps=[step])  # the Timeline's read: the drawn step only
            pd.testing.assert_frame_equal(timeline(run, job, step, one), want, check_exact=True)
            drawn += len(want)
    assert drawn > 100
