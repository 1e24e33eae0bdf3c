"""``python -m dpcore gpu``: the ledger's CSV on a small trace of known answers, bad input, and on
the GPU runs in ../shared (skipped where absent): the exact values of ../shared/gpu/README.md and
an independent exact sweep of the same definition, written here in plain Python."""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.read.analysis.stragglers import call_transfer_wait
from dpcore.read.report.gpu import GPU_COLUMNS

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
SHARED = ROOT.parent / "shared"
GPU_RUNS = SHARED / "gpu" / "runs"
needs_gpu_runs = pytest.mark.skipif(not GPU_RUNS.is_dir(), reason="../shared/gpu (GPU runs) is not beside the checkout")

#: ../shared/gpu/README.md: idle, compute, non-compute % over the whole trace (exact timestamps).
README = {"runs/h200_rec-gpu/traces/torch_ddp-ws1-b1": (89.16, 8.06, 2.78),
          "runs/h200_th-gpu/traces/imported-ws1": (99.21, 0.78, 0.01),
          "runs/h200_pl-gpu-auto/traces/user-ws1": (88.78, 10.89, 0.33),
          "runs/h200_pl-gpu-ddp/traces/torch_ddp-ws1-b25": (91.36, 7.59, 1.06),
          "runs/h200_hf-gpu/traces/user-ws1": (97.98, 1.69, 0.33),
          "runs/h200_variants_ws1/traces/single-ws1": (4.28, 95.50, 0.22),
          "runs/h200_variants_ws1/traces/torch_ddp-ws1-b25": (5.21, 93.51, 1.28),
          "runs/h200_variants_ws1/traces/fsdp-ws1": (46.36, 52.84, 0.79),
          "runs/h200_variants_ws1/traces/overlap-ws1": (14.21, 85.59, 0.19),
          "traces/h200_ddp_gloo_cuda_2r/rank0.1795699453190848614.pt.trace.json.gz": (87.77, 5.21, 7.03)}
MLP_RUNS = ["h200_rec-gpu", "h200_th-gpu", "h200_pl-gpu-auto", "h200_pl-gpu-ddp", "h200_hf-gpu"]
SHARES = ["idle_pct", "compute_pct", "non_compute_pct"]


def gpu_csv(*args: str) -> pd.DataFrame:
    """``dpcore gpu ... --csv`` run in this process, its table."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["gpu", *map(str, args), "--csv"]) == 0
    return pd.read_csv(io.StringIO(out.getvalue()), keep_default_na=False)


def test_csv_columns_and_values_of_a_small_trace() -> None:
    df = gpu_csv(DATA / "gpu_ledger_rank0.json.gz", "--per-step")
    assert list(df.columns) == GPU_COLUMNS
    assert df[["window", "step"]].values.tolist() == [["trace", -1], ["step", 1], ["step", 2]]
    assert df["idle_host_ms"].tolist() == pytest.approx([0.73, 0.15, 0.45])
    assert df["idle_device_ms"].tolist() == pytest.approx([0.10, 0.0, 0.05])
    assert df["host_bound"].astype(str).tolist() == ["False", "False", "True"]
    assert df["top_idle_cause"].tolist() == ["aten::item", "Optimizer.step#SGD.step", "aten::item"]
    # without --per-step: the trace window only
    assert gpu_csv(DATA / "gpu_ledger_rank0.json.gz")["window"].tolist() == ["trace"]


def test_text_names_causes_and_recommends() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["gpu", str(DATA / "gpu_ledger_rank0.json.gz"), "--per-step"]) == 0
    text = out.getvalue()
    assert "host idle by cause (what the CPU was in while the GPU waited): aten::item 0.30 ms, python 0.28 ms, " \
           "Optimizer.step#SGD.step 0.15 ms" in text
    assert "idle_host" in text and "host_bound" in text


def test_a_cpu_trace_is_one_line_and_exit_2(capsys) -> None:
    assert main(["gpu", str(DATA / "gloo_blocking_rank0.json.gz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: no GPU events (kernels, memory copies or sets) in the traces at ")
    assert "for a CPU run use analyze or summarize" in err[-1]


def exact_shares(path: Path) -> tuple[float, float, float] | None:
    """(idle, compute, non-compute) % of a trace by docs/DESIGN.md's "GPU time" definition, swept
    here without dpcore: the busiest device's kernels, copies and sets; comm = NCCL-named kernels,
    memory = copies and sets; None when the trace has no GPU event."""
    with (gzip.open if path.name.endswith(".gz") else open)(path, "rt") as f:
        doc = json.load(f)
    legacy = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
    gpu = []
    for e in doc["traceEvents"] if isinstance(doc, dict) else doc:
        cat = legacy.get(e.get("cat"), e.get("cat")) if isinstance(e, dict) and e.get("ph") == "X" else None
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        name = str(e.get("name", ""))
        kind = ("memory" if cat != "kernel" or name.startswith(("Memcpy", "Memset"))
                else "comm" if re.match(r"(void\s+)?nccl", name, re.I) else "compute")
        gpu.append((str(e.get("pid")), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), kind))
    if not gpu:
        return None
    pids = [g[0] for g in gpu]
    dev = max(set(pids), key=pids.count)
    gpu = [g for g in gpu if g[0] == dev]

    def union(intervals: list[tuple[float, float]]) -> float:
        total, lo, hi = 0.0, None, None
        for s, e in sorted(intervals):
            if hi is None or s > hi:
                total += 0.0 if hi is None else hi - lo
                lo, hi = s, e
            else:
                hi = max(hi, e)
        return total + (0.0 if hi is None else hi - lo)

    span = max(g[2] for g in gpu) - min(g[1] for g in gpu)
    idle = span - union([(g[1], g[2]) for g in gpu])
    compute = union([(g[1], g[2]) for g in gpu if g[3] == "compute"])
    return 100 * idle / span, 100 * compute / span, 100 * (span - idle - compute) / span


def _shared_traces() -> list[Path]:
    if not SHARED.is_dir():
        return []
    return sorted(p for d in ("gpu", "traces") for p in (SHARED / d).rglob("*.json.gz"))


@needs_gpu_runs
@pytest.mark.parametrize("name", sorted(README))
def test_trace_window_matches_the_readme(name: str) -> None:
    df = gpu_csv(SHARED / "gpu" / name)
    row = df[df["window"] == "trace"].iloc[0]
    assert [row[c] for c in SHARES] == pytest.approx(README[name], abs=0.5)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared (real traces) is not beside the checkout")
def test_every_shared_gpu_trace_matches_an_exact_sweep() -> None:
    checked = 0
    for path in _shared_traces():
        want = exact_shares(path)
        if want is None:  # a CPU trace
            continue
        row = gpu_csv(path).iloc[0]
        got = [float(row[c]) for c in SHARES]
        assert got == pytest.approx(want, abs=0.5), path
        assert got == pytest.approx(want, abs=0.01), path  # the same definition: equal up to rounding
        checked += 1
    assert checked >= 20


@needs_gpu_runs
@pytest.mark.parametrize("run", MLP_RUNS)
def test_mlp_runs_are_host_bound_with_the_cause_named(run: str) -> None:
    df = gpu_csv(GPU_RUNS / run)
    row = df[df["window"] == "trace"].iloc[0]
    assert str(row["host_bound"]) == "True"
    assert row["idle_host_ms"] > 0.5 * row["span_ms"]
    assert row["top_idle_cause"] and row["top_idle_cause_ms"] > 0


@needs_gpu_runs
def test_the_variants_are_gpu_bound_and_a_run_gives_a_row_per_job() -> None:
    df = gpu_csv(GPU_RUNS / "h200_variants_ws1")
    jobs = sorted(d.name for d in (GPU_RUNS / "h200_variants_ws1" / "traces").iterdir() if d.is_dir())
    assert sorted(df["job_id"]) == jobs and len(jobs) == 12 and (df["window"] == "trace").all()
    assert (df["host_bound"].astype(str) == "False").all()


@needs_gpu_runs
def test_the_before_stop_command_in_a_subprocess() -> None:
    """What ../shared/hooks/before-stop runs: a job's traces folder, the ``window == "trace"`` row."""
    r = subprocess.run([sys.executable, "-m", "dpcore", "gpu", str(GPU_RUNS / "h200_rec-gpu/traces/torch_ddp-ws1-b1"),
                        "--csv"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(io.StringIO(r.stdout))
    row = df[df["window"] == "trace"].iloc[0]
    assert (row["job_id"], row["rank"]) == ("torch_ddp-ws1-b1", 0)
    assert [row[c] for c in SHARES] == pytest.approx([89.16, 8.06, 2.78], abs=0.01)


def test_collectives_bytes_algbw_busbw_per_call() -> None:
    """tests/data/shape_coll_meta.json.gz (make_shapes.coll_meta, world size 8): a broadcast of 80
    bytes in 50 µs, an all-reduce of 2,000 bytes in 200 µs, an all-gather of unknown bytes."""
    df = gpu_csv(DATA / "shape_coll_meta.json.gz", "--collectives")
    assert list(df.columns) == ["job_id", "rank", "step", "seq", "op", "bytes", "time_ms", "algbw_gbps", "busbw_gbps",
                                "transfer_ms", "wait_ms"]
    assert (df["transfer_ms"] == "").all() and (df["wait_ms"] == "").all()  # one rank: nothing to match against
    assert df["op"].tolist() == ["broadcast", "all_reduce", "all_gather"]
    assert df["algbw_gbps"].iloc[:2].astype(float).tolist() == pytest.approx([80 / 50e3, 2000 / 200e3])
    assert df["busbw_gbps"].iloc[:2].astype(float).tolist() == pytest.approx([80 / 50e3, 2000 / 200e3 * 2 * 7 / 8])
    assert df["bytes"].iloc[2] == "" and df["busbw_gbps"].iloc[2] == ""  # no metadata: unknown, not 0


def test_collectives_transfer_and_wait_across_ranks() -> None:
    """tests/data/gpu_nccl_2r (make_gpu_shapes.nccl_rank_trace): step 1's all-reduce took 300 µs on
    rank 0 and 100 on rank 1 (transfer 100, rank 0 waited 200), its all-gather 100 and 150 (transfer
    100, rank 1 waited 50); step 2 has 2 calls on rank 0 and 1 on rank 1: unmatched, no split."""
    df = gpu_csv(DATA / "gpu_nccl_2r", "--collectives")
    def num(v: object) -> object:  # "" (unknown) stays ""
        return v if v == "" else round(float(v), 6)

    got = {(r.rank, r.step, r.seq): (r.op, r.time_ms, num(r.transfer_ms), num(r.wait_ms)) for r in df.itertuples()}
    assert got == {(0, 1, 0): ("all_reduce", 0.3, 0.1, 0.2), (0, 1, 1): ("all_gather", 0.1, 0.1, 0.0),
                   (1, 1, 0): ("all_reduce", 0.1, 0.1, 0.0), (1, 1, 1): ("all_gather", 0.15, 0.1, 0.05),
                   (0, 2, 0): ("all_reduce", 0.1, "", ""), (0, 2, 1): ("all_reduce", 0.1, "", ""),
                   (1, 2, 0): ("all_reduce", 0.15, "", "")}
    assert df.loc[(df["rank"] == 0) & (df["step"] == 1), "bytes"].tolist() == [2 * 1048576, 4 * 262144]


def test_transfer_and_wait_leave_point_to_point_out() -> None:
    calls = pd.DataFrame({"job_id": "j", "rank": [0, 0, 1, 1], "step": 1, "seq": [0, 1, 0, 1],
                          "op": ["send_recv", "all_reduce", "send_recv", "all_reduce"],
                          "time_ms": [5.0, 2.0, 1.0, 3.0]})
    out = call_transfer_wait(calls)
    assert out["transfer_ms"].tolist()[1::2] == [2.0, 2.0] and out["wait_ms"].tolist()[1::2] == [0.0, 1.0]
    assert out["transfer_ms"].iloc[::2].isna().all()  # a send and a recv are no collective of both ranks
