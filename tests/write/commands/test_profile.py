"""`python -m dpcore profile` end to end on real gloo ranks: schema, rows, traces, faults."""
from __future__ import annotations

import csv
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpcore.contract.runformat import ALLREDUCE_COLUMNS, COLLECTIVE_COLUMNS, MESSAGE_COLUMNS, STEP_COLUMNS
from tests import proctable

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--model", "mlp", "--width", "64", "--batch-size", "8", "--steps", "3", "--warmup", "1",
         "--profile-steps", "2", "--progress", "none"]
MULTI = ("naive", "flat", "central", "ring", "overlap", "bucketed", "torch_ddp", "zero1",
         "torch_zero1", "fsdp", "torch_fsdp")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCORE_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _run(args: list[str], out: Path, timeout: int = 400, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcore", "profile", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout, env=_env(**env), cwd=ROOT)


def _read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path) as f:
        r = csv.DictReader(f)
        return list(r.fieldnames or []), list(r)


def _only_run(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("profiles")
    proc = _run(["--variants", "all", "--world-sizes", "1,2", "--bucket-sweep", "0.1,25"] + SMALL, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _only_run(out)


def test_run_json_has_every_job(full_run):
    meta = json.loads((full_run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["finished"]
    assert meta["config"]["model"] == "mlp" and meta["config"]["steps"] == 3
    env = meta["environment"]
    for key in ("host", "torch", "backend", "cpu_cores", "threads_per_rank", "oversubscribed", "gpus"):
        assert key in env
    jobs = {j["id"]: j for j in meta["jobs"]}
    expected = {"single-ws1", "manual-ws2", "data_parallel-ws2"}
    for v in MULTI:
        for ws in (1, 2):
            if v in ("bucketed", "torch_ddp", "zero1", "torch_zero1"):
                expected |= {f"{v}-ws{ws}-b0.1", f"{v}-ws{ws}-b25"}
            else:
                expected.add(f"{v}-ws{ws}")
    assert set(jobs) == expected
    assert jobs["data_parallel-ws2"]["status"] == "skipped"
    assert "GPU" in jobs["data_parallel-ws2"]["skip_reason"]
    import torch.distributed.fsdp as torch_fsdp_api

    for jid, job in jobs.items():
        if jid.startswith("torch_fsdp") and not hasattr(torch_fsdp_api, "fully_shard"):
            # torch 2.4/2.5 (the floor): fully_shard is not public yet, the job says so
            assert job["status"] == "skipped" and "fully_shard" in job["skip_reason"], job
        elif jid != "data_parallel-ws2":
            assert job["status"] == "complete", (jid, job.get("error"))
            assert job["kind"] == "train"
    assert set(jobs["flat-ws2"]["clock_offsets_ns"]) == {"0", "1"}
    assert all(abs(v) < 100_000 for v in jobs["flat-ws2"]["clock_offsets_ns"].values())


def test_steps_csv_schema_and_rows(full_run):
    cols, rows = _read_csv(full_run / "steps.csv")
    assert cols == STEP_COLUMNS
    per_job: dict[str, list[dict]] = {}
    for r in rows:
        per_job.setdefault(r["job_id"], []).append(r)
    # 3 timed + 2 profiled steps per rank
    assert len(per_job["flat-ws2"]) == 2 * 5 and len(per_job["single-ws1"]) == 5
    assert sum(r["profiled"] == "True" for r in per_job["flat-ws2"]) == 4
    for r in per_job["flat-ws2"]:
        parts = sum(float(r[k]) for k in ("fwd_ms", "bwd_ms", "sync_ms", "opt_ms"))
        assert abs(parts - float(r["step_ms"])) < 1e-3 * max(1.0, float(r["step_ms"]))
        assert int(r["comm_ops"]) == 1 and int(r["samples"]) == 8
        assert float(r["comm_ms"]) > 0
    naive = per_job["naive-ws2"][0]
    assert int(naive["comm_ops"]) == 32  # 16 Linear layers x (weight, bias)
    assert int(naive["comm_bytes"]) == int(per_job["flat-ws2"][0]["comm_bytes"])


def test_collectives_and_messages(full_run):
    cols, coll = _read_csv(full_run / "collectives.csv")
    assert cols == COLLECTIVE_COLUMNS
    for r in coll:
        assert int(r["t_end_ns"]) >= int(r["t_launch_ns"]) > 0
    ddp = [r for r in coll if r["job_id"] == "torch_ddp-ws2-b0.1"]
    assert ddp and len({r["bucket"] for r in ddp}) > 1  # 0.1 MB buckets: several per step
    cols, msgs = _read_csv(full_run / "messages.csv")
    assert cols == MESSAGE_COLUMNS
    ring = [m for m in msgs if m["job_id"] == "ring-ws2"]
    assert {m["phase"] for m in ring} == {"reduce_scatter", "all_gather"}
    assert {m["side"] for m in ring} == {"send", "recv"}
    central = {m["phase"] for m in msgs if m["job_id"] == "central-ws2"}
    assert central == {"gather", "broadcast"}
    assert not [m for m in msgs if m["job_id"].startswith("flat")]


def test_traces_parse_and_hold_named_ranges(full_run):
    tdir = full_run / "traces" / "bucketed-ws2-b25"
    names = sorted(p.name for p in tdir.glob("*.json.gz"))
    assert names == ["merged.json.gz", "rank0.json.gz", "rank1.json.gz"]
    trace = json.loads(gzip.decompress((tdir / "rank1.json.gz").read_bytes()))
    evnames = {e.get("name", "") for e in trace["traceEvents"]}
    for needed in ("forward", "backward", "grad_sync", "optimizer"):
        assert needed in evnames
    assert any(n.startswith("ProfilerStep#") for n in evnames)
    assert any(n.startswith("bucket") for n in evnames)
    assert trace["distributedInfo"]["rank"] == 1
    merged = json.loads(gzip.decompress((tdir / "merged.json.gz").read_bytes()))
    procs = {e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert procs == {"rank 0", "rank 1"}
    assert all(isinstance(e.get("ts", 0), (int, float)) for e in merged["traceEvents"])
    ring_rank = json.loads(gzip.decompress((full_run / "traces" / "ring-ws2" / "rank0.json.gz").read_bytes()))
    ring_names = {e.get("name", "") for e in ring_rank["traceEvents"]}
    assert {"ring_reduce_scatter_step0", "ring_all_gather_step0"} <= ring_names  # one per ring step
    ring = json.loads(gzip.decompress((full_run / "traces" / "ring-ws2" / "merged.json.gz").read_bytes()))
    starts = [e for e in ring["traceEvents"] if e["ph"] == "s"]
    ends = {e["id"] for e in ring["traceEvents"] if e["ph"] == "f"}
    assert starts and {e["id"] for e in starts} == ends


def test_every_gloo_rank_settles_its_collectives_before_the_profiler_stops(full_run):
    """Every 2-rank job's trace ends with a gloo barrier after its last recorded step: the
    profiler stopped only once every earlier collective's range had closed on gloo's thread
    (dpcore.write.capture.tracing.settle_collectives; README, "The SIGABRT over gloo")."""
    meta = json.loads((full_run / "run.json").read_text())
    skipped = {j["variant"] for j in meta["jobs"] if j["status"] == "skipped" and j["variant"] in MULTI}
    assert skipped <= {"torch_fsdp"}, skipped  # only where torch has no fully_shard (the 2.4 floor)
    jobs = [d for d in (full_run / "traces").iterdir() if d.name.split("-")[:2] in ([v, "ws2"] for v in MULTI)]
    assert {d.name.split("-")[0] for d in jobs} == set(MULTI) - skipped
    for tdir in jobs:
        for rank in (0, 1):
            ev = json.loads(gzip.decompress((tdir / f"rank{rank}.json.gz").read_bytes()))["traceEvents"]
            steps = [e for e in ev if e.get("name", "").startswith("ProfilerStep#")]
            assert len(steps) == 2, (tdir.name, rank)
            end = max(e["ts"] + e["dur"] for e in steps)
            after = [e for e in ev if e.get("name", "").startswith("gloo:") and e["ts"] >= end]
            assert [e["name"] for e in after] == ["gloo:barrier"], (tdir.name, rank)


def test_failing_job_is_recorded_and_others_run(tmp_path):
    proc = _run(["--variants", "flat,overlap", "--world-sizes", "2"] + SMALL, tmp_path,
                DPCORE_FAIL_JOB="flat-ws2")
    assert proc.returncode == 1
    run = _only_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    jobs = {j["id"]: j for j in meta["jobs"]}
    assert meta["status"] == "failed"
    assert jobs["flat-ws2"]["status"] == "failed" and "injected failure" in jobs["flat-ws2"]["error"]
    assert jobs["flat-ws2"]["failed_rank"] == 1
    assert jobs["overlap-ws2"]["status"] == "complete"
    _, rows = _read_csv(run / "steps.csv")
    assert {r["job_id"] for r in rows} == {"overlap-ws2"}


def test_ctrl_c_leaves_interrupted_run_with_finished_jobs(tmp_path):
    args = [sys.executable, "-m", "dpcore", "profile", "--variants", "flat,overlap,bucketed",
            "--world-sizes", "2", *SMALL[:-2], "--steps", "3", "--progress", "json",
            "--out", str(tmp_path)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=_env(), cwd=ROOT,
                            start_new_session=True)
    deadline = time.monotonic() + 200
    for line in proc.stdout:
        ev = json.loads(line)
        if ev["event"] == "job_start" and ev["job_index"] == 2:
            break
        assert time.monotonic() < deadline
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    run = _only_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    jobs = {j["id"]: j["status"] for j in meta["jobs"]}
    assert meta["status"] == "interrupted"
    assert jobs["flat-ws2"] == "complete" and jobs["overlap-ws2"] == "interrupted"
    _, rows = _read_csv(run / "steps.csv")
    assert {r["job_id"] for r in rows} == {"flat-ws2"}


def test_torchrun_profiles_its_world(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun) if torchrun.exists() else "torchrun", "--standalone", "--nproc-per-node",
           "2", "-m", "dpcore", "profile", "--variants", "single,ring,bucketed", *SMALL,
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = _only_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    jobs = {j["id"]: j for j in meta["jobs"]}
    assert meta["environment"]["torchrun"] is True
    assert jobs["single-ws1"]["status"] == "skipped"
    assert jobs["ring-ws2"]["status"] == "complete" and jobs["bucketed-ws2-b25"]["status"] == "complete"
    _, rows = _read_csv(run / "steps.csv")
    assert {(r["job_id"], r["rank"]) for r in rows} == {
        ("ring-ws2", "0"), ("ring-ws2", "1"), ("bucketed-ws2-b25", "0"), ("bucketed-ws2-b25", "1")}
    assert (run / "traces" / "ring-ws2" / "merged.json.gz").exists()
    # live.csv: rank 1's rows reached rank 0 through torchrun's store, one per kept step
    _, live = _read_csv(run / "live.csv")
    key = ("job_id", "rank", "step", "step_ms")
    assert sorted(tuple(r[k] for k in key) for r in live) == sorted(tuple(r[k] for k in key) for r in rows)


def test_allreduce_command_writes_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dpcore", "allreduce", "--world-sizes", "2,3",
                           "--sizes", "1KB,64KB", "--repeats", "3", "--progress", "none",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "busbw" in proc.stdout
    run = _only_run(tmp_path)
    cols, rows = _read_csv(run / "allreduce.csv")
    assert cols == ALLREDUCE_COLUMNS and len(rows) == 4 * 2 * 2
    for r in rows:
        n, t = int(r["world_size"]), float(r["time_ms"])
        algbw = int(r["bytes"]) / (t / 1e3) / 1e9
        assert abs(float(r["algbw_gbps"]) - algbw) <= 1e-5 + 1e-3 * algbw
        assert abs(float(r["busbw_gbps"]) - algbw * 2 * (n - 1) / n) <= 1e-5 + 1e-3 * algbw
    _, msgs = _read_csv(run / "messages.csv")
    naive3 = [m for m in msgs if m["job_id"] == "naive-ws3" and m["side"] == "send" and m["step"] == "0"]
    assert len(naive3) == 3 * 2  # N(N-1) messages for one call
    meta = json.loads((run / "run.json").read_text())
    assert {j["kind"] for j in meta["jobs"]} == {"allreduce"}


def test_torchrun_runs_the_allreduce_benchmark_in_its_world(tmp_path):
    """`allreduce` under torchrun: the cells run on torchrun's 2 ranks (its one world size,
    whatever --world-sizes says), rank 0 writes the run and prints the table."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun) if torchrun.exists() else "torchrun", "--standalone", "--nproc-per-node",
           "2", "-m", "dpcore", "allreduce", "--algos", "native,ring,naive", "--world-sizes", "2,4",
           "--sizes", "1KB,64KB", "--repeats", "3", "--warmup", "1", "--progress", "none",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("(complete): all-reduce, float32") == 1  # one table: rank 0's
    run = _only_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["kind"] == "allreduce"
    assert meta["environment"]["torchrun"] is True and meta["config"]["world_sizes"] == [2]
    jobs = {j["id"]: j for j in meta["jobs"]}
    assert set(jobs) == {"native-ws2", "ring-ws2", "naive-ws2"}
    for job in jobs.values():
        assert job["status"] == "complete" and job["kind"] == "allreduce", job
        assert job["wrong_elements"] == {"1024": 0, "65536": 0}
        assert set(job["clock_offsets_ns"]) == {"0", "1"}
    cols, rows = _read_csv(run / "allreduce.csv")
    assert cols == ALLREDUCE_COLUMNS
    assert sorted((r["job_id"], int(r["bytes"])) for r in rows) == sorted(
        (j, b) for j in jobs for b in (1024, 65536))
    for r in rows:
        assert int(r["world_size"]) == 2 and int(r["repeats"]) == 3
        t = float(r["time_ms"])
        algbw = int(r["bytes"]) / (t / 1e3) / 1e9
        assert t > 0 and abs(float(r["algbw_gbps"]) - algbw) <= 1e-5 + 1e-3 * algbw
        assert abs(float(r["busbw_gbps"]) - algbw) <= 1e-5 + 1e-3 * algbw  # 2(N-1)/N = 1 at N=2
    _, msgs = _read_csv(run / "messages.csv")
    assert {m["rank"] for m in msgs} == {"0", "1"}  # both ranks' messages reached rank 0
    naive = [m for m in msgs if m["job_id"] == "naive-ws2" and m["side"] == "send" and m["step"] == "0"]
    assert len(naive) == 2 * 1  # N(N-1) messages for one call
    ring = {m["phase"] for m in msgs if m["job_id"] == "ring-ws2"}
    assert ring == {"reduce_scatter", "all_gather"}
    assert not [m for m in msgs if m["job_id"] == "native-ws2"]


def _running_profile(tmp_path: Path, steps: int) -> tuple[subprocess.Popen, set[int]]:
    """Start a 2-rank profile, wait until it reports a step; return it and its process family."""
    args = [sys.executable, "-m", "dpcore", "profile", "--variants", "flat", "--world-sizes", "2",
            *SMALL[:-2], "--steps", str(steps), "--progress", "json", "--out", str(tmp_path)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    for line in proc.stdout:
        if json.loads(line)["event"] == "step":
            break
    family = proctable.descendants(proc.pid)
    assert len(family) >= 3  # forkserver + 2 ranks (+ resource tracker)
    return proc, family


def _wait_gone(family: set[int], timeout: float = 15.0) -> set[int]:
    """The pids of ``family`` still alive (not zombies) after up to ``timeout`` seconds."""
    return proctable.wait_gone(family, timeout)[0]


def test_sigterm_interrupts_cleanly_without_orphans(tmp_path):
    proc, family = _running_profile(tmp_path, 100000)
    os.kill(proc.pid, signal.SIGTERM)  # only the CLI process, as the dashboard's Stop does
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    meta = json.loads((_only_run(tmp_path) / "run.json").read_text())
    assert meta["status"] == "interrupted"
    assert not _wait_gone(family)


def test_kill_9_of_the_launcher_leaves_no_ranks(tmp_path):
    proc, family = _running_profile(tmp_path, 100000)
    proc.kill()
    proc.wait(timeout=10)
    assert not _wait_gone(family)
