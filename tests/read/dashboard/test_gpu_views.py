"""The views other than the GPU page on GPU runs: Scaling at world size 1, Memory's split of a GPU
rank's peak, and the Timeline's launch-thread and stream lanes.

Why: on the GPU runs recorded on one H200 (every job at world size 1) Scaling drew
four one-point charts, Memory's "what each rank holds" stopped at 708 MiB of a 3,220 MiB peak,
and the Timeline merged every CUDA stream into one "compute" lane. The unit tests build the
shapes themselves; the AppTests run every page on copies of every GPU run (gpu_runs.py): the
committed profiles/sample-gpu, and the recordings in ``../shared/gpu/runs`` where that is present.
"""
from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from dpcore.read.analysis.lanes import gpu_lanes
from dpcore.read.analysis.memory import MIB, job_memory, memory_table
from dpcore.read.plots.memory import INFERRED_LABEL, memory_breakdown_figure
from dpcore.read.plots.timeline import timeline_figure
from tests.app_pages import APP, data_problems, open_page, problems
from tests.read.dashboard.gpu_runs import RUNS, SAMPLE_GPU, SHARED_GPU_RUNS, TRANSFORMER_RUNS

DATA = Path(__file__).resolve().parents[2] / "data"
shared = pytest.mark.skipif(not RUNS, reason=f"no GPU run: neither {SAMPLE_GPU} nor runs in {SHARED_GPU_RUNS}")


def _events(rows: list[tuple]) -> pd.DataFrame:
    """An events frame (read_trace's columns) from (name, category, tid, stream, kind, ts, dur) rows."""
    df = pd.DataFrame(rows, columns=["name", "category", "tid", "stream", "kind", "ts", "dur"])
    return df.assign(pid="1", rank=0, step=0, collective="", bytes=np.nan,
                     name=df["name"].astype("category"), category=df["category"].astype("category"),
                     tid=df["tid"].astype("category"), kind=df["kind"].astype("category"))


def test_gpu_step_is_drawn_as_launch_thread_and_streams() -> None:
    """A launch thread with nested ops keeps only its outermost ones; each stream is its own
    lane with each event's kind (a kernel, an NCCL kernel, a copy)."""
    ev = _events([
        ("ProfilerStep#0", "user_annotation", "10", -1, "other", 0.0, 100.0),   # the step marker: not drawn
        ("forward", "user_annotation", "10", -1, "other", 1.0, 40.0),
        ("aten::mm", "cpu_op", "10", -1, "other", 2.0, 5.0),                    # inside forward: hidden
        ("cudaLaunchKernel", "cuda_runtime", "10", -1, "other", 3.0, 1.0),
        ("Optimizer.step#SGD.step", "cpu_op", "10", -1, "other", 50.0, 30.0),
        ("aten::add", "cpu_op", "20", -1, "other", 5.0, 2.0),                   # a thread that launches nothing
        ("sm90_gemm", "kernel", "7", 7, "compute", 4.0, 3.0),
        ("Memcpy HtoD", "gpu_memcpy", "7", 7, "memcpy", 8.0, 1.0),
        ("ncclDevKernel_AllReduce_Sum_f32", "kernel", "9", 9, "comm", 6.0, 10.0),
    ])
    lanes = {lane: (list(names), list(start), list(end), kind) for lane, names, start, end, kind in gpu_lanes(ev)}
    assert list(lanes) == ["thread 10", "stream 7", "stream 9"]
    assert lanes["thread 10"][:3] == (["forward", "Optimizer.step#SGD.step"], [1.0, 50.0], [41.0, 80.0])
    assert lanes["thread 10"][3] == "cpu"
    assert lanes["stream 7"][0] == ["sm90_gemm", "Memcpy HtoD"] and list(lanes["stream 7"][3]) == ["compute", "memcpy"]
    assert list(lanes["stream 9"][3]) == ["comm"]
    # a CPU trace has no GPU lanes
    assert gpu_lanes(ev[ev["stream"] < 0]) == []


def test_timeline_figure_orders_threads_above_streams_and_colours_by_kind() -> None:
    rows = pd.DataFrame(dict(rank=[0, 0, 0, 0], lane=["stream 13", "stream 7", "thread 10", "stream 7"],
                             name=["nccl", "gemm", "forward", "Memcpy"], op=["all_reduce", "", "", ""],
                             kind=["comm", "compute", "cpu", "memcpy"], start_ms=[0.0, 1, 0, 3],
                             end_ms=[2.0, 2, 5, 4]))
    fig = timeline_figure(rows)
    assert list(fig.layout.yaxis.categoryarray)[::-1] == ["rank 0 · thread 10", "rank 0 · stream 7",
                                                         "rank 0 · stream 13"]
    by_name = {t.name: list(t.y) for t in fig.data}
    assert by_name == {"compute": ["rank 0 · stream 7"], "all-reduce": ["rank 0 · stream 13"],
                       "CPU op (launch thread)": ["rank 0 · thread 10"], "memory copy / set": ["rank 0 · stream 7"]}


def test_gpu_peak_is_split_with_the_inferred_rest() -> None:
    """The shared H200 run's single-ws1 row: 354.1 MiB of parameters and of gradients under a
    3,219.7 MiB allocator peak; the rest, 2,511.4 MiB, is activations and temporaries."""
    mem = pd.DataFrame([dict(job_id="single-ws1", rank=0, variant="single", world_size=1, device="cuda:0",
                             param_bytes=371337216, grad_bytes=371337216, optim_bytes=0, other_bytes=0,
                             peak_bytes=3376082944, peak_method="cuda_allocator")])
    table = memory_table(mem, pd.DataFrame(columns=["job_id", "bucket_mb", "step_ms", "step_ms_p10",
                                                    "step_ms_p90"]))
    assert table.at[0, "activation_bytes"] == 3376082944 - 2 * 371337216
    assert job_memory(table).at[0, "activation_bytes"] == 3376082944 - 2 * 371337216
    fig = memory_breakdown_figure(table)
    bars = sum(float(t.x[0]) for t in fig.data if t.type == "bar")
    assert bars == pytest.approx(3376082944 / MIB) == pytest.approx(3219.7, abs=0.05)
    assert next(t for t in fig.data if t.name == INFERRED_LABEL).x[0] == pytest.approx(2511.4, abs=0.05)


def _app(monkeypatch: pytest.MonkeyPatch, root: Path) -> AppTest:
    monkeypatch.setenv("DPCORE_PROFILES", str(root))
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    return at


def _decoded(obj: object) -> object:
    """A chart spec with plotly's typed arrays (``{"dtype", "bdata"}``, base64) as lists."""
    if isinstance(obj, dict):
        if set(obj) >= {"dtype", "bdata"}:
            return np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"]).tolist()
        return {k: _decoded(v) for k, v in obj.items()}
    return [_decoded(v) for v in obj] if isinstance(obj, list) else obj


def _figure(at: AppTest, i: int) -> go.Figure:
    """The ``i``-th chart of the page as a figure (its arrays decoded)."""
    return go.Figure(_decoded(json.loads(at.get("plotly_chart")[i].proto.spec)), skip_invalid=True)


def _pick(at: AppTest, run: str) -> None:
    at.sidebar.selectbox(key="run_a").set_value(run).run()
    assert not problems(at) and not data_problems(at), (run, problems(at), data_problems(at))


def _each_run(monkeypatch: pytest.MonkeyPatch, root: Path, title: str) -> Iterator[tuple[AppTest, str]]:
    """The page titled ``title`` on each GPU run in turn, checked for problems."""
    at = _app(monkeypatch, root)
    open_page(at, title)
    for run in RUNS:
        _pick(at, run)
        yield at, run


@shared
def test_scaling_says_there_is_nothing_to_scale_on_every_gpu_run(monkeypatch: pytest.MonkeyPatch,
                                                                 gpu_runs: Path) -> None:
    for at, run in _each_run(monkeypatch, gpu_runs, "Scaling"):
        assert any("ran at world size 1: there is nothing to scale" in i.value for i in at.info), run
        assert not at.get("plotly_chart"), run                      # no one-point charts
        assert not any("pinned" in c.value or "thread(s) per rank" in c.value for c in at.caption), run


@shared
def test_memory_splits_the_gpu_peak_on_every_gpu_run(monkeypatch: pytest.MonkeyPatch, gpu_runs: Path) -> None:
    for at, run in _each_run(monkeypatch, gpu_runs, "Memory"):
        mem = pd.read_csv(gpu_runs / run / "memory.csv")
        if mem.empty:  # the recordings through hooks write no memory rows
            assert any("no memory.csv rows" in i.value for i in at.info), run
            continue
        fig = _figure(at, 1)
        bars = [t for t in fig.data if t.type == "bar"]
        peak = next(t for t in fig.data if t.name == "peak (largest rank)")
        assert len(peak.y) == len(mem)
        for i, label in enumerate(peak.y):  # one rank per job: the stack reaches the peak
            assert sum(float(t.x[i]) for t in bars) == pytest.approx(float(peak.x[i]), rel=1e-9), (run, label)
        assert any(t.name == INFERRED_LABEL for t in bars)
        captions = " ".join(c.value for c in at.caption)
        assert "inferred" in captions and "max_memory_reserved" in captions


@shared
def test_timeline_draws_streams_and_launch_threads_on_every_gpu_run(monkeypatch: pytest.MonkeyPatch,
                                                                   gpu_runs: Path) -> None:
    for at, run in _each_run(monkeypatch, gpu_runs, "Timeline"):
        fig = _figure(at, 0)
        lanes = list(fig.layout.yaxis.categoryarray)
        assert any(lane.startswith("rank 0 · stream ") for lane in lanes), (run, lanes)
        assert any(lane.startswith("rank 0 · thread ") for lane in lanes), (run, lanes)
        names = {t.name for t in fig.data}
        assert {"compute", "CPU op (launch thread)"} <= names, (run, names)
        assert any("CUDA stream" in c.value for c in at.caption), run


def test_ledger_bar_sums_to_the_span_and_causes_are_largest_first() -> None:
    from dpcore.read.plots.gpu import causes_figure, ledger_figure

    ledger = pd.DataFrame(dict(rank=[0, 0], window=["trace", "step"], step=[-1, 3], span_ms=[10.0, 4.0],
                               compute_ms=[2.0, 1.0], non_compute_ms=[1.0, 0.5], idle_host_ms=[6.0, 2.0],
                               idle_device_ms=[1.0, 0.5]))
    fig = ledger_figure(ledger)
    assert list(fig.data[0].y) == ["rank 0 · whole trace", "rank 0 · step 3"]
    assert [sum(float(t.x[i]) for t in fig.data) for i in range(2)] == [10.0, 4.0]
    assert [t.name for t in fig.data] == ["compute", "non-compute (comm, copies)", "GPU idle: host (CPU late)",
                                          "GPU idle: device (queued)"]
    causes = pd.DataFrame(dict(cause=[f"op{i}" for i in range(10)], idle_ms=[float(10 - i) for i in range(10)]))
    bars = causes_figure(causes).data[0]
    assert list(bars.y) == [f"op{i}" for i in range(8)] + ["2 other causes"] and list(bars.x)[-1] == 3.0


@shared
def test_gpu_page_on_every_gpu_run(monkeypatch: pytest.MonkeyPatch, gpu_runs: Path) -> None:
    """Every GPU run: no problem, the ledger bars sum to each window's span (the gpu
    command's numbers, the same function), the MLP runs get the host-bound recommendation."""
    from dpcore.read.rundir.load import load_run
    from dpcore.read.tables import run_gpu

    at = _app(monkeypatch, gpu_runs)
    open_page(at, "GPU")
    for run in RUNS:
        _pick(at, run)
        ledger = run_gpu(load_run(gpu_runs / run))[0]
        job = next(w for w in at.selectbox if str(w.key).startswith("gpu-job-")).value
        mine = ledger[(ledger["job_id"] == job) & (ledger["rank"] == 0)].sort_values("step")
        fig = _figure(at, 0)
        spans = [sum(float(t.x[i]) for t in fig.data) for i in range(len(mine))]
        assert spans == pytest.approx(mine["span_ms"].tolist(), rel=1e-9), run
        whole = mine[mine["step"] == -1].iloc[0]
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["idle"] == f"{whole['idle_pct']:.1f} %" and metrics["span"] == f"{whole['span_ms']:.2f} ms"
        if run not in TRANSFORMER_RUNS:  # the MLP runs: host-bound, a recommendation naming the fix
            assert bool(whole["host_bound"]), run
            # remedy by cause (the page escapes run text for Markdown: "Why\\:" renders as "Why:")
            assert any("host-bound" in i.value and "Why\\:" in i.value for i in at.info), run
        assert _figure(at, 1).data, run  # the host causes
        kernels = _figure(at, 2).data[0]  # GPU time by kernel class, GEMMs on these MLPs and transformers
        assert any(str(y).startswith("gemm") for y in kernels.y), (run, list(kernels.y))
    for run in (r for r in RUNS if r in TRANSFORMER_RUNS):  # the profiler's effect: fsdp-ws1 flagged, single-ws1 not
        _pick(at, run)
        picker = next(w for w in at.selectbox if str(w.key).startswith("gpu-job-"))
        picker.set_value("fsdp-ws1").run()
        assert any("inflated this job's steps" in w.value for w in at.warning)
        picker = next(w for w in at.selectbox if str(w.key).startswith("gpu-job-"))
        picker.set_value("single-ws1").run()
        assert not any("inflated" in w.value for w in at.warning)
        assert any("fp32 matrix products" in w.value for w in at.warning)  # fp32 GEMMs on an H200


@shared
def test_overview_shows_gpu_host_idle_instead_of_other(monkeypatch: pytest.MonkeyPatch, gpu_runs: Path) -> None:
    from dpcore.read.rundir.load import load_run
    from dpcore.read.tables import run_gpu

    at = _app(monkeypatch, gpu_runs)
    for run in RUNS:
        _pick(at, run)
        table = at.dataframe[0].value
        assert "gpu_idle_host_pct" in table and "other_ms" not in table, (run, list(table))
        whole = run_gpu(load_run(gpu_runs / run))[0].query("window == 'trace'")
        per = whole.groupby("job_id")[["idle_host_ms", "span_ms"]].sum()
        expected = sorted((100 * per["idle_host_ms"] / per["span_ms"]).tolist())
        assert sorted(table["gpu_idle_host_pct"].dropna().tolist()) == pytest.approx(expected), run
    h200_rec = "h200_rec-gpu"
    if h200_rec in RUNS:  # the README's numbers: 88.6 % of the MLP's GPU time waits for the CPU
        _pick(at, h200_rec)
        assert at.dataframe[0].value["gpu_idle_host_pct"].iloc[0] == pytest.approx(88.55, abs=0.01)


def test_only_runs_recorded_with_a_gpu_are_read_for_the_ledger() -> None:
    """A CPU run's traces are not read again for an empty ledger (one more pass over every rank);
    a dpcore.record run on a GPU says device "cpu" (its backend is "none") but counts its GPUs."""
    from types import SimpleNamespace

    from dpcore.read.dashboard.data import may_have_gpu

    env = lambda **e: SimpleNamespace(meta={"environment": e})  # noqa: E731
    assert may_have_gpu(env(device="cuda", gpus=1)) and may_have_gpu(env(device="cpu", gpus=1))
    assert not may_have_gpu(env(device="cpu", gpus=0)) and not may_have_gpu(SimpleNamespace(meta={}))


def test_gpu_page_shows_tflops_and_mfu_of_a_trace_with_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/data/gpu_mfu_rank0.json.gz imported as a run: the kernel table has the bf16 GEMMs'
    140.56 TFLOP/s and 14.21 % MFU of the H100 SXM's 989.5 (make_gpu_shapes.mfu_trace)."""
    from dpcore.read.importer.write_run import import_traces

    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(DATA / "gpu_mfu_rank0.json.gz", src / "rank0.json.gz")
    import_traces(src, tmp_path / "profiles", "mfu")
    monkeypatch.setenv("DPCORE_PROFILES", str(tmp_path / "profiles"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    open_page(at, "GPU")
    assert not problems(at)
    table = next(d.value for d in at.dataframe if "eff_pct" in d.value.columns)
    bf16 = table[table["dtype"] == "bf16"].iloc[0]
    assert bf16["tflops"] == pytest.approx(140.5625660509) and bf16["eff_pct"] == pytest.approx(14.205413, 1e-6)
    assert not any("records no shapes" in c.value for c in at.caption)
    # the cards: the ledger's three parts and both efficiency numbers, each named for what it is
    metrics = {m.label: m.value for m in at.metric}
    assert {"compute", "non-compute", "idle", "step MFU", "GEMM efficiency", "FLOPs coverage"} <= set(metrics)
