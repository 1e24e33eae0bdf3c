"""``dpcore.record`` on a user's own loop: a plain DDP loop at 2 gloo ranks, one process without a
process group, a dpcore.wrap wrapper, and failures; every run must read back through the analysis
the dashboard uses."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from dpcore.write.commands.record import record
from tests import spawned

WARMUP, PROFILE, STEPS = 2, 2, 8


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 8))


def _loop(rec, model: nn.Module, steps: int = STEPS, fail_at: int | None = None) -> None:
    """The user's training loop: nothing dpcore-specific but the step and phase marks."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1 + (dist.get_rank() if dist.is_initialized() else 0))
    for i in range(steps):
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 8, (32,), generator=g)
        with rec.step():
            if i == fail_at:
                raise ValueError("boom in the user's loop")
            with rec.phase("forward"):
                loss = nn.functional.cross_entropy(model(x), y)
            with rec.phase("backward"):
                loss.backward()
            with rec.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)


def _rank(rank: int, world: int, store: str, out: str, kind: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        if kind.startswith("ddp"):
            model: nn.Module = DistributedDataParallel(_net(), bucket_cap_mb=0.1)
        else:
            import dpcore.write.dp.variants as variants
            model = variants.wrap(kind, _net(), bucket_mb=0.1)
        cal = None
        if kind == "ddp-cal":  # the user's forward on a batch of theirs, for the what-if calibration
            xc, yc = torch.randn(32, 64), torch.randint(0, 8, (32,))
            cal = lambda m: nn.functional.cross_entropy(m(xc), yc)  # noqa: E731
        with record(out, name=kind, model=model, warmup=WARMUP, profile_steps=PROFILE,
                    samples=32, calibrate=cal, calibration_steps=2) as rec:
            _loop(rec, model)
            before = [p.detach().clone() for p in model.parameters()]
        if kind == "ddp-cal":  # the calibration left the trained weights and the (cleared) grads alone
            same = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
            torch.save({"same": same, "grads": [p.grad is None for p in model.parameters()]},
                       Path(out).parent / f"after{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    spawned.leave()


def _spawn(tmp_path: Path, kind: str) -> Path:
    out = tmp_path / "profiles"
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), str(out), kind), nprocs=2, join=True)
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _check_readable(run_dir: Path, job: str, ws: int, comm: bool) -> None:
    """What the dashboard and `summarize` show must be sane numbers."""
    from dpcore.read.analysis import job_summary, timeline
    from dpcore.read.report.summarize import summarize
    from dpcore.read.rundir import load_run
    from tests.events_path import step_trace_lanes, trace_step_metrics, traced_job_events

    run = load_run(run_dir)
    assert run.meta["status"] == "complete" and run.meta["kind"] == "record"
    st = run.steps
    assert sorted(st["rank"].unique()) == list(range(ws))
    assert sorted(st["step"].unique()) == list(range(WARMUP, STEPS))
    traced = run.traced_steps(job)
    assert traced == list(range(WARMUP, WARMUP + PROFILE))
    assert (st["step_ms"] > 0).all() and (st["fwd_ms"] > 0).all() and (st["bwd_ms"] > 0).all()
    from dpcore.read.rundir.live import read_live
    live = read_live(run_dir)  # every rank's rows reached rank 0 through the job's store
    assert dict(zip(zip(live["rank"], live["step"]), live["step_ms"])) == \
        dict(zip(zip(st["rank"], st["step"]), st["step_ms"]))
    if comm:  # the same rule on the same collectives as steps.csv's comm_ms
        assert dict(zip(zip(live["rank"], live["step"]), live["comm_ms"])) == \
            dict(zip(zip(st["rank"], st["step"]), st["comm_ms"]))
    s = job_summary(run, trace_step_metrics(traced_job_events(run))).set_index("job_id").loc[job]
    assert s["step_ms"] > 0 and s["n_steps"] > 0
    if comm:
        assert s["comm_ms"] > 0
        assert (st["comm_ops"] > 0).all()
        coll = run.collectives
        assert (coll["t_end_ns"] >= coll["t_launch_ns"]).all() and set(coll["op"]) == {"all_reduce"}
    lanes = timeline(run, job, traced[0], step_trace_lanes(run, job, traced[0]))
    assert set(lanes["rank"]) == set(range(ws)) and "compute" in set(lanes["lane"])
    if comm:
        assert "comm" in set(lanes["lane"])
    assert job in summarize(str(run_dir))
    assert (run_dir / "traces" / job / "merged.json.gz").exists()


def test_plain_ddp_loop_at_two_gloo_ranks(tmp_path: Path) -> None:
    run_dir = _spawn(tmp_path, "ddp")
    meta = json.loads((run_dir / "run.json").read_text())
    job = meta["jobs"][0]
    assert job["id"] == "torch_ddp-ws2-b0.1" and job["variant"] == "torch_ddp"
    assert job["status"] == "complete" and set(job["clock_offsets_ns"]) == {"0", "1"}
    assert meta["config"]["model"] == "Sequential" and meta["config"]["steps"] == STEPS - WARMUP
    assert sorted(job["traces"]) == ["merged.json.gz", "rank0.json.gz", "rank1.json.gz"]
    _check_readable(run_dir, job["id"], 2, comm=True)


def test_ddp_loop_with_the_what_if_calibration(tmp_path: Path) -> None:
    """calibrate=: after the loop, 2 steps per plan of the user's forward and backward with the
    job's 0.1 MiB buckets and the second plan's one 64 MiB bucket, into run.json as profile does."""
    from dpcore.contract.calibration import CAL_STEP_BASE
    from dpcore.read.rundir import load_run
    from dpcore.read.whatif.fit import calibration_of

    run_dir = _spawn(tmp_path, "ddp-cal")
    _check_readable(run_dir, "torch_ddp-ws2-b0.1", 2, comm=True)  # the recorded steps as without it
    run = load_run(run_dir)
    assert run.collectives["step"].max() < CAL_STEP_BASE and run.steps["step"].max() == STEPS - 1
    cal = calibration_of(run.meta, "torch_ddp-ws2-b0.1")
    assert cal and "error" not in cal, cal
    assert [p["bucket_mb"] for p in cal["data"]] == [0.1, 64.0] and cal["steps_per_plan"] == 2
    assert cal["cost_ms"] > 0 and {"per_message_ms", "ms_per_mib", "kappa"} <= set(cal)
    total = 4 * (64 * 256 + 256 + 256 * 256 + 256 + 256 * 8 + 8)  # every gradient's bytes, fp32
    for plan, n_msgs in zip(cal["data"], (None, 1)):
        assert sorted((s["rank"], s["step"] % 1000) for s in plan["steps"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        for s in plan["steps"]:
            assert sum(s["bytes"]) == total and None not in s["end_ms"]
            assert s["bwd_end_ms"] > s["bwd_start_ms"] and min(s["launch_ms"]) >= s["bwd_start_ms"]
            assert len(s["bytes"]) == n_msgs if n_msgs else len(s["bytes"]) > 1  # 0.1 MiB: several buckets
    for r in range(2):
        after = torch.load(tmp_path / f"after{r}.pt")
        assert after["same"] and all(after["grads"])


def test_calibration_needs_a_ddp_model_and_steps(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="calibration_steps must be >= 1"):
        record(tmp_path, calibrate=lambda m: m, calibration_steps=0)
    net = _net()
    with record(tmp_path / "p", name="one", model=net, trace=False, calibrate=lambda m: m(torch.zeros(1, 64)).sum()) \
            as rec:
        _loop(rec, net, steps=3)
    meta = json.loads((rec.run_dir / "run.json").read_text())
    job = meta["jobs"][0]
    assert "whatif_calibration" not in job
    assert "no what-if calibration: the model is not a DistributedDataParallel" in job["note"]


def test_dpcore_wrap_wrapper_records_its_collectives(tmp_path: Path) -> None:
    run_dir = _spawn(tmp_path, "bucketed")
    _check_readable(run_dir, "bucketed-ws2-b0.1", 2, comm=True)


def test_one_process_without_a_process_group(tmp_path: Path) -> None:
    assert not dist.is_initialized()
    model = _net()
    with record(tmp_path, model=model, warmup=WARMUP, profile_steps=PROFILE) as rec:
        _loop(rec, model)
    assert rec.run_dir is not None and rec.run_dir.parent == tmp_path
    meta = json.loads((rec.run_dir / "run.json").read_text())
    assert meta["jobs"][0]["id"] == "user-ws1"
    _check_readable(rec.run_dir, "user-ws1", 1, comm=False)


def test_without_phase_marks_and_trace(tmp_path: Path) -> None:
    from dpcore.read.rundir import load_run

    with record(tmp_path, warmup=0, trace=False) as rec:
        for _ in range(3):
            with rec.step():
                torch.randn(64, 64) @ torch.randn(64, 64)
    run = load_run(rec.run_dir)
    assert list(run.steps["step"]) == [0, 1, 2] and not run.steps["profiled"].any()
    assert (run.steps["sync_ms"] > 0).all()  # unmarked time counts as sync / other
    assert not (rec.run_dir / "traces").exists()


def test_an_exception_keeps_the_data_and_fails_the_run(tmp_path: Path) -> None:
    model = _net()
    with pytest.raises(ValueError, match="boom"):
        with record(tmp_path, model=model, warmup=1, profile_steps=2) as rec:
            _loop(rec, model, fail_at=5)
    meta = json.loads((rec.run_dir / "run.json").read_text())
    assert meta["status"] == "failed"
    job = meta["jobs"][0]
    assert job["status"] == "failed" and "boom in the user's loop" in job["error"]
    rows = (rec.run_dir / "steps.csv").read_text().splitlines()
    assert len(rows) == 1 + 4  # header + steps 1..4 (step 5 raised)


def test_ctrl_c_is_interrupted(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        with record(tmp_path, warmup=0, trace=False) as rec:
            for i in range(3):
                with rec.step():
                    if i == 2:
                        raise KeyboardInterrupt
    meta = json.loads((rec.run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted" and meta["jobs"][0]["status"] == "interrupted"
    assert len((rec.run_dir / "steps.csv").read_text().splitlines()) == 1 + 2


def test_bad_marks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="warmup"):
        record(tmp_path, warmup=-1)
    with pytest.raises(ValueError, match="profile_steps"):
        record(tmp_path, profile_steps=0)
    with pytest.raises(RuntimeError, match="inside rec.step"):
        with record(tmp_path, warmup=0, trace=False) as rec:
            with rec.phase("forward"):
                pass
    with pytest.raises(ValueError, match="unknown phase"):
        rec.phase("backwards")



def test_a_rank_trace_that_fails_to_write_fails_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25 item 5: a full disk when the trace is saved used to leave the job `complete`
    with no trace; the rows are kept, the job and the run end `failed`, the error names it."""
    import errno

    from dpcore.write.capture import tracing

    real = tracing.os.replace

    def full_disk(src, dst):  # only the trace's rename fails, as on a disk that just filled up
        if str(dst).endswith(".json.gz"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(tracing.os, "replace", full_disk)
    model = _net()
    with record(tmp_path, model=model, warmup=WARMUP, profile_steps=PROFILE) as rec:
        _loop(rec, model)
    meta = json.loads((rec.run_dir / "run.json").read_text())
    job = meta["jobs"][0]
    assert job["status"] == "failed" and meta["status"] == "failed", (job, meta["status"])
    assert "trace export failed on rank 0" in job["error"] and "No space left" in job["error"]
    assert len((rec.run_dir / "steps.csv").read_text().splitlines()) == 1 + STEPS - WARMUP  # rows kept


def test_a_profile_job_missing_a_rank_trace_does_not_complete(tmp_path: Path) -> None:
    """The same rule in the life cycle `profile` uses: write_job's `failed` fails the run."""
    from dpcore.write.capture.run_lifecycle import JobSpec, RunLife, write_job
    from dpcore.write.capture.run_writer import RunWriter

    class OneProcess:
        writes, spawns = True, False

        def broadcast(self, box: list) -> None:
            pass

        def finish(self, status: str) -> None:
            pass

        def shared_during_job(self) -> dict:
            return {}

    spec = JobSpec("flat-ws2", "flat", 2, 2, None, str(tmp_path / "t"))
    row = {"job_id": "flat-ws2", "variant": "flat", "world_size": 2, "rank": 0, "step": 3, "profiled": True,
           "t_start_ns": 0, "step_ms": 1.0}
    results = [{"steps": [dict(row, rank=r)], "collectives": [], "messages": [], "offset_ns": 0, "rtt_ns": 0,
                "sync": [], "trace": None, "trace_error": ""} for r in range(2)]
    with RunLife(OneProcess(), lambda: RunWriter(tmp_path, "x", command=[], config={}, environment={})) as life:
        fields = life.run_job("flat-ws2", 1, lambda: write_job(life.writer, spec, results))
    assert fields["status"] == "failed" and "rank 0 profiled steps but wrote no trace" in fields["error"]
    assert life.status == "failed"
