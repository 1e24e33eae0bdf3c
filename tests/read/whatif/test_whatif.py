"""The what-if model: synthetic timelines with known answers, re-packing as DDP does, the CLI on
a real 2-rank run and on a run folder written by hand without grads.csv (the fallback path)."""
from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.contract.buckets import MB, assign_buckets, assign_buckets_ddp, pack_reverse, rule_for
from dpcore.read.whatif.model import (
    RankStep,
    allreduce_ms,
    allreduce_parts,
    alpha_beta_from_line,
    fit_line,
    line_from_alpha_beta,
    replay,
    undilate,
)

ROOT = Path(__file__).resolve().parents[3]
DESIGN_COLUMNS = ["world_size", "bucket_mb", "bandwidth_gbps", "latency_us", "step_ms", "comm_ms",
                  "exposed_comm_ms"]


def _rank(fwd: float = 5.0, ready: tuple = (40.0, 30.0, 20.0, 10.0), opt: float = 3.0) -> RankStep:
    """Four gradients (registration order) ready at work 40, 30, 20, 10: backward produces the
    last-registered one first, as a feed-forward stack does."""
    return RankStep(fwd, np.array(ready), max(ready), opt)


PER_GRAD = [[3], [2], [1], [0]]  # one bucket per gradient, in launch order


def _costs(*ms: float) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(len(ms)), np.array(ms, float)


# --- the replay on timelines with known answers ----------------------------------------------
def test_perfect_overlap_step_is_backward_end_plus_optimizer() -> None:
    rp = replay([_rank(), _rank()], PER_GRAD, *_costs(5, 5, 5, 0))
    assert rp.step_ms.tolist() == [48.0, 48.0]            # 5 fwd + 40 bwd + 3 opt: comm fully hidden
    assert rp.bucket_start.tolist() == [15.0, 25.0, 35.0, 45.0]
    assert rp.exposed_ms.tolist() == [0.0, 0.0] and rp.comm_ms[0] == 15.0


def test_one_bucket_is_no_overlap() -> None:
    rp = replay([_rank()], [[3, 2, 1, 0]], *_costs(20))
    assert rp.bucket_ready.tolist() == [45.0] and rp.bucket_end.tolist() == [65.0]
    assert rp.step_ms[0] == 68.0 and rp.exposed_ms[0] == 20.0   # all comm after backward


def test_a_bucket_waits_for_the_previous_one_and_for_the_latest_rank() -> None:
    # bucket 0 takes 30 ms: bucket 1, ready at 25, starts only when bucket 0 ends at 45
    rp = replay([_rank()], PER_GRAD, *_costs(30, 5, 5, 5))
    assert rp.bucket_ready[1] == 25.0 and rp.bucket_start[1] == rp.bucket_end[0] == 45.0
    assert rp.step_ms[0] == 45 + 5 + 5 + 5 + 3
    # rank 1's gradient 2 is ready 12 ms late: the all-reduce cannot start before it is
    late = _rank(ready=(40.0, 30.0, 27.0, 10.0))
    rp = replay([_rank(), late], PER_GRAD, *_costs(1, 1, 1, 1))
    assert rp.bucket_ready[1] == 32.0 and rp.bucket_start[1] == 32.0
    assert rp.step_ms.tolist() == [49.0, 49.0]


def test_comm_dilates_backward_by_kappa() -> None:
    # while a bucket is in flight backward runs at half speed: worked out by hand
    rp = replay([_rank()], PER_GRAD, *_costs(5, 5, 5, 5), kappa=0.5)
    assert rp.bucket_start.tolist() == [15.0, 27.5, 40.0, 52.5]
    assert rp.bwd_end[0] == 52.5 and rp.step_ms[0] == 60.5 and rp.exposed_ms[0] == 5.0


def test_compute_slows_comm_by_kappa_comm() -> None:
    # while backward runs a bucket progresses at half speed (5 ms of comm take 10), after it at full
    rp = replay([_rank()], PER_GRAD, *_costs(5, 5, 5, 5), kappa_comm=0.5)
    assert rp.bucket_start.tolist() == [15.0, 25.0, 35.0, 45.0]
    assert rp.bucket_end.tolist() == [25.0, 35.0, 45.0, 50.0] and rp.step_ms[0] == 53.0


def test_undilate_inverts_the_replay() -> None:
    rp = replay([_rank()], PER_GRAD, *_costs(5, 5, 5, 5), kappa=0.5)
    # measured ready times (from backward start) and the comm in flight give back the work
    ready = np.array([rp.bwd_end[0], 40.0, 27.5, 15.0]) - 5.0
    work = undilate(ready, rp.bucket_start - 5.0, rp.bucket_end - 5.0, 0.5)
    assert np.allclose(work, [40.0, 30.0, 20.0, 10.0])


def test_two_streams_overlap_latencies() -> None:
    # two latency-only buckets ready at once: one stream runs them back to back, two at once
    lat = np.array([4.0, 4.0])
    one = replay([_rank(ready=(10.0, 10.0))], [[1], [0]], lat, np.zeros(2), streams=1)
    two = replay([_rank(ready=(10.0, 10.0))], [[1], [0]], lat, np.zeros(2), streams=2)
    assert one.bucket_end.tolist() == [19.0, 23.0] and two.bucket_end.tolist() == [19.0, 19.0]


def test_alpha_beta_formulas() -> None:
    # ring: 2(N-1)·α + 2(N-1)/N · S/B; N=4, S=1 MB (1e6 B), α=10 µs, B=1 GB/s
    assert allreduce_ms("ring", 4, 1e6, 10.0, 1.0) == pytest.approx(0.06 + 1.5)
    assert allreduce_ms("central", 4, 1e6, 10.0, 1.0) == pytest.approx(6 * (0.01 + 1.0))
    assert allreduce_ms("naive", 4, 1e6, 10.0, 1.0) == pytest.approx(3 * (0.01 + 1.0))
    assert allreduce_ms("ring", 1, 1e6, 10.0, 1.0) == 0.0
    assert allreduce_parts("ring", 2, 2e6, 100.0, 2.0) == pytest.approx((0.2, 1.0))
    a, b = line_from_alpha_beta("ring", 8, 25.0, 12.5)
    assert alpha_beta_from_line("ring", 8, a, b) == pytest.approx((25.0, 12.5))
    assert fit_line(np.array([1.0, 2.0, 4.0]), np.array([3.0, 5.0, 9.0])) == pytest.approx((1.0, 2.0))
    with pytest.raises(ValueError, match="valid choices"):
        allreduce_ms("tree", 2, 1.0, 1.0, 1.0)


# --- re-packing in reverse registration order ---------------------------------------------------
def test_repacking_matches_both_rules_and_torch_ddp() -> None:
    import torch
    import torch.distributed as dist

    reg = [1 * MB, 4096, 4 * MB, 4096, 4 * MB, 4096, 40960, 40]   # registration order (mlp-like)
    launch = reg[::-1]
    for cap_mb in (1, 4, 5, 32):
        ddp = dist._compute_bucket_assignment_by_size([torch.empty(s // 4) for s in launch], [cap_mb * MB],
                                                      [False] * len(launch), list(range(len(launch))))[0]
        assert assign_buckets_ddp(launch, cap_mb * MB) == [list(b) for b in ddp]
    assert pack_reverse(reg, 4, "ddp") == [[7, 6, 5, 4], [3, 2], [1, 0]]
    assert pack_reverse(reg, 4, "dpcore") == [[7, 6, 5], [4], [3], [2], [1, 0]]
    assert assign_buckets([10, 10, 10], 1e9, keys=["a", "a", "b"]) == [[0, 1], [2]]
    assert rule_for("torch_ddp") == "ddp" and rule_for("bucketed") == "dpcore"
    from dpcore.write.dp.variants.bucketed import assign_buckets as used_by_the_variant
    assert used_by_the_variant is assign_buckets


# --- the CLI ----------------------------------------------------------------------------------
def _cli(*args: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank bucketed sweep (and its 1-rank baseline): grads.csv written by the trainer."""
    out = tmp_path_factory.mktemp("wi")
    cmd = [sys.executable, "-m", "dpcore", "profile", "--model", "mlp", "--width", "256", "--variants",
           "bucketed", "--world-sizes", "1,2", "--bucket-sweep", "0.25,4", "--bucket-mb", "4", "--steps", "8",
           "--warmup", "2", "--no-trace", "--progress", "none", "--out", str(out), "--run-id", "r"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=600)
    return out / "r"


def test_in_job_calibration_is_in_run_json_and_leaves_timed_steps_alone(real_run: Path) -> None:
    from dpcore.contract.calibration import CAL_STEP_BASE, CAL_STEPS

    jobs = {j["id"]: j for j in json.loads((real_run / "run.json").read_text())["jobs"]}
    assert "whatif_calibration" not in jobs["bucketed-ws1-b4"]          # no comm at 1 rank: nothing to fit
    for job, plans in (("bucketed-ws2-b4", [4.0, 0.25]), ("bucketed-ws2-b0.25", [0.25, 64.0])):
        cal = jobs[job]["whatif_calibration"]
        assert [p["bucket_mb"] for p in cal["data"]] == plans and cal["cost_ms"] > 0
        assert cal["steps_per_plan"] == CAL_STEPS
        assert all(len(p["steps"]) == CAL_STEPS * 2 for p in cal["data"])      # every step of both ranks
        assert {s["rank"] for s in cal["data"][1]["steps"]} == {0, 1}
        assert len(cal["data"][1]["steps"][0]["bytes"]) != len(cal["data"][0]["steps"][0]["bytes"])
        assert {"per_message_ms", "ms_per_mib", "kappa", "plans", "note"} <= cal.keys()
    # the timed steps (0..7) and nothing else are rows
    for table in ("steps", "collectives", "grads"):
        df = pd.read_csv(real_run / f"{table}.csv")
        assert df["step"].max() < CAL_STEP_BASE and set(df[df["job_id"] == "bucketed-ws2-b4"]["step"]) == set(range(8))


def test_cli_on_a_real_run(real_run: Path, capsys: pytest.CaptureFixture) -> None:
    assert (real_run / "grads.csv").is_file()
    code, out, err = _cli("whatif", str(real_run), "--job", "bucketed-ws2-b4", "--csv", capsys=capsys)
    assert code == 0, err
    df = pd.read_csv(io.StringIO(out))
    assert list(df.columns[:7]) == DESIGN_COLUMNS
    assert sorted(df["world_size"].unique()) == [1, 2] and sorted(df["bucket_mb"].unique()) == [0.25, 4.0]
    same = df[(df["world_size"] == 2) & (df["bucket_mb"] == 4.0)].iloc[0]
    assert same["measured_job"] == "bucketed-ws2-b4"
    # replaying itself with its own buckets: alpha and B come from the in-job calibration (or the
    # comm calibration reproduces its last all-reduce end), the rest (forward, backward,
    # bookkeeping, optimizer) is measured. What is left is the loaded
    # machine's step-to-step noise (each step's comm took 10-60 ms where the replay gives every step
    # one calibrated duration): -3.4 % to +3.7 % on 22 source jobs of 11 loaded runs, once 8.5 % in CI. So the bound
    # is the band, which carries the source's own p10-p90 spread: the measured cell lies inside it.
    assert same["step_ms_lo"] <= same["measured_step_ms"] <= same["step_ms_hi"], same.to_dict()
    assert bool(same["in_band"]) and same["step_ms_lo"] < same["step_ms"] < same["step_ms_hi"]
    assert same["comm_ms"] > 0 and 0 <= same["exposed_comm_ms"] <= same["comm_ms"]
    one = df[(df["world_size"] == 1)]
    assert (one["comm_ms"] == 0).all()
    # 1 rank is faster than 2 at the same bucket size (no all-reduce to wait for); not across bucket
    # sizes: closing each of many small buckets costs backward a fixed time at any world size
    two = df[df["world_size"] == 2].set_index("bucket_mb")["step_ms"]
    assert (one.set_index("bucket_mb")["step_ms"] < two.loc[one["bucket_mb"]]).all(), df.to_dict()
    # a faster network never makes the step slower
    _, fast, _ = _cli("whatif", str(real_run), "--job", "bucketed-ws2-b4", "--csv", "--world-sizes", "2",
                      "--bucket-mb", "4", "--bandwidth-gbps", "1000", "--latency-us", "0", capsys=capsys)
    assert pd.read_csv(io.StringIO(fast))["step_ms"].iloc[0] <= same["step_ms"] + 1e-6
    code, text, _ = _cli("whatif", str(real_run), "--job", "bucketed-ws2-b4", capsys=capsys)
    assert code == 0 and "gradients from grads.csv" in text and "kappa" in text
    assert text.strip().splitlines()[-1].startswith("recommendation: ") and "MiB" in text
    assert "in-job calibration" in text            # used, or said why not
    # one cell is recommended, unless alpha fell back to its assumed default (the in-job calibration
    # implausible on a loaded box, one bucket size): then no bucket size is named, and it says why
    alpha_assumed = re.search(r"^  alpha = .*\[assumed\]", text, re.M) is not None
    assert df["recommended"].sum() == (0 if alpha_assumed else 1), text
    assert ("recommendation: none: the per-message latency alpha is assumed" in text) == alpha_assumed


@pytest.mark.parametrize("args, needle", [
    (["--job", "nope"], "unknown job 'nope'; valid choices: bucketed-ws1-b0.25"),
    (["--job", "bucketed-ws2-b4", "--bandwidth-gbps", "-1"], "--bandwidth-gbps -1 is outside"),
    (["--job", "bucketed-ws2-b4", "--bucket-mb", "1,x"], "bad --bucket-mb value 'x'"),
    (["--job", "bucketed-ws2-b4", "--world-sizes", "2,zero"], "--world-sizes"),
    (["--job", "bucketed-ws2-b4", "--algo", "tree"], "valid choices: native, ring, naive, central"),
    ([], "--job"),
])
def test_bad_input_is_one_line_and_exit_2(real_run: Path, capsys: pytest.CaptureFixture, args: list[str],
                                          needle: str) -> None:
    code, out, err = _cli("whatif", str(real_run), *args, capsys=capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


# --- a run written by hand, without grads.csv -----------------------------------------------
def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _hand_run(root: Path) -> Path:
    """2 ranks, 3 steps: forward 10 ms, backward 40 ms, two 8 MiB buckets launched 20 and 40 ms
    into backward, each all-reduced in 10 ms, optimizer 5 ms: step 65 ms. Plus a `single` job."""
    run = root / "hand"
    run.mkdir()
    jobs = [{"id": "bucketed-ws2-b8", "kind": "train", "variant": "bucketed", "world_size": 2, "bucket_mb": 8.0,
             "status": "complete"},
            {"id": "single-ws1", "kind": "train", "variant": "single", "world_size": 1, "bucket_mb": 8.0,
             "status": "complete"}]
    (run / "run.json").write_text(json.dumps({"run_id": "hand", "status": "complete", "config": {},
                                              "environment": {"backend": "gloo"}, "jobs": jobs}))
    steps, coll = [], []
    for step in range(3):
        t0 = 1_000_000_000 * (step + 1)
        for rank in range(2):
            steps.append({"job_id": "bucketed-ws2-b8", "variant": "bucketed", "world_size": 2, "bucket_mb": 8.0,
                          "rank": rank, "step": step, "profiled": False, "t_start_ns": t0, "step_ms": 65.0,
                          "fwd_ms": 10.0, "bwd_ms": 40.0, "sync_ms": 10.0, "opt_ms": 5.0, "comm_ms": 20.0,
                          "comm_ops": 2, "comm_bytes": 16 * MB, "samples": 8})
            for b, launch in enumerate((30, 50)):
                coll.append({"job_id": "bucketed-ws2-b8", "rank": rank, "step": step, "seq": 2 * step + b,
                             "op": "all_reduce", "algo": "native", "bytes": 8 * MB,
                             "t_launch_ns": t0 + launch * 1_000_000, "t_start_ns": "",
                             "t_end_ns": t0 + (launch + 10) * 1_000_000, "bucket": b})
        steps.append({**steps[-1], "job_id": "single-ws1", "variant": "single", "world_size": 1, "rank": 0})
    _write(run / "steps.csv", steps)
    _write(run / "collectives.csv", coll)
    return run


def test_hand_written_run_without_grads_uses_bucket_launches(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    run = _hand_run(tmp_path)
    bw = 8 * MB / 10e-3 / 1e9                     # ring at N=2: t = S/B, so 8 MiB in 10 ms
    args = ["whatif", str(run), "--job", "bucketed-ws2-b8", "--latency-us", "0", "--bandwidth-gbps", f"{bw!r}"]
    code, out, err = _cli(*args, "--csv", "--bucket-mb", "8,16", "--world-sizes", "2", capsys=capsys)
    assert code == 0, err
    df = pd.read_csv(io.StringIO(out)).set_index("bucket_mb")
    # same cell: the bucket ready at 30 ms runs 30-40, the second 50-60, optimizer: 65 ms
    assert df.loc[8.0, "step_ms"] == pytest.approx(65.0) and df.loc[8.0, "measured_step_ms"] == 65.0
    assert df.loc[8.0, "error_pct"] == pytest.approx(0.0, abs=1e-6)
    assert df.loc[8.0, "exposed_comm_ms"] == pytest.approx(10.0) and df.loc[8.0, "buckets"] == 2
    # one 16 MiB bucket: ready when backward ends (50 ms), 20 ms of comm, all exposed
    assert df.loc[16.0, "step_ms"] == pytest.approx(75.0) and df.loc[16.0, "exposed_comm_ms"] == pytest.approx(20.0)
    assert np.isnan(df.loc[16.0, "measured_step_ms"])
    code, text, _ = _cli(*args, capsys=capsys)
    assert "collectives.csv (fallback)" in text and "assumed 0" in text and "alpha and B given" in text
    assert "2 collective(s) at once" in text          # given alpha/B: gloo's 2 worker threads
    # alpha and B fitted from the job's own collectives: 16 MiB in 20 ms of comm per step
    code, out, _ = _cli("whatif", str(run), "--job", "bucketed-ws2-b8", "--csv", "--world-sizes", "2", capsys=capsys)
    fitted = pd.read_csv(io.StringIO(out)).set_index("bucket_mb")
    # one bucket size in the run: the default sweeps DDP's 25 MiB and a decade each way too
    assert sorted(fitted.index) == [1.0, 4.0, 8.0, 25.0, 100.0]
    fitted = fitted.loc[8.0]
    _, text, _ = _cli("whatif", str(run), "--job", "bucketed-ws2-b8", "--world-sizes", "2", capsys=capsys)
    assert "1 collective(s) at once" in text          # fitted to service times: concurrency inside
    # one unit convention (issue 24): MiB, µs, "2 ranks"; never "MB", "us" or "1 ranks"
    assert "(bucketed, 2 ranks, 8 MiB buckets," in text and "alpha = 100.0 µs" in text
    assert not re.search(r"\d MB\b|\d us\b|\b1 ranks\b", text)
    assert fitted["latency_us"] == 100.0                  # buckets of one size: the stated default alpha
    assert fitted["step_ms"] == pytest.approx(65.0, abs=1e-3)   # calibrated on itself: exact
    # an allreduce run twice as slow as the job's comm: every all-reduce is scaled by 0.5, exactly
    from dpcore.read.rundir import load_run
    from dpcore.read.whatif.predict import build_model, predict
    slow = pd.DataFrame({"algo": "native", "world_size": 2, "bytes": [MB, 8 * MB],
                         "time_ms": [2 * MB / (bw * 1e6), 2 * 8 * MB / (bw * 1e6)]})
    model = build_model(load_run(run), "bucketed-ws2-b8", allreduce=slow)
    assert model.streams == 2 and model.kappa_comm == 0.0 and model.comm_scale == pytest.approx(0.5, rel=1e-6)
    assert predict(model, [8.0], [2])["step_ms"].iloc[0] == pytest.approx(65.0, rel=1e-6)
    # a job the model cannot start from: one line naming the valid jobs
    code, _, err = _cli("whatif", str(run), "--job", "single-ws1", capsys=capsys)
    assert code == 2 and "is a single job" in err and "bucketed-ws2-b8" in err and len(err.strip().splitlines()) == 1


def test_figures_and_view_on_the_hand_written_run(tmp_path: Path) -> None:
    from dpcore.read.analysis import job_summary
    from dpcore.read.plots.whatif import breakdown_figure, replay_figure, sweep_figure
    from dpcore.read.rundir import load_run
    from dpcore.read.whatif.predict import build_model, replay_cell, replay_lanes, whatif_table
    from tests.events_path import trace_step_metrics, traced_job_events

    run = load_run(_hand_run(tmp_path))
    model = build_model(run, "bucketed-ws2-b8", latency_us=0.0, bandwidth_gbps=0.8388608)
    summary = job_summary(run, trace_step_metrics(traced_job_events(run)))
    table = whatif_table(model, run, summary, [4.0, 8.0, 16.0], [2])
    bars = breakdown_figure(table, 8.0)
    assert [t.name for t in bars.data][-2:] == ["band (spread x model error)", "measured step (same cell)"]
    assert list(bars.data[-1].y) == [65.0]                      # only the measured cell gets a diamond
    row, rep, buckets = replay_cell(build_model(run, "bucketed-ws2-b8", latency_us=0.0, bandwidth_gbps=0.8388608),
                                    2, 8.0)
    lanes = replay_lanes(rep, buckets, model.src.sizes, model.tail_ms)
    assert list(dict.fromkeys(lanes["lane"])) == ["rank 0", "rank 1", "comm"]
    comm = lanes[lanes["kind"] == "bucket"]
    assert comm["start_ms"].tolist() == pytest.approx([30.0, 50.0])
    assert comm["end_ms"].tolist() == pytest.approx([40.0, 60.0])
    names = [t.name for t in replay_figure(lanes).data]
    assert names == ["forward", "backward", "bookkeeping", "optimizer", "bucket", "bucket ready (all ranks)"]
    meas = table.rename(columns={"measured_job": "job_id"}).dropna(subset=["job_id"])
    meas = meas.assign(step_ms=meas["measured_step_ms"])
    sweep = sweep_figure(table, meas)
    assert [t.name for t in sweep.data] == ["band, 2 ranks", "predicted, 2 ranks", "measured, 2 ranks"]
    # the log axis is labelled at the swept sizes in binary units, never plotly's "2 5 1 2 5 10"
    assert sweep.layout.xaxis.type == "log" and list(sweep.layout.xaxis.tickvals) == [4.0, 8.0, 16.0]
    assert list(sweep.layout.xaxis.ticktext) == ["4 MiB", "8 MiB", "16 MiB"]
    # a measured cell far outside its band is marked as such, in both figures
    off = table.assign(measured_step_ms=table["measured_step_ms"] * 3)
    assert [t.name for t in breakdown_figure(off, 8.0).data][-1] == "measured, outside the band"
    names = [t.name for t in sweep_figure(table, meas.assign(step_ms=195.0)).data]
    assert names[-1] == "measured, outside the band" and "measured, 2 ranks" not in names

    from streamlit.testing.v1 import AppTest

    def page(path: str) -> None:
        from dpcore.read.dashboard.pages.whatif import render
        from dpcore.read.rundir import load_run
        render(load_run(path))

    at = AppTest.from_function(page, args=(str(run.path),), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) == 3 and at.metric[0].value.endswith("ms")
    # one bucket size and no latency measurement: alpha is the stated default, so no bucket size is named
    assert at.info[0].value.startswith("recommendation\\: none\\: the per-message latency alpha is assumed")


def test_job_fit_never_claims_infinite_bandwidth_when_bytes_do_not_explain_times():
    """Times that shrink as buckets grow (per-message stalls, not bytes) once fitted B = inf GB/s
    (the sample's 0.25 MB job); now alpha is 0, B a finite pure-transfer bound, and it says so."""
    from types import SimpleNamespace

    import numpy as np

    from dpcore.read.whatif.fit import fit_network

    # two collectives per step, back to back: 10 KB takes 2 ms, 1 MB takes 1 ms
    tl = SimpleNamespace(comm_start=np.array([0.0, 5.0]), comm_end=np.array([2.0, 6.0]),
                         comm_bytes=np.array([10_000.0, 1_000_000.0]))
    src = SimpleNamespace(job_id="j", world_size=2, timelines=[tl, tl])
    net = fit_network(src, "ring", None, None, None)
    assert net["alpha_us"] == 0.0 and "not fitted" in net["alpha_source"]
    # pure transfer through the points: b = sum(x*y)/sum(x*x) ms per byte, ring factor 2(N-1)/N = 1
    b = (10_000 * 2 + 1_000_000 * 1) / (10_000 ** 2 + 1_000_000 ** 2)
    assert net["bandwidth_gbps"] == pytest.approx(1.0 / (b / 1e3) / 1e9)
    assert np.isfinite(net["bandwidth_gbps"])


def test_whatif_refuses_a_sharded_job_saying_why(capsys, samples):
    """zero1 buckets too, but its optimizer step communicates: refused with the reason and the
    jobs it can replay, exit 2 (not 'unknown job')."""
    from dpcore.cli import main

    sample = samples / "sample-train"
    rc = main(["whatif", str(sample), "--job", "zero1-ws2-b25"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "is a zero1 job" in err[0] and "bucketed-ws2-b25" in err[0]


def test_in_job_calibration_gives_alpha_b_and_kappa(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A run.json calibration entry (no data: its stored numbers) is used for alpha, B and kappa,
    uncalibrated on the source; an implausible kappa from it is refused, saying so."""
    from dpcore.read.rundir import load_run
    from dpcore.read.whatif.model import alpha_beta_from_line
    from dpcore.read.whatif.predict import build_model

    run = _hand_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    cal = {"per_message_ms": 1.0, "ms_per_mib": 2.0, "kappa": 0.3, "note": "", "cost_ms": 120.0,
           "steps_per_plan": 4, "plans": [{"bucket_mb": 8.0}, {"bucket_mb": 0.25}]}
    meta["jobs"][0]["whatif_calibration"] = cal
    (run / "run.json").write_text(json.dumps(meta))
    model = build_model(load_run(run), "bucketed-ws2-b8")
    alpha, bw = alpha_beta_from_line("ring", 2, 1.0, 2.0 / MB)
    assert model.alpha_us == pytest.approx(alpha) and model.bandwidth_gbps == pytest.approx(bw)
    assert model.kappa == pytest.approx(0.3) and model.kappa_source.startswith("in-job calibration")
    assert model.streams == 1 and model.kappa_comm == 0.0 and model.comm_scale == 1.0
    assert "cost 120 ms" in model.alpha_source and "8 MiB and 0.25 MiB" in model.alpha_source
    meta["jobs"][0]["whatif_calibration"] = {**cal, "kappa": 0.99}
    (run / "run.json").write_text(json.dumps(meta))
    model = build_model(load_run(run), "bucketed-ws2-b8")
    assert "gave 0.99, outside the plausible 0-0.95: not used" in model.kappa_source and model.kappa != 0.99


def test_cli_recommends_a_measured_zero1_job_over_the_predicted_ddp_band(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """The hand-written run plus a torch_zero1 job at 2 ranks measured at 20 ms: the replayed 8 MiB
    cell (65 ms, exact) has the band 65·(1 ∓ 0.42) = 37.7-92.3 ms; 20 ms lies below it, so the
    line names ZeRO-1, measured vs predicted, 69 % faster than the own 65 ms (band 1 − 20/37.7 =
    47 % to 1 − 20/92.3 = 78 %), and no predicted cell is recommended."""
    run = _hand_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    meta["jobs"].append({"id": "torch_zero1-ws2-b8", "kind": "train", "variant": "torch_zero1", "world_size": 2,
                         "bucket_mb": 8.0, "status": "complete"})
    (run / "run.json").write_text(json.dumps(meta))
    steps = pd.read_csv(run / "steps.csv")
    z = steps[steps["job_id"] == "bucketed-ws2-b8"].assign(job_id="torch_zero1-ws2-b8", variant="torch_zero1",
                                                           step_ms=20.0, comm_ops=0, comm_ms=0.0, comm_bytes=0)
    pd.concat([steps, z]).to_csv(run / "steps.csv", index=False)
    bw = 8 * MB / 10e-3 / 1e9
    args = ["whatif", str(run), "--job", "bucketed-ws2-b8", "--latency-us", "0", "--bandwidth-gbps", f"{bw!r}",
            "--bucket-mb", "8", "--world-sizes", "2"]
    code, text, err = _cli(*args, capsys=capsys)
    assert code == 0, err
    line = text.strip().splitlines()[-1]
    assert line.startswith("recommendation: ZeRO-1 at 2 ranks: torch_zero1 (ZeRO-1, 8 MiB buckets, job "
                           "torch_zero1-ws2-b8) measured 20.0 ms"), line
    assert "bucketed at 8 MiB predicted 65.0 ms (band 37.7-92.3)" in line
    assert "69 % faster than the job's own 8 MiB (predicted 65.0 ms; band 47 to 78 %)" in line
    assert "measured vs predicted" in line
    code, out, _ = _cli(*args, "--csv", capsys=capsys)
    assert pd.read_csv(io.StringIO(out))["recommended"].tolist() == [False]
