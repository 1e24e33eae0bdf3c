"""The committed sample runs (profiles/sample-*) in the app: what a fresh clone shows first."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dpcore.read.analysis import job_summary
from dpcore.read.dashboard.pages import PAGES
from dpcore.read.rundir import load_run
from tests.app_pages import heading, open_page, problems
from tests.conftest import samples_in_checkout
from tests.events_path import step_trace_lanes, trace_step_metrics, traced_job_events

ROOT = Path(__file__).resolve().parents[3]
#: Pages that draw no chart on the training sample (Bandwidth: it has no all-reduce benchmark;
#: Hang: no job of it hung, sample-hang has one (test_samples_cover_every_page); GPU: the samples
#: were recorded on CPUs).
NO_CHART = {"Runs", "Traces", "Bandwidth", "New run", "Import", "Hang", "GPU"}

pytestmark = pytest.mark.skipif(not samples_in_checkout("sample-train"),
                                reason="sample runs not present (bash scripts/make_sample.sh)")


def test_sample_runs_are_complete_and_cover_every_page(samples):
    train, bench = load_run(samples / "sample-train"), load_run(samples / "sample-allreduce")
    assert train.meta["status"] == bench.meta["status"] == "complete"
    summary = job_summary(train, trace_step_metrics(traced_job_events(train)))
    assert set(summary["variant"]) >= {"single", "manual", "naive", "flat", "central", "ring",
                                       "overlap", "bucketed", "torch_ddp"}
    assert set(summary["world_size"]) == {1, 2}
    assert len(set(summary.loc[summary["variant"] == "bucketed", "bucket_mb"])) >= 2
    assert {"ring", "central"} <= set(train.messages["algo"])
    assert set(bench.allreduce["algo"]) == {"native", "ring", "naive", "central"}
    done = summary[summary["status"] == "complete"]
    assert len(done) == len(summary) - 1  # all but data_parallel (needs GPUs)
    for j, v, ws in zip(done["job_id"], done["variant"], done["world_size"]):
        procs = 1 if v in ("single", "manual") else ws
        assert set(train.trace_files(j)) == {f"rank{r}" for r in range(procs)} | {"merged"}, j


def test_every_page_renders_on_the_sample(monkeypatch, samples):
    monkeypatch.setenv("DPCORE_PROFILES", str(samples))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    assert at.sidebar.selectbox(key="run_a").value == "sample-train"  # training run first
    for page in PAGES:
        open_page(at, page.title)
        assert not problems(at), (page.title, problems(at))
        assert heading(at) == page.title
        if page.title not in NO_CHART:
            assert at.get("plotly_chart"), f"{page.title} drew no chart"
        elif page.title == "GPU":
            assert any("No GPU events" in i.value for i in at.info)
    # the training run has no all-reduce benchmark: the Bandwidth page offers the run that does
    open_page(at, "Bandwidth")
    assert any("sample-allreduce" in i.value for i in at.info)
    at.button(key="open-Bandwidth-sample-allreduce").click().run()
    assert at.sidebar.selectbox(key="run_a").value == "sample-allreduce"
    assert heading(at) == "Bandwidth" and at.get("plotly_chart")  # the page stays


def test_timeline_from_trace_and_from_csv_on_the_sample(samples):
    from dpcore.read.analysis import timeline
    from tests.events_path import job_trace_events, lanes_of, step_trace_events
    run = load_run(samples / "sample-train")
    steps = run.steps[run.steps["job_id"] == "bucketed-ws2-b1"]
    traced = int(steps.loc[steps["profiled"], "step"].iloc[0])
    timed = int(steps.loc[~steps["profiled"], "step"].iloc[0])
    t = timeline(run, "bucketed-ws2-b1", traced, step_trace_lanes(run, "bucketed-ws2-b1", traced))
    assert set(t["rank"]) == {0, 1} and set(t["lane"]) == {"compute", "comm"}
    assert set(t.loc[t["lane"] == "compute", "name"]) == {"compute"}  # merged trace ops
    assert t["start_ms"].min() > -1.0 and (t["end_ms"] >= t["start_ms"]).all()
    # the same frame from the lanes of all the job's steps (read once, reused per step)
    ev = job_trace_events(run, "bucketed-ws2-b1")
    assert timeline(run, "bucketed-ws2-b1", traced, lanes_of(ev)).equals(t)
    assert step_trace_events(run, "bucketed-ws2-b1", timed) is None
    c = timeline(run, "bucketed-ws2-b1", timed, None)  # not traced: steps.csv + collectives.csv
    assert set(c.loc[c["lane"] == "compute", "name"]) == {"forward", "backward", "optimizer"}
    # ring's p2p transfers are invisible to the gloo trace: its comm lane comes from the CSV
    r = timeline(run, "ring-ws2", traced, step_trace_lanes(run, "ring-ws2", traced))
    assert set(r.loc[r["lane"] == "comm", "rank"]) == {0, 1}


def test_timeline_rows_name_their_collective_family(samples):
    """`timeline` returns the family of every comm row (op), so the plot never re-reads names:
    known answers from the names (traces.kinds.comm_op) and from the sample's FSDP and ZeRO-1 steps."""
    from dpcore.read.analysis import timeline
    from dpcore.read.traces.kinds import comm_op

    names = {"gloo:allgather": "all_gather", "fsdp_all_gather": "all_gather", "all_gather #3": "all_gather",
             "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL": "reduce_scatter", "gloo:reduce_scatter": "reduce_scatter",
             "gloo:all_reduce": "all_reduce", "all_reduce #0": "all_reduce", "gloo:broadcast": "broadcast",
             "gloo:send": "send_recv", "mystery": "other"}
    assert {n: comm_op(n) for n in names} == names
    run = load_run(samples / "sample-train")
    # step 0 is not traced: comm rows are collectives.csv's, named "<op> #<seq>"
    fsdp = timeline(run, "fsdp-ws2", 0, None)
    assert list(fsdp.columns) == ["rank", "lane", "name", "op", "kind", "start_ms", "end_ms"]
    assert (fsdp["kind"] == fsdp["lane"]).all()  # a CPU run's two lanes: the kind is the lane
    assert (fsdp.loc[fsdp["lane"] == "compute", "op"] == "").all()
    comm = fsdp[fsdp["lane"] == "comm"]
    assert (comm["op"] == comm["name"].str.split(" #").str[0]).all()
    assert comm.groupby("op").size().to_dict() == {"all_gather": 64, "all_reduce": 2, "reduce_scatter": 32}
    step = run.traced_steps("zero1-ws2-b1")[0]
    zero = timeline(run, "zero1-ws2-b1", step, step_trace_lanes(run, "zero1-ws2-b1", step))  # gloo spans
    assert zero.loc[zero["lane"] == "comm"].groupby("op").size().to_dict() == {"all_reduce": 10, "broadcast": 4}


def test_timeline_cards_follow_the_picked_step(monkeypatch, samples):
    """The cards and the per-rank table show the drawn step (known answer: that step's rows of
    step_metrics), not the job median, and they change when another step is picked."""
    from dpcore.read.analysis import step_metrics, step_ranks
    monkeypatch.setenv("DPCORE_PROFILES", str(samples))
    run = load_run(samples / "sample-train")
    rows = step_metrics(run.steps, run.collectives, trace_step_metrics(traced_job_events(run)))
    job = "torch_ddp-ws2-b1"
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    open_page(at, "Timeline")
    at.selectbox(key=f"tl-job-{run.path}").set_value(job).run()
    seen = {}
    for step in (0, run.traced_steps(job)[0]):
        at.selectbox(key=f"tl-step-{run.path}-{job}").set_value(step).run()
        assert not at.exception
        want = step_ranks(rows, job, step, "trace")
        t_card = next(m for m in at.metric if m.label.startswith(f"step {step}:"))
        assert t_card.value == f"{want['step_ms'].max():.2f} ms"
        table = at.dataframe[0].value
        assert table.iloc[:2]["step_ms"].round(4).tolist() == want["step_ms"].round(4).tolist()
        assert table.iloc[:2]["comm_ms"].round(4).tolist() == want["comm_ms"].round(4).tolist()
        seen[step] = t_card.value
    assert len(set(seen.values())) == 2  # a timed and a traced step: different numbers
