"""Synthetic but complete dpcore run directories for the dashboard tests.

Why: the dashboard must be testable before (and independently of) a real profiling run.
The generator follows docs/DESIGN.md's run-directory contract exactly (run.json, steps.csv,
collectives.csv, messages.csv, allreduce.csv, traces/<job>/rank<r>.json.gz and merged), with
timings from a tiny cost model so that the pictures look like a real CPU/gloo run: blocking
variants expose all their communication, overlap/bucketed hide most of it in backward, the
4-rank jobs are oversubscribed on a 2-core box, and `data_parallel` is skipped with a reason.
Everything is written with plain json/csv (nothing pickled).
"""
from __future__ import annotations

import csv
import gzip
import json
import random
from pathlib import Path

from dpcore.contract import runformat as rf

GRAD_BYTES = 4 * 1_048_576          # 1 Mi float32 parameters
N_PARAMS = 32                       # 16 Linear layers: weight + bias
BW = 2.0e9                          # bytes/s of the simulated gloo link
LAT_MS = 0.05
MS = 1_000_000                      # ns per ms
TRAIN = [("single", 1, 0.0), ("naive", 1, 25.0), ("naive", 2, 25.0), ("naive", 4, 25.0),
         ("central", 2, 25.0), ("central", 4, 25.0), ("ring", 1, 25.0), ("ring", 2, 25.0), ("ring", 4, 25.0),
         ("overlap", 2, 25.0), ("bucketed", 1, 25.0), ("bucketed", 2, 1.0), ("bucketed", 2, 5.0),
         ("bucketed", 2, 25.0), ("bucketed", 4, 25.0), ("torch_ddp", 2, 25.0)]
ALGOS = ["native", "ring", "naive", "central"]


def _write_csv(path: Path, cols: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def _comm_plan(variant: str, ws: int, bucket: float) -> list[tuple[int, float]]:
    """(bytes, duration_ms) of each collective of one step, in launch order."""
    if ws == 1 or variant == "single":
        return []
    ring_ms = lambda b: 2 * (ws - 1) * LAT_MS + 2 * (ws - 1) / ws * b / BW * 1e3  # noqa: E731
    if variant == "naive":
        return [(GRAD_BYTES // N_PARAMS, ring_ms(GRAD_BYTES // N_PARAMS) + 0.2)] * N_PARAMS
    if variant == "central":
        return [(GRAD_BYTES, 2 * (ws - 1) * (LAT_MS + GRAD_BYTES / BW * 1e3))]
    if variant in ("flat", "ring"):
        return [(GRAD_BYTES, ring_ms(GRAD_BYTES))]
    if variant == "overlap":
        return [(GRAD_BYTES // N_PARAMS, ring_ms(GRAD_BYTES // N_PARAMS))] * N_PARAMS
    n = max(1, min(N_PARAMS, round(GRAD_BYTES / (bucket * 1_048_576)) or 1))
    return [(GRAD_BYTES // n, ring_ms(GRAD_BYTES // n))] * n


def _chrome_events(rank: int, pid: int, spans: list[tuple[str, str, int, int, int]],
                   shift_us: float = 0.0) -> tuple[list[dict], list[list[int]]]:
    """spans: (name, cat, tid, start_ns, end_ns) on the shared clock -> Chrome 'X' events in µs on the
    profiler's own clock (shared − shift_us), plus `dpcore_clock_sync#k` markers and their bracketing
    shared-clock samples (t_a, t_b) as the profiler worker records them (see dpcore.contract.clocksync)."""
    ev = [{"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": s / 1e3 - shift_us,
           "dur": (e - s) / 1e3, "args": {"rank": rank}} for name, cat, tid, s, e in spans]
    samples: list[list[int]] = []
    if spans:
        first = min(s for _, _, _, s, _ in spans)
        for k in range(3):
            shared_ns = first - (3 - k) * 200_000
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"dpcore_clock_sync#{k}", "pid": pid, "tid": 1,
                       "ts": shared_ns / 1e3 - shift_us, "dur": 1.0, "args": {}})
            half = 2_000 * (k + 1)
            samples.append([shared_ns - half, shared_ns + half])
    return ev, samples


def _train_job(variant: str, ws: int, bucket: float, steps: int, profiled: int, t0: int, rng: random.Random,
               oversub: bool, cores: int) -> tuple[list, list, list, dict[int, list], int]:
    """Simulate one train job; returns step rows, collectives, messages, per-rank trace spans, end time."""
    srows, crows, mrows, spans = [], [], [], {r: [] for r in range(ws)}
    slow = max(1.0, ws / cores) if oversub else 1.0
    plan = _comm_plan(variant, ws, bucket)
    t = t0
    for step in range(steps + profiled):
        is_prof = step >= steps
        windows: list[tuple[int, int]] = []
        fwd, bwd, opt = 8.0 * slow, 16.0 * slow, 2.0 * slow
        end_of_step = t
        for r in range(ws):
            jit = rng.uniform(0.95, 1.08)
            ts = t + int(rng.uniform(0, 0.3) * MS)
            f_e = ts + int(fwd * jit * MS)
            b_e = f_e + int(bwd * jit * MS)
            overl = variant in ("overlap", "bucketed", "torch_ddp")
            cur = f_e + int(0.25 * bwd * MS) if overl else b_e
            ivals = []
            for seq, (nb, dur) in enumerate(plan):
                launch = f_e + int((seq + 1) / len(plan) * bwd * jit * MS) if overl else cur
                start = max(launch, cur)
                end = start + int(dur * rng.uniform(0.9, 1.2) * slow * MS)
                crows.append(dict(job_id="", rank=r, step=step, seq=seq, op="all_reduce",
                                  algo="native" if variant not in ("ring", "central") else variant, bytes=nb,
                                  t_launch_ns=launch, t_start_ns=start, t_end_ns=end,
                                  bucket=seq if variant in ("bucketed", "torch_ddp") else -1))
                ivals.append((start, end))
                cur = end
            sync_end = max(b_e, cur)
            o_e = sync_end + int(opt * jit * MS)
            comm = sum(e - s for s, e in ivals) / MS
            srows.append(dict(job_id="", variant=variant, world_size=ws, bucket_mb=bucket, rank=r, step=step,
                              profiled=is_prof, t_start_ns=ts, step_ms=round((o_e - ts) / MS, 4),
                              fwd_ms=round((f_e - ts) / MS, 4), bwd_ms=round((b_e - f_e) / MS, 4),
                              sync_ms=round((sync_end - b_e) / MS, 4), opt_ms=round((o_e - sync_end) / MS, 4),
                              comm_ms=round(comm, 4), comm_ops=len(plan), comm_bytes=sum(p[0] for p in plan),
                              samples=32))
            if variant in ("ring", "central") and plan:
                windows.append(ivals[0])
            if is_prof:
                sp = spans[r]
                sp += [(f"ProfilerStep#{step}", "user_annotation", 1, ts, o_e),
                       ("forward", "user_annotation", 1, ts, f_e),
                       ("aten::addmm", "cpu_op", 1, ts + 1000, f_e - 1000),
                       ("backward", "user_annotation", 1, f_e, b_e),
                       ("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 1, f_e + 1000, b_e - 1000),
                       ("optimizer", "user_annotation", 1, sync_end, o_e), ("Optimizer.step#SGD.step", "cpu_op", 1,
                                                                             sync_end + 500, o_e - 500)]
                if sync_end > b_e:
                    sp.append(("grad_sync", "user_annotation", 1, b_e, sync_end))
                sp += [("gloo:all_reduce", "cpu_op", 2, s, e) for s, e in ivals]
            end_of_step = max(end_of_step, o_e)
        if windows:  # a blocking ring/central all-reduce starts when the last rank arrives
            win = (max(w[0] for w in windows), max(w[1] for w in windows))
            for r in range(ws):
                mrows += _messages(variant, r, ws, step, win, GRAD_BYTES)
        t = end_of_step + int(0.5 * MS)
    return srows, crows, mrows, spans, t


def _messages(algo: str, rank: int, ws: int, step: int, ival: tuple[int, int], nbytes: int, call: int = 0,
              job_id: str = "") -> list[dict]:
    """Messages this rank logs for one all-reduce of `nbytes` spread over `ival` (ring or central)."""
    s, e = ival
    rows = []
    if algo == "ring":
        n_steps = 2 * (ws - 1)
        slot = (e - s) / n_steps
        for k in range(n_steps):
            phase, rs = ("reduce_scatter", k) if k < ws - 1 else ("all_gather", k - (ws - 1))
            send_chunk = (rank - k) % ws if phase == "reduce_scatter" else (rank + 1 - rs) % ws
            recv_chunk = (rank - k - 1) % ws if phase == "reduce_scatter" else (rank - rs) % ws
            post = int(s + k * slot)
            done = int(s + (k + 1) * slot)
            rows.append(dict(job_id=job_id, algo=algo, rank=rank, step=step, call=call, phase=phase, ring_step=rs,
                             src=rank, dst=(rank + 1) % ws, chunk=send_chunk, bytes=nbytes // ws, t_post_ns=post,
                             t_done_ns=int(post + 0.7 * slot), side="send"))
            rows.append(dict(job_id=job_id, algo=algo, rank=rank, step=step, call=call, phase=phase, ring_step=rs,
                             src=(rank - 1) % ws, dst=rank, chunk=recv_chunk, bytes=nbytes // ws, t_post_ns=post,
                             t_done_ns=done, side="recv"))
    elif algo in ("central", "naive"):
        half = (s + e) // 2
        peers = [p for p in range(ws) if p != rank]
        for i, p in enumerate(peers):
            if algo == "naive":
                rows.append(dict(job_id=job_id, algo=algo, rank=rank, step=step, call=call, phase="exchange",
                                 ring_step=i, src=rank, dst=p, chunk=0, bytes=nbytes, t_post_ns=s, t_done_ns=half,
                                 side="send"))
                rows.append(dict(job_id=job_id, algo=algo, rank=rank, step=step, call=call, phase="exchange",
                                 ring_step=i, src=p, dst=rank, chunk=0, bytes=nbytes, t_post_ns=s, t_done_ns=e,
                                 side="recv"))
            elif rank == 0:
                rows.append(dict(job_id=job_id, algo=algo, rank=0, step=step, call=call, phase="gather", ring_step=i,
                                 src=p, dst=0, chunk=0, bytes=nbytes, t_post_ns=s, t_done_ns=half, side="recv"))
                rows.append(dict(job_id=job_id, algo=algo, rank=0, step=step, call=call, phase="broadcast",
                                 ring_step=i, src=0, dst=p, chunk=0, bytes=nbytes, t_post_ns=half, t_done_ns=e,
                                 side="send"))
        if algo == "central" and rank != 0:
            rows.append(dict(job_id=job_id, algo=algo, rank=rank, step=step, call=call, phase="gather", ring_step=0,
                             src=rank, dst=0, chunk=0, bytes=nbytes, t_post_ns=s, t_done_ns=half, side="send"))
            rows.append(dict(job_id=job_id, algo=algo, rank=rank, step=step, call=call, phase="broadcast",
                             ring_step=0, src=0, dst=rank, chunk=0, bytes=nbytes, t_post_ns=half, t_done_ns=e,
                             side="recv"))
    return rows


def _write_trace(path: Path, rank: int, events: list[dict]) -> None:
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank}, "traceEvents": events}
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)


def make_run(root: Path, run_id: str = "20250101-120000-mlp", *, steps: int = 5, profiled: int = 2,
             big_trace_events: int = 0, seed: int = 0, status: str = "complete") -> Path:
    """Write one complete synthetic run under root/run_id and return its path.

    big_trace_events > 0 pads rank 0 of `ring-ws2` with that many tiny events, to test that the
    timeline stays responsive on a 250k-event trace.
    """
    rng = random.Random(seed)
    run = Path(root) / run_id
    (run / rf.TRACES_DIR).mkdir(parents=True, exist_ok=True)
    cores = 2
    steps_rows, coll_rows, msg_rows, ar_rows, jobs = [], [], [], [], []
    t = 1_000_000_000_000
    for variant, ws, bucket in TRAIN:
        jid = rf.job_id(variant, ws, bucket)
        oversub = ws > cores
        s, c, m, spans, t = _train_job(variant, ws, bucket, steps, profiled, t, rng, oversub, cores)
        for rows, dst in ((s, steps_rows), (c, coll_rows), (m, msg_rows)):
            for row in rows:
                row["job_id"] = jid
            dst += rows
        tdir = rf.trace_dir(run, jid)
        tdir.mkdir(exist_ok=True)
        merged, sync = [], {}
        for r, sp in spans.items():
            shift = rng.uniform(-5e5, 5e5)  # the profiler's clock is not the shared one
            ev, sync[str(r)] = _chrome_events(r, r, sp, shift)
            if big_trace_events and jid == "ring-ws2" and r == 0 and sp:
                step5 = [x for x in sp if x[0] == f"ProfilerStep#{steps}"][0]
                t0, t1 = step5[3] / 1e3 - shift, step5[4] / 1e3 - shift
                gap = (t1 - t0) / big_trace_events
                ev += [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 50}", "pid": 0, "tid": 1,
                        "ts": t0 + i * gap, "dur": gap / 2, "args": {}} for i in range(big_trace_events)]
            _write_trace(tdir / rf.rank_trace_name(r), r, ev)
            merged += ev
        _write_trace(tdir / rf.MERGED_TRACE, -1, merged)
        jobs.append(dict(id=jid, kind="train", variant=variant, algo=None, world_size=ws, bucket_mb=bucket,
                         status="complete", error=None, oversubscribed=oversub, skip_reason=None,
                         clock_offsets_ns=[0] + [rng.randint(-5000, 5000) for _ in range(ws - 1)],
                         clock_sync_ns={k: v for k, v in sync.items() if v}))
    jobs.append(dict(id="data_parallel-ws2", kind="train", variant="data_parallel", algo=None, world_size=2,
                     bucket_mb=25.0, status="skipped", error=None, oversubscribed=False,
                     skip_reason="data_parallel needs 2 or more GPUs; found 0", clock_offsets_ns=[]))
    for algo in ALGOS:
        for ws in (2, 4):
            jid = f"allreduce-{algo}-ws{ws}"
            factor = {"native": 1.0, "ring": 1.3, "naive": ws / 1.5, "central": ws / 2}[algo]
            for p in range(10, 25, 2):
                nb = 2 ** p
                tm = (2 * (ws - 1) * LAT_MS + 2 * (ws - 1) / ws * nb / BW * 1e3) * factor
                algbw = nb / (tm / 1e3) / 1e9
                ar_rows.append(dict(job_id=jid, algo=algo, world_size=ws, bytes=nb, repeats=20, time_ms=round(tm, 5),
                                    algbw_gbps=round(algbw, 5), busbw_gbps=round(algbw * 2 * (ws - 1) / ws, 5)))
            if algo != "native":
                for r in range(ws):
                    msg_rows += _messages(algo, r, ws, 0, (t, t + int(3 * MS)), 65536, job_id=jid)
            t += int(5 * MS)
            jobs.append(dict(id=jid, kind="allreduce", variant=None, algo=algo, world_size=ws, bucket_mb=None,
                             status="complete", error=None, oversubscribed=ws > cores, skip_reason=None,
                             clock_offsets_ns=[0] * ws))
    meta = {
        "run_id": run_id, "created": "2025-01-01T12:00:00+00:00", "finished": "2025-01-01T12:03:10+00:00",
        "status": status, "command": ["python", "-m", "dpcore", "profile", "--model", "mlp", "--world-sizes", "1,2,4"],
        "config": {"model": "mlp", "size": "tiny", "batch_size": 32, "scaling": "weak", "steps": steps,
                   "warmup": 1, "bucket_mb": [1.0, 5.0, 25.0], "variants": sorted({v for v, _, _ in TRAIN})},
        "environment": {"host": "testbox", "torch": "2.5.0", "backend": "gloo", "devices": ["x86_64"],
                        "device": "cpu", "cpu_cores": cores, "logical_cpus": cores,
                        "threads_per_rank": {"1": 2, "2": 1, "4": 1}, "oversubscribed": True, "gpus": 0},
        "jobs": jobs,
    }
    (run / rf.RUN_JSON).write_text(json.dumps(meta, indent=1))
    for table, rows in (("steps", steps_rows), ("collectives", coll_rows), ("messages", msg_rows),
                        ("allreduce", ar_rows)):
        _write_csv(run / rf.table_file(table), rf.TABLES[table], rows)
    return run


def make_corrupt_runs(root: Path) -> list[Path]:
    """A truncated run.json, a half-written CSV and a foreign folder: each must warn, not crash."""
    root = Path(root)
    bad = root / "20240101-000000-truncated"
    bad.mkdir(parents=True, exist_ok=True)
    (bad / "run.json").write_text('{"run_id": "20240101-000000-truncated", "status": "comp')
    half = make_run(root, "20240102-000000-halfcsv", steps=2, profiled=0)
    text = (half / "steps.csv").read_text()
    (half / "steps.csv").write_text(text[: len(text) // 2] + '\n"unterminated,')
    foreign = root / "holiday-photos"
    foreign.mkdir(exist_ok=True)
    (foreign / "run.json").write_text(json.dumps([1, 2, 3]))
    return [bad, half, foreign]


if __name__ == "__main__":  # python tests/fixtures_run.py /tmp/profiles
    import sys
    print(make_run(Path(sys.argv[1] if len(sys.argv) > 1 else "profiles")))
