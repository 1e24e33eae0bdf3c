"""What users read on the dashboard: binary sizes, empty cells that say why, table heights, compare
mode, bucket lines, ring pictures, Perfetto hand-off, download names and the New run form.

Why these tests: the polish items are easy to undo by accident (a new table forgets the binary
units, a new figure reuses one colour for send and receive, a form goes back to submitting on
Enter). Each test pins the behaviour a user saw fixed: known answers for the formatting rule,
figure properties for the pure builders, the CLI's text, and the app's widgets via AppTest.
"""
from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from dpcore.contract.errors import UsageError
from dpcore.contract.ringplan import ring_schedule
from dpcore.contract.units import EMPTY, binary_size, cell, mib_size
from dpcore.read.dashboard.compare import config_diff, ratio_table, shared_y_max
from dpcore.read.dashboard.perfetto import MAX_EMBED_BYTES, PERFETTO_JS, perfetto_data, too_big
from dpcore.read.dashboard.picker import comparable, default_second, run_labels
from dpcore.read.dashboard.table_cells import bucket_text, overview_rows, status_text, table_height
from dpcore.read.plots.buckets import bucket_figure
from dpcore.read.plots.ring import aggregate_pieces, message_figure
from dpcore.read.plots.ring_circle import ring_circle_figure
from dpcore.read.plots.style import SIDE_COLORS
from dpcore.read.rundir.load import list_runs
from tests.app_pages import open_page

ROOT = Path(__file__).resolve().parents[3]
APP = str(ROOT / "app.py")


# --- one formatting rule: binary units, "—" for nothing -------------------------------------

@pytest.mark.parametrize("value,text", [(16777216, "16 MiB"), (1024, "1 KiB"), (1536, "1.5 KiB"), (512, "512 B"),
                                        (0, "0 B"), (3957800, "3.77 MiB"), (2**30, "1 GiB"), (17_000_000, "16.2 MiB"),
                                        (None, "—"), (float("nan"), "—"), ("x", "—")])
def test_binary_size_known_answers(value, text) -> None:
    assert binary_size(value) == text


def test_mib_and_cells() -> None:
    assert mib_size(0.25) == "256 KiB" and mib_size(25) == "25 MiB" and mib_size(None) == EMPTY
    assert cell(None) == cell(float("nan")) == cell("") == "—" and cell(3) == "3"


# --- tables ------------------------------------------------------------------------------------

def test_empty_cells_say_what_they_mean() -> None:
    assert status_text("skipped", "data_parallel", "data_parallel needs 2 or more GPUs on this host; found 0") == \
        "skipped: needs 2 or more GPUs on this host; found 0"
    assert status_text("failed", "ring", None, "rank 1 died (SIGKILL)\ntraceback") == "failed: rank 1 died (SIGKILL)"
    assert status_text("complete", "ring", None) == "complete" and status_text(None, "ring", None) == "—"
    assert bucket_text("ring", 25.0) == "" and bucket_text("bucketed", 1.0) == "1 MiB"
    assert bucket_text("torch_ddp", 0.25) == "256 KiB"


def test_overview_rows_and_height() -> None:
    summary = pd.DataFrame(dict(job_id=["ring-ws2", "bucketed-ws2-b1", "data_parallel-ws2"],
                                variant=["ring", "bucketed", "data_parallel"], world_size=2,
                                bucket_mb=[25.0, 1.0, 25.0],
                                status=["complete", "complete", "skipped"], comm_bytes=[16777216, 4 << 20, np.nan]))
    jobs = pd.DataFrame(dict(job_id=["data_parallel-ws2"], skip_reason=["data_parallel needs 2 or more GPUs"],
                             error=[None]))
    rows = overview_rows(summary, jobs)
    assert rows["bucket_mb"].tolist() == ["", "1 MiB", ""]
    assert rows["comm_bytes"].tolist() == ["16 MiB", "4 MiB", "—"]
    assert rows["status"].iloc[2] == "skipped: needs 2 or more GPUs"
    assert table_height(25) > table_height(10) > table_height(1)  # every row shown, no inner scroll


# --- compare mode ------------------------------------------------------------------------------

def test_compare_defaults_to_a_run_of_the_same_kind() -> None:
    runs = pd.DataFrame(dict(  # newest first, as list_runs returns them
        path=["/p/bench-new", "/p/train-a", "/p/train-other-model", "/p/train-b"],
        kinds=["allreduce", "train", "train", "train"], model=[None, "mlp", "transformer", "mlp"],
        size=[None, "tiny", "tiny", "tiny"], backend="gloo", world_sizes=["2", "1,2", "1,2", "1,2"],
        variants=["native,ring", "flat,ring", "flat,ring", "flat,ring"], device="cpu", status="complete"))
    assert default_second(runs, "train-a") == "train-b"  # not the newer benchmark, not the other model
    # a benchmark has nothing in common with a training run: no pairing at all (the sidebar says so)
    assert default_second(runs, "bench-new") is None and comparable(runs, "bench-new") == []
    assert comparable(runs, "train-a") == ["train-other-model", "train-b"]
    assert default_second(runs.iloc[:1], "bench-new") is None


def test_compare_mode_on_the_shipped_samples_pairs_like_with_like(monkeypatch: pytest.MonkeyPatch,
                                                                  samples: Path) -> None:
    """The samples: two training runs (sample-train, sample-hang) and an all-reduce benchmark.
    Compare pairs a training run only with the other training run, never with the benchmark, and
    the benchmark, which has no other benchmark, with nothing (the sidebar says so); a run's
    `repeats: 0` reads as what it means."""
    if not (samples / "sample-allreduce").is_dir():
        pytest.skip("sample runs not present")
    kinds = list_runs(samples)[0].set_index("run_id")["kinds"]  # newest first, as the picker lists them
    train = [r for r, k in kinds.items() if "train" in str(k)]
    assert "sample-train" in train and "sample-allreduce" not in train
    monkeypatch.setenv("DPCORE_PROFILES", str(samples))
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.sidebar.toggle(key="compare").set_value(True).run()
    assert not at.exception
    second = [s for s in at.sidebar.selectbox if s.key == "run_b"]
    assert [s.options for s in second] == ([[picker_label(samples, r) for r in train if r != "sample-train"]]
                                           if len(train) > 1 else [])
    at.sidebar.selectbox(key="run_a").set_value("sample-allreduce").run()
    assert not at.exception
    assert not [s for s in at.sidebar.selectbox if s.key == "run_b"]
    assert any("No other run has allreduce jobs to compare with sample-allreduce" in i.value for i in at.sidebar.info)
    diff = config_diff({"a": {"config": {"repeats": 0}}, "b": {"config": {"repeats": 5}}})
    assert diff.iloc[0]["a"].startswith("by size (50 up to 64 KiB")


def picker_label(root: Path, run_id: str) -> str:
    """The sidebar's label of a committed sample run (``run_labels``: "· status" unless complete)."""
    return run_labels(list_runs(root)[0])[run_id]  # the samples' folders are their run ids


def test_config_difference_and_ratio_column() -> None:
    a = {"config": {"model": "mlp", "width": 256, "steps": 10}, "environment": {"backend": "gloo", "host": "x"}}
    b = {"config": {"model": "mlp", "width": 512, "steps": 10}, "environment": {"backend": "gloo", "host": "y"}}
    diff = config_diff({"A": a, "B": b})
    assert diff.to_dict("records") == [{"setting": "config.width", "A": "256", "B": "512"}]  # host never matters
    assert config_diff({"A": a, "B": a}).empty
    sa = pd.DataFrame(dict(variant=["ring", "flat"], world_size=[2, 2], bucket_mb=25.0, step_ms=[10.0, 8.0],
                           exposed_ms=[2.0, 1.0]))
    sb = sa.assign(step_ms=[15.0, 4.0])
    t = ratio_table({"A": sa, "B": sb})
    assert t["T: B/A"].tolist() == [1.5, 0.5] and t["job"].tolist() == ["ring ×2", "flat ×2"]
    top = shared_y_max([sa.assign(step_ms_p90=[11.0, 9.0]), sb.assign(step_ms_p90=[16.0, 5.0])])
    assert top == pytest.approx(1.08 * 16.0)  # one scale for both runs' charts


# --- buckets -----------------------------------------------------------------------------------

def test_bucket_lines_of_one_variant_are_distinguishable() -> None:
    df = pd.DataFrame(dict(variant=["bucketed"] * 4, world_size=[1, 1, 2, 2], bucket_mb=[0.25, 25] * 2,
                           step_ms=[3, 4, 9, 10], exposed_ms=[0, 0, 2, 6]))
    fig = bucket_figure(df)
    legend = [t for t in fig.data if t.showlegend]
    assert [t.name for t in legend] == ["bucketed ×1", "bucketed ×2"]
    one, two = legend
    assert one.line.color == two.line.color  # colour = variant
    assert one.line.dash != two.line.dash and one.marker.symbol != two.marker.symbol  # dash/marker = N
    assert list(fig.layout.xaxis.ticktext) == ["256 KiB", "25 MiB"]


def test_sample_script_sweeps_buckets_that_differ() -> None:
    text = (ROOT / "scripts" / "make_sample.sh").read_text()
    assert "--bucket-sweep 0.25,1,2" in text and "--bucket-sweep 1,4 " not in text


# --- ring messages -----------------------------------------------------------------------------

def pipelined_ring(n: int, pieces: int) -> pd.DataFrame:
    """Messages of one ring all-reduce call at n ranks, each chunk sent as `pieces` sub-messages."""
    rows, t = [], 0
    for s in ring_schedule(n):
        for k in range(pieces):
            common = dict(job_id=f"ring-ws{n}", algo="ring", step=0, call=0, phase=s.phase, ring_step=s.ring_step,
                          bytes=1 << 20, t_post_ns=t + k * 1000)
            rows.append(dict(common, rank=s.rank, src=s.rank, dst=s.dst, chunk=s.send_chunk, side="send",
                             t_done_ns=t + k * 1000 + 50_000))
            rows.append(dict(common, rank=s.dst, src=s.rank, dst=s.dst, chunk=s.send_chunk, side="recv",
                             t_done_ns=t + k * 1000 + 80_000))
        t += 100_000
    return pd.DataFrame(rows)


def _arrows(fig: go.Figure) -> int:
    return sum(int(np.isnan(np.asarray(t.x, float)).sum()) for t in fig.data
               if isinstance(t, go.Scatter) and t.mode == "lines+markers")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_sub_messages_are_one_arrow_per_chunk_and_ring_step(n: int) -> None:
    msgs = pipelined_ring(n, pieces=4)
    assert len(aggregate_pieces(msgs)) == 2 * 2 * n * (n - 1)  # a send and a receive per chunk message
    assert _arrows(message_figure(msgs)) == 2 * n * (n - 1)  # 2(N−1) steps × N chunk transfers
    assert _arrows(message_figure(msgs, show_pieces=True)) == 4 * 2 * n * (n - 1)


def test_send_and_receive_colours_differ_and_labels_are_optional() -> None:
    fig = message_figure(pipelined_ring(3, pieces=2))
    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    colours = {t.name.split(" ")[0]: t.marker.color for t in bars}
    assert colours["send"] != colours["receive"] and SIDE_COLORS["send"] != SIDE_COLORS["recv"]
    assert all(("send" in t.name) != ("receive" in t.name) and "·" in t.name for t in bars)  # legend: side · phase
    assert not [t for t in fig.data if isinstance(t, go.Scatter) and t.mode == "text"]
    labelled = message_figure(pipelined_ring(3, pieces=2), label_size=12)
    texts = [t for t in labelled.data if isinstance(t, go.Scatter) and t.mode == "text"]
    assert texts and texts[0].textfont.size == 12 and texts[0].text[0].endswith("×2")


def test_chunk_labels_of_crossing_arrows_do_not_overlap() -> None:
    """In a 2-rank ring the two arrows of a ring step cross at their midpoints: labels there printed
    over each other. Placed a third of the way from the sender and kept only where clear of the
    others, no two labels' boxes overlap in the diagram's own coordinates."""
    from itertools import combinations

    from dpcore.read.plots.labels import boxes_overlap, label_box
    from dpcore.read.plots.ring import DIAGRAM_PLOT_PX

    fig = message_figure(pipelined_ring(2, pieces=1), label_size=12)
    texts = [t for t in fig.data if isinstance(t, go.Scatter) and t.mode == "text"]
    points = [(x, y, s) for t in texts for x, y, s in zip(t.x, t.y, t.text)]
    assert len(points) >= 2
    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    x1 = max(float(b + w) for t in bars for b, w in zip(t.base, t.x))
    h = fig.layout.height - 180.0
    boxes = [label_box(x / x1 * DIAGRAM_PLOT_PX, (y + 0.5) / 2 * h, s) for x, y, s in points]
    assert not any(boxes_overlap(a, b) for a, b in combinations(boxes, 2))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_circle_steps_through_the_plan(n: int) -> None:
    fig = ring_circle_figure(n, chunk_bytes="4 MiB")
    assert len(fig.frames) == 2 * (n - 1) == len(fig.layout.sliders[0].steps)
    first = fig.frames[0]
    heads, labels = first.data[1], first.data[2]
    assert len(heads.x) == n  # one chunk transfer per rank per step, rank r -> r+1
    plan = [s for s in ring_schedule(n) if s.phase == "reduce_scatter" and s.ring_step == 0]
    assert list(labels.text) == [f"chunk {s.send_chunk} (4 MiB)" for s in plan]
    assert first.name == "reduce-scatter step 1" and fig.frames[-1].name == f"all-gather step {n - 1}"
    assert ring_circle_figure(3, label_size=0).frames[0].data[2].text[0] == ""


def test_ring_view_on_an_allreduce_run_picks_message_sizes(monkeypatch: pytest.MonkeyPatch,
                                                           samples: Path) -> None:
    if not (samples / "sample-allreduce" / "run.json").exists():
        pytest.skip("sample runs not present")
    monkeypatch.setenv("DPCORE_PROFILES", str(samples))
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.sidebar.selectbox(key="run_a").set_value("sample-allreduce").run()
    open_page(at, "Ring messages")
    assert not at.exception and not at.error
    picker = next(s for s in at.selectbox if s.label == "Message size")
    assert "16 MiB" in picker.options and not [s for s in at.selectbox if s.label == "Step"]
    assert any(t.label == "Show sub-messages" for t in at.toggle)
    assert len(at.get("plotly_chart")) >= 4  # diagram, circle, wait/transfer, chunks, counts


# --- traces ------------------------------------------------------------------------------------

def test_open_in_perfetto_posts_the_trace_after_pong() -> None:
    trace = b"\x1f\x8b fake gzip bytes"
    payload = perfetto_data(trace, "run </script><b>x", "run-job-rank0.json.gz")
    assert "window.open(data.origin)" in PERFETTO_JS and '"PING"' in PERFETTO_JS and '"PONG"' in PERFETTO_JS
    assert "perfetto: {buffer: bytes(), title: data.title, fileName: data.fileName}" in PERFETTO_JS
    assert base64.b64decode(payload["b64"]) == trace and payload["origin"] == "https://ui.perfetto.dev"
    # run-provided text travels as data, set as text: the fixed script never builds HTML from it
    assert payload["title"] == "run </script><b>x" and "innerHTML" not in PERFETTO_JS
    assert too_big(MAX_EMBED_BYTES + 1) and not too_big(MAX_EMBED_BYTES)
    with pytest.raises(ValueError):
        perfetto_data(b"x" * (MAX_EMBED_BYTES + 1), "t", "f")


def test_no_deprecated_streamlit_api_in_the_dashboard() -> None:
    """`st.components.v1` is past its announced removal date (2026-06-01): nothing may use it."""
    root = Path(__file__).resolve().parents[3]
    users = [str(p) for p in [root / "app.py", *(root / "dpcore").rglob("*.py")]
             if "components.v1" in p.read_text(encoding="utf-8")]
    assert users == []


def test_download_names_carry_the_run_id() -> None:
    from dpcore.read.dashboard.pages.traces import download_name

    class FakeRun:
        meta = {"run_id": "20250101-120000-mlp"}
        path = Path("/profiles/copy-of-run")
    assert download_name(FakeRun(), "ring-ws2", "rank0.json.gz") == "20250101-120000-mlp-ring-ws2-rank0.json.gz"
    FakeRun.meta = {"run_id": "../../evil name"}
    assert "/" not in download_name(FakeRun(), "ring-ws2", "merged.json.gz")


# --- new run form ------------------------------------------------------------------------------

def _blocks(node):
    for child in getattr(node, "children", {}).values():
        yield child
        yield from _blocks(child)


def test_enter_in_the_new_run_form_does_not_start_a_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DPCORE_PROFILES", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=60).run()
    open_page(at, "New run")
    forms = [b for b in _blocks(at._tree) if getattr(b, "type", None) == "form"]
    assert forms, "the New run form is not drawn"
    assert all(not b.proto.form.enter_to_submit for b in forms)


# --- CLI ---------------------------------------------------------------------------------------







def test_compare_mode_scaling_panels_share_y_axes():
    """Two runs' scaling frames give one y top per panel (max over runs, p90 whiskers and the
    ideal line included, efficiency at least 1), and the figure applies them panel by panel."""
    import pandas as pd

    from dpcore.read.plots.scaling import scaling_figure, shared_ranges

    def frame(step, p90, thr, sp, eff):
        return pd.DataFrame({"variant": ["flat", "flat"], "world_size": [1, 2], "step_ms": step,
                             "step_ms_p10": step, "step_ms_p90": p90, "throughput": thr,
                             "speedup": sp, "efficiency": eff, "ideal_speedup": [1, 2]})

    a = frame([10, 12], [11, 30], [100, 160], [1.0, 1.6], [1.0, 0.8])
    b = frame([20, 25], [21, 26], [50, 80], [1.0, 2.5], [1.0, 1.25])
    tops = dict(shared_ranges([a, b]))
    assert tops["step_ms"] == pytest.approx(30 * 1.08)      # run a's p90 whisker
    assert tops["throughput"] == pytest.approx(160 * 1.08)
    assert tops["speedup"] == pytest.approx(2.5 * 1.08)
    assert tops["efficiency"] == pytest.approx(1.25 * 1.08)
    fig = scaling_figure(a, ranges=tuple(tops.items()))
    assert list(fig.layout.yaxis.range) == pytest.approx([0, 30 * 1.08])
    assert list(fig.layout.yaxis4.range) == pytest.approx([0, 1.25 * 1.08])
    assert scaling_figure(a).layout.yaxis.range is None      # one run alone: autorange


def test_new_run_command_carries_the_optimizer_and_refuses_unknown_ones(tmp_path):
    """The New-run form can make the ZeRO trade visible (Adam); a value outside the CLI's
    choices never reaches the command line."""
    from dpcore.read.dashboard.launcher import build_command

    cmd = build_command(tmp_path, "mlp", "tiny", ["zero1", "bucketed"], [1, 2], 5, 25.0, [], "adam")
    assert cmd[cmd.index("--optimizer") + 1] == "adam"
    plain = build_command(tmp_path, "mlp", "tiny", ["single"], [1], 5, 25.0, [])
    assert plain[plain.index("--optimizer") + 1] == "sgd"
    with pytest.raises(ValueError, match="optimizer"):
        build_command(tmp_path, "mlp", "tiny", ["single"], [1], 5, 25.0, [], "lion")


def test_new_run_form_offers_device_backend_and_dtype(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU user starts a cuda/nccl/bf16 profile from the form: the three choices are the CLI's
    own (DEVICES, BACKENDS, DTYPES), passed as given; a value outside them never reaches the command."""
    from dpcore.contract.config import BACKENDS, DEVICES, DTYPES
    from dpcore.read.dashboard.launcher import build_command

    cmd = build_command(tmp_path, "transformer", "small", ["torch_ddp"], [2], 5, 25.0, [], device="cuda",
                        backend="nccl", dtype="bf16")
    assert [cmd[cmd.index(f) + 1] for f in ("--device", "--backend", "--dtype")] == ["cuda", "nccl", "bf16"]
    plain = build_command(tmp_path, "mlp", "tiny", ["single"], [1], 5, 25.0, [])
    assert [plain[plain.index(f) + 1] for f in ("--device", "--backend", "--dtype")] == ["auto"] * 3
    with pytest.raises(ValueError, match="unknown backend 'mpi'; valid choices: auto, gloo, nccl"):
        build_command(tmp_path, "mlp", "tiny", ["single"], [1], 5, 25.0, [], backend="mpi")
    monkeypatch.setenv("DPCORE_PROFILES", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=120).run()
    open_page(at, "New run")
    boxes = {b.label: b.options for b in at.selectbox}
    assert (boxes["Device"], boxes["Backend"], boxes["Dtype"]) == (list(DEVICES), list(BACKENDS), list(DTYPES))


def test_new_run_form_passes_the_mlp_width_and_runs_show_it(tmp_path, samples):
    """`--size` is the transformer's knob: an mlp run is told apart by its width, which the New-run
    command carries and the run list shows ('mlp tiny' named two different mlps alike)."""
    from dpcore.contract.config import model_size_text
    from dpcore.read.dashboard.launcher import build_command

    cmd = build_command(tmp_path, "mlp", "tiny", ["single"], [1], 5, 25.0, [], width=256)
    assert cmd[cmd.index("--width") + 1] == "256"
    with pytest.raises(UsageError):
        build_command(tmp_path, "mlp", "tiny", ["single"], [1], 5, 25.0, [], width=0)
    assert model_size_text({"model": "mlp", "size": "tiny", "width": 256}) == "width 256"
    assert model_size_text({"model": "mlp", "size": "tiny", "width": 512}) == "width 512"
    assert model_size_text({"model": "transformer", "size": "small", "width": 512}) == "small"
    assert model_size_text({"model": "einsum", "size": "tiny"}) == ""
    if (samples / "sample-train").is_dir():
        from dpcore.read.rundir.load import list_runs

        runs = list_runs(samples)[0]
        assert runs.set_index("run_id").at["sample-train", "size"] == "width 256"


def test_progress_says_why_a_job_has_more_steps_than_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """`--steps 6` runs 13 steps (3 warm-up, 6 timed, 1 + 3 under the profiler): the New-run progress
    says so instead of a bare 'step 7/13'."""
    from dpcore.read.dashboard.launcher import parse_event, progress_of
    from dpcore.write.runtime.progress import Progress

    p = Progress("json", jobs_total=1)
    p.job_start("flat-ws2", 13, "3 warm-up + 6 timed + 4 under the profiler")
    p.step({"done": 7})
    events = [e for e in map(parse_event, capsys.readouterr().out.splitlines()) if e]
    _, text, _ = progress_of(events)
    assert text == "job 1/1: flat-ws2 · step 7/13 (3 warm-up + 6 timed + 4 under the profiler)"


def test_a_long_status_is_cut_at_a_word_in_the_cell() -> None:
    from dpcore.read.dashboard.table_cells import STATUS_CHARS, short_status

    long = "skipped: needs 2 or more GPUs on this host; found 0"
    cut = short_status(long)
    assert cut == "skipped: needs 2 or more…" and len(cut) <= STATUS_CHARS
    assert short_status("complete") == "complete" and short_status("x" * 40) == "x" * (STATUS_CHARS - 1) + "…"


def test_overview_cuts_a_long_status_and_shows_it_whole_below(monkeypatch: pytest.MonkeyPatch,
                                                              samples: Path) -> None:
    """The Overview table's status cell holds at most STATUS_CHARS characters; the whole reason
    is in a caption and in the column's help; the step's numbers come right after the status."""
    from dpcore.read.dashboard.pages.overview import SUMMARY_COLS
    from dpcore.read.dashboard.table_cells import STATUS_CHARS

    if not (samples / "sample-train").is_dir():
        pytest.skip("sample runs not present")
    assert SUMMARY_COLS[3:8] == ["status", "step_ms", "comm_fraction", "overlap_pct", "exposed_ms"]
    monkeypatch.setenv("DPCORE_PROFILES", str(samples))
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception
    table = at.dataframe[0].value
    assert table["status"].str.len().max() <= STATUS_CHARS
    skipped = table[table["status"].str.startswith("skipped")]
    assert len(skipped) and skipped["status"].str.endswith("…").all()
    whole = [c.value.replace("\\", "") for c in at.caption]  # the caption is escaped Markdown
    assert any("data_parallel ×2 skipped: needs 2 or more GPUs on this host; found 0" in c for c in whole)


def test_a_run_label_fits_the_sidebar_with_its_status_first() -> None:
    from dpcore.read.dashboard.picker import LABEL_CHARS, LABEL_PX, label_px

    long = "20261126-132743-hf-gpu-13af"
    runs = pd.DataFrame({"run_id": [long, "sample-hang", "sample-train"],
                         "path": [f"/p/{long}", "/p/sample-hang", "/p/sample-train"],
                         "status": ["failed", "failed", "complete"]})
    labels = run_labels(runs)
    assert labels["sample-train"] == "sample-train" and labels["sample-hang"] == "failed · sample-hang"
    assert labels[long].startswith("failed · 20261126-1") and labels[long].endswith("gpu-13af")
    assert "…" in labels[long] and all(len(v) <= LABEL_CHARS and label_px(v) <= LABEL_PX for v in labels.values())
