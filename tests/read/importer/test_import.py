"""`python -m dpcore import` on traces dpcore did not make.

Why real traces: an importer is only as good as its knowledge of what torch.profiler really
writes. One spawn of 2 gloo ranks trains plain ``DistributedDataParallel`` under torch.profiler
twice: once saved by ``tensorboard_trace_handler`` (``<worker>.<stamp>.pt.trace.json[.gz]``, one
rank gzipped), once by a torchtitan-style handler (``iteration_<k>/rank<r>_trace.json``, two
profiling cycles). Done when both import into runs whose Overview, Timeline and Stragglers draw.
"""
from __future__ import annotations

import gzip
import json
import os
import socket
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dpcore.cli import main
from dpcore.contract import runformat as rf
from dpcore.read.analysis import job_summary, timeline
from dpcore.read.importer.write_run import import_traces
from dpcore.read.report.analyze import analyze
from dpcore.read.report.stragglers import stragglers_text
from dpcore.read.rundir import load_run
from dpcore.read.tables import job_lanes
from dpcore.read.traces.files import trace_files
from tests import spawned
from tests.app_pages import open_page
from tests.events_path import step_trace_lanes, trace_step_metrics, traced_job_events
from tests.synthetic import write_gpu_trace_dir

torch = pytest.importorskip("torch")

APP = str(Path(__file__).resolve().parents[3] / "app.py")
STEPS = 10  # schedule wait 1, warmup 1, active 3: cycles end at steps 5 and 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _titan_handler(out: str, rank: int):
    """What torchtitan's profiler does: one folder per profiling cycle, one file per rank."""
    def handler(prof) -> None:
        d = Path(out) / f"iteration_{prof.step_num}"
        d.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(d / f"rank{rank}_trace.json"))
    return handler


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule, tensorboard_trace_handler

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    handlers = {"tb": tensorboard_trace_handler(f"{out}/tb", worker_name=f"worker{rank}", use_gzip=rank == 1),
                "titan": _titan_handler(f"{out}/titan/profile_trace", rank)}
    for layout, handler in handlers.items():
        inner = schedule(wait=1, warmup=1, active=3, repeat=1 if layout == "tb" else 2)

        def sched(step: int, inner=inner) -> ProfilerAction:
            # Settle before each stop, as dpcore's handler.schedule does (README, "The SIGABRT
            # over gloo"): unsettled, a stop can free what gloo's thread still writes into, and
            # this 2-rank, 2-cycle DDP job is the configuration that aborted. Outside every step.
            if step > 0 and inner(step - 1) == ProfilerAction.RECORD_AND_SAVE:
                dist.barrier()
            return inner(step)
        with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=handler) as prof:
            for _ in range(STEPS):
                x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                prof.step()
    dist.destroy_process_group()
    spawned.leave()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("foreign")
    torch.multiprocessing.spawn(_worker, args=(_free_port(), str(out)), nprocs=2, join=True)
    return out


@pytest.fixture(scope="module")
def runs(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    profiles = tmp_path_factory.mktemp("profiles")
    out = {}
    for layout in ("tb", "titan"):
        assert main(["import", str(traces / layout), "--out", str(profiles), "--name", layout]) == 0
        out[layout] = next(d for d in profiles.iterdir() if d.is_dir() and layout in d.name)
    gpu = write_gpu_trace_dir(traces / "gpu", world_size=2, steps=3)[0].parent  # NCCL-style, no phases
    out["gpu"] = import_traces(gpu, profiles, "gpu").run_dir
    return out


def test_discovery_of_both_layouts(traces: Path) -> None:
    tb = trace_files(traces / "tb")
    assert sorted(f.name.split(".")[0] for f in tb) == ["worker0", "worker1"]
    assert any(f.name.endswith(".pt.trace.json.gz") for f in tb)
    titan = trace_files(traces / "titan")  # nested two levels down; latest cycle wins
    assert [f.parent.name for f in titan] == ["iteration_10"] * 2
    assert [f.parent.name for f in trace_files(traces / "titan", iteration=5)] == ["iteration_5"] * 2
    assert trace_files(titan[0]) == [titan[0]]


@pytest.mark.parametrize("layout", ["tb", "titan"])
def test_import_writes_a_run(runs: dict[str, Path], layout: str) -> None:
    run = load_run(runs[layout])
    assert run.meta["kind"] == "import" and run.meta["status"] == "complete"
    job = run.meta["jobs"][0]
    assert job["id"] == "imported-ws2" and job["variant"] == "imported" and job["world_size"] == 2
    assert job["clock_offsets_ns"] == {"0": 0, "1": 0}  # one host: the clock is shared
    assert run.meta["environment"]["backend"] == "gloo" and run.meta["environment"]["device"] == "cpu"
    assert set(run.rank_trace_files("imported-ws2")) == {
        rf.trace_dir(run.path, "imported-ws2") / f"rank{r}{'.json.gz' if layout == 'tb' and r else '.json'}"
        for r in (0, 1)}
    st = run.steps
    assert len(st) == 6 and st["profiled"].all() and sorted(st["rank"].unique()) == [0, 1]
    assert sorted(st["step"].unique()) == ([2, 3, 4] if layout == "tb" else [7, 8, 9])
    assert (st["fwd_ms"] > 0).all() and (st["opt_ms"] > 0).all() and (st["bwd_ms"] > 0).all()
    assert st["sync_ms"].isna().all() and st["samples"].isna().all()  # never in a trace: missing
    assert (st["comm_ms"] > 0).all() and (st["comm_ops"] >= 1).all()
    c = run.collectives
    assert set(c["op"]) == {"all_reduce"} and c["bytes"].isna().all()
    assert len(c) == int(st["comm_ops"].sum())
    assert "sync_ms" in job["missing"] and "bytes" in job["missing"]


@pytest.mark.parametrize("layout", ["tb", "titan"])
def test_timeline_and_numbers(runs: dict[str, Path], layout: str) -> None:
    run = load_run(runs[layout])
    step = run.traced_steps("imported-ws2")[0]
    tl = timeline(run, "imported-ws2", step, step_trace_lanes(run, "imported-ws2", step))
    assert set(tl["rank"]) == {0, 1} and set(tl["lane"]) == {"compute", "comm"}
    # the Timeline page's path: the lanes from the rank cache (clock_shift_us places them), the same frame
    pd.testing.assert_frame_equal(timeline(run, "imported-ws2", step, lanes=job_lanes(run, "imported-ws2")), tl,
                                  check_exact=True)
    s = job_summary(run, trace_step_metrics(traced_job_events(run))).iloc[0]
    assert s["comm_source"] == "trace" and s["comm_ms"] > 0 and pd.isna(s["throughput"])
    assert pd.isna(s["overlap_pct_intervals"])  # phases not placed in the step: not guessed


def test_gpu_trace_without_phases(runs: dict[str, Path]) -> None:
    """NCCL kernels become collectives; phases the trace does not name stay missing."""
    run = load_run(runs["gpu"])
    assert run.meta["environment"]["backend"] == "nccl" and run.meta["environment"]["device"] == "cuda"
    assert run.steps[["fwd_ms", "bwd_ms", "sync_ms", "opt_ms"]].isna().all().all()
    assert {"fwd_ms", "bwd_ms", "opt_ms"} <= set(run.meta["jobs"][0]["missing"])
    assert set(run.collectives["op"]) == {"all_reduce"} and run.collectives["t_start_ns"].notna().all()
    s = job_summary(run, trace_step_metrics(traced_job_events(run))).iloc[0]
    assert s["comm_source"] == "trace" and 0 <= s["overlap_pct"] <= 100 and pd.isna(s["fwd_ms"])
    assert s["compute_ms"] > 0 and s["other_ms"] >= 0  # compute from the trace: every step is traced
    step = run.traced_steps("imported-ws2")[0]
    tl = timeline(run, "imported-ws2", step, step_trace_lanes(run, "imported-ws2", step))
    assert set(tl["rank"]) == {0, 1} and (tl["kind"] == "comm").any()
    # a GPU rank is drawn as its launch thread(s) and its streams; the NCCL kernels lie on a stream
    assert set(tl["lane"].str.split(" ").str[0]) == {"thread", "stream"}
    assert tl.loc[tl["kind"] == "comm", "lane"].str.startswith("stream ").all()
    pd.testing.assert_frame_equal(timeline(run, "imported-ws2", step, lanes=job_lanes(run, "imported-ws2")), tl,
                                  check_exact=True)


def test_analyze_and_stragglers_read_the_same_folders(traces: Path) -> None:
    for path in (traces / "titan", traces / "tb"):
        assert analyze(str(path), csv=True).splitlines()[0].startswith("rank,overlap_pct")
        assert "2 ranks" in stragglers_text(str(path))
    one = trace_files(traces / "titan")[0]
    assert analyze(str(one), csv=True).count("\n") == 2  # header + rank 0
    with pytest.raises(ValueError, match="one rank only"):
        stragglers_text(str(one))


def _shifted_copy(src: Path, dst: Path, shift_us: float, host: str) -> None:
    """The trace as another host would have written it: its clock 'shift_us' ahead."""
    data = json.loads(src.read_bytes() if src.suffix == ".json" else gzip.decompress(src.read_bytes()))
    for e in data["traceEvents"]:
        if "ts" in e:
            e["ts"] = float(e["ts"]) + shift_us
    data["host_name"] = host
    dst.write_text(json.dumps(data))


def test_clock_alignment_across_hosts(traces: Path, tmp_path: Path) -> None:
    src = trace_files(traces / "titan")
    both = tmp_path / "hosts"
    both.mkdir()
    _shifted_copy(src[0], both / "rank0_trace.json", 0.0, "node-a")
    _shifted_copy(src[1], both / "rank1_trace.json", 5e6, "node-b")  # 5 s ahead
    same = import_traces(traces / "titan", tmp_path / "p", align="always")
    moved = import_traces(both, tmp_path / "p")  # auto: two hosts -> aligned
    o_same = load_run(same.run_dir).meta["jobs"][0]["clock_offsets_ns"]["1"]
    o_moved = load_run(moved.run_dir).meta["jobs"][0]["clock_offsets_ns"]["1"]
    assert abs(o_moved - o_same - 5_000_000_000) < 1_000  # the median moves with the clock
    run = load_run(moved.run_dir)
    assert run.steps.groupby("rank")["t_start_ns"].min().diff().abs().iloc[1] < 1e8  # same clock again
    step = run.traced_steps("imported-ws2")[0]
    tl = timeline(run, "imported-ws2", step, step_trace_lanes(run, "imported-ws2", step))
    assert set(tl["rank"]) == {0, 1} and tl["end_ms"].max() < 1_000


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(tmp_path / "nowhere")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["import", str(empty), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "no such file or directory" in err and "no Chrome trace files" in err
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())


def _problems(at: AppTest) -> list[str]:
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]


def test_views_draw(runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPCORE_PROFILES", str(runs["tb"].parent))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not _problems(at)
    for layout, path in runs.items():
        at.sidebar.selectbox(key="run_a").set_value(path.name).run()
        for title in ("Overview", "Timeline", "Stragglers"):
            open_page(at, title)
            assert not _problems(at), (layout, title, _problems(at))
            assert at.get("plotly_chart"), f"{layout}: {title} drew no chart"


def test_dashboard_import_opens_the_run(traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    """The Import page imports a path on this machine (under the folder it may import from) and
    hands the new run to app.py."""
    monkeypatch.setenv("DPCORE_IMPORT_ROOT", str(tmp_path_factory.getbasetemp()))
    root = tmp_path / "profiles"
    script = ("from pathlib import Path\nimport streamlit as st\n"
              "from dpcore.read.dashboard.pages.import_traces import render\n"
              f"render(Path({str(root)!r}))\n")
    at = AppTest.from_string(script, default_timeout=60).run()
    assert not _problems(at) and at.button(key="imp-go").disabled
    at.text_input(key="imp-path").input(str(traces / "titan")).run()
    at.text_input(key="imp-name").input("titan").run()
    at.button(key="imp-go").click().run()
    assert not _problems(at), _problems(at)
    opened = at.session_state["open_run"]
    assert "titan" in opened and load_run(root / opened).meta["kind"] == "import"
    at.text_input(key="imp-path").input(str(tmp_path / "nowhere")).run()
    at.button(key="imp-go").click().run()
    assert any("no such file or directory" in e.value for e in at.error)


def test_uploads_are_saved_under_safe_names(tmp_path: Path) -> None:
    from dpcore.contract.errors import UsageError
    from dpcore.read.dashboard.pages.import_traces import save_uploads
    save_uploads([("../../evil/rank0.json", b"{}"), ("rank0.json", b"[]"), ("w1.pt.trace.json.gz", b"x")], tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1_rank0.json", "rank0.json", "w1.pt.trace.json.gz"]
    with pytest.raises(UsageError, match="not a Chrome trace"):
        save_uploads([("notes.txt", b"")], tmp_path)
