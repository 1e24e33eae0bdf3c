"""From-scratch all-reduce algorithms against ``dist.all_reduce`` on real gloo groups (CPU).

Process spawn costs seconds here, so each world size (1, 2, 3) spawns ONE group that runs
every check; a failing check is reported with its parameters instead of aborting the rest.
Ranks meet through a FileStore in tmp_path (no ports), and every wait has a deadline.
"""
from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dpcore.contract.ringplan import chunk_bounds, rank_schedule
from dpcore.write.dp.comm import ALGOS, all_reduce
from dpcore.write.dp.comm.naive import naive_all_reduce
from dpcore.write.dp.comm.ring import ring_all_reduce

SPAWN_TIMEOUT_S = 150.0
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
SCRATCH = ("ring", "naive", "central")


def comm_make_recorder(rank: int) -> Any:
    from dpcore.write.capture.comm_log import Recorder  # the real one: the contract under test
    return Recorder("test", rank)


def comm_spawn(worker: Callable, world_size: int, tmp_path: Path,
               timeout_s: float = SPAWN_TIMEOUT_S) -> list[dict]:
    """Spawn ``worker(rank, world_size, tmp_dir)`` on gloo ranks; return per-rank JSON reports."""
    ctx = mp.start_processes(worker, args=(world_size, str(tmp_path)), nprocs=world_size,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"world_size={world_size}: ranks did not finish in {timeout_s}s")
    finally:
        for p in ctx.processes:  # only the processes this helper started
            if p.is_alive():
                p.terminate()
                p.join(5)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]


# ---------------------------------------------------------------------------- worker side
def _data(rank: int, numel: int, dtype: torch.dtype, seed: int, integer: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 131 + rank)
    if integer:  # small integers: every summation order is exact, even in bf16
        return torch.randint(-8, 9, (numel,), generator=g).to(dtype)
    return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)


def _reference(x: torch.Tensor, op: str, group: Any = None) -> torch.Tensor:
    ref = x.clone()
    dist.all_reduce(ref, group=group)
    if op == "mean":
        ref.div_(dist.get_world_size(group))
    return ref


def _tol(dtype: torch.dtype) -> dict:
    return {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12),
            torch.bfloat16: dict(rtol=3e-2, atol=6e-2)}[dtype]


def _cases(n: int) -> list[tuple[torch.dtype, str, int, bool]]:
    """(dtype, op, numel, integer-valued) cases: every combination on the awkward small
    sizes, a representative subset on the large prime (it dominates the runtime)."""
    cases = [(dt, op, numel, integer) for dt in DTYPES for op in ("sum", "mean")
             for numel in sorted({0, 1, max(n - 1, 0), 7, 13}) for integer in (True, False)]
    cases += [(torch.float32, "sum", 1000003, True), (torch.float32, "mean", 1000003, False),
              (torch.bfloat16, "sum", 1000003, True), (torch.float64, "mean", 1000003, False)]
    return cases


def _check_values(n: int, rank: int) -> None:
    for algo in ALGOS:
        for seed, (dtype, op, numel, integer) in enumerate(_cases(n)):
            x = _data(rank, numel, dtype, seed, integer)
            ref = _reference(x, op)
            out = all_reduce(x, algo=algo, op=op, call=seed)
            assert out is x, f"{algo}: result is not the input tensor"
            where = f"{algo} {dtype} {op} numel={numel} integer={integer}"
            if integer and op == "sum":
                assert torch.equal(x, ref), where
            else:
                torch.testing.assert_close(x, ref, **_tol(dtype), msg=where)


def _check_identical_across_ranks(n: int, rank: int) -> None:
    """ring/naive/central must leave bitwise identical tensors on all ranks."""
    for algo in SCRATCH:
        for op in ("sum", "mean"):
            x = _data(rank, 10007, torch.float32, 99, integer=False)
            all_reduce(x, algo=algo, op=op)
            got = [torch.empty_like(x) for _ in range(n)]
            dist.all_gather(got, x)
            assert all(torch.equal(g, x) for g in got), f"{algo} {op}: ranks differ"


def _check_large_ring(n: int, rank: int) -> None:
    x = torch.randn(10_000_000, generator=torch.Generator().manual_seed(rank))
    ref = _reference(x, "sum")
    all_reduce(x, algo="ring", op="sum")
    torch.testing.assert_close(x, ref, rtol=1e-5, atol=1e-5)


def _check_noncontiguous(n: int, rank: int) -> None:
    for algo in ALGOS:
        base = _data(rank, 6 * 10, torch.float64, 5, integer=True).view(6, 10)
        x = base.t()[:, ::2]  # non-contiguous view
        assert not x.is_contiguous()
        ref = _reference(x.contiguous(), "mean")
        out = all_reduce(x, algo=algo, op="mean")
        assert out is x
        torch.testing.assert_close(x, ref, rtol=1e-12, atol=1e-12, msg=algo)
        assert torch.equal(base.t()[:, ::2], ref)  # written through to the storage


def _check_messages(n: int, rank: int) -> None:
    numel = 100003
    esize = 4
    nbytes = numel * esize
    for algo in SCRATCH:
        rec = comm_make_recorder(rank)
        x = _data(rank, numel, torch.float32, 3, integer=True)
        ref = _reference(x, "sum")
        all_reduce(x, algo=algo, op="sum", recorder=rec, call=17)
        assert torch.equal(x, ref), algo
        rows = _rows(rec)
        sends = [r for r in rows if r["side"] == "send"]
        recvs = [r for r in rows if r["side"] == "recv"]
        assert all(r["algo"] == algo and r["call"] == 17 for r in rows)
        assert all(r["t_done_ns"] >= r["t_post_ns"] > 0 for r in rows), algo
        assert all(r["src"] == rank for r in sends) and all(r["dst"] == rank for r in recvs)
        if n == 1:
            assert rows == [], algo
            continue
        if algo == "naive":  # N-1 sends per rank -> N(N-1) messages in all
            assert len(sends) == n - 1 and len(recvs) == n - 1
            assert {r["dst"] for r in sends} == set(range(n)) - {rank}
            assert all(r["bytes"] == nbytes and r["phase"] == "exchange" for r in rows)
        elif algo == "central":
            if rank == 0:
                assert sorted((r["phase"], r["side"]) for r in rows) == sorted(
                    [("gather", "recv")] * (n - 1) + [("broadcast", "send")] * (n - 1))
            else:
                assert sorted((r["phase"], r["side"]) for r in rows) == [
                    ("broadcast", "recv"), ("gather", "send")]
            assert all(r["bytes"] == nbytes for r in rows)
        else:  # ring: 2(N-1) steps per rank, 2(N-1)/N of the tensor sent
            steps = {(r["phase"], r["ring_step"]) for r in sends}
            assert len(steps) == 2 * (n - 1), steps
            assert steps == {(r["phase"], r["ring_step"]) for r in recvs}
            assert all(r["dst"] == (rank + 1) % n for r in sends)
            assert all(r["src"] == (rank - 1) % n for r in recvs)
            bounds = chunk_bounds(numel, n)
            plan = rank_schedule(n, rank)
            expect = sum((bounds[s.send_chunk][1] - bounds[s.send_chunk][0]) * esize
                         for s in plan)
            sent = sum(r["bytes"] for r in sends)
            assert sent == expect
            assert abs(sent - 2 * (n - 1) / n * nbytes) <= 2 * (n - 1) * esize
            for s in plan:  # chunk column follows the schedule
                assert {r["chunk"] for r in sends if (r["phase"], r["ring_step"]) ==
                        (s.phase, s.ring_step)} == {s.send_chunk}


def _check_ring_pipelining(n: int, rank: int) -> None:
    """Tiny sub-messages and every window size: the hazards of the pipelined ring."""
    cases = [(4, numel) for numel in sorted({1, max(n - 1, 1), 13})] + [(100, 257), (600, 1001)]
    for sub_bytes, numel in cases:  # 1 element per sub-message ... a few sub-messages
        for inflight in (1, 2, 3, 8):
            for op in ("sum", "mean"):
                x = _data(rank, numel, torch.float32, numel + inflight, integer=True)
                ref = _reference(x, op)
                ring_all_reduce(x, op=op, sub_bytes=sub_bytes, inflight=inflight)
                where = f"sub_bytes={sub_bytes} inflight={inflight} numel={numel} {op}"
                torch.testing.assert_close(x, ref, rtol=0, atol=1e-6, msg=where)
    # per-sub-message rows add up to the schedule's chunks
    rec = comm_make_recorder(rank)
    numel = 100003
    x = _data(rank, numel, torch.float64, 1, integer=True)
    ref = _reference(x, "sum")
    ring_all_reduce(x, recorder=rec, sub_bytes=16384, inflight=3)
    assert torch.equal(x, ref)
    rows = _rows(rec)
    bounds = chunk_bounds(numel, n)
    for side in ("send", "recv"):
        per_step: dict[tuple, int] = {}
        for r in rows:
            if r["side"] == side:
                key = (r["phase"], r["ring_step"], r["chunk"])
                per_step[key] = per_step.get(key, 0) + r["bytes"]
        want = {}
        for s in rank_schedule(n, rank):
            c = s.send_chunk if side == "send" else s.recv_chunk
            want[(s.phase, s.ring_step, c)] = (bounds[c][1] - bounds[c][0]) * 8
        assert per_step == want, side
    if n > 1:
        assert len(rows) > 4 * (n - 1)  # really split into sub-messages


def _check_batched(n: int, rank: int) -> None:
    """The batch_isend_irecv paths (used on NCCL) exercised on gloo."""
    for fn in (ring_all_reduce, naive_all_reduce):
        for numel in sorted({1, max(n - 1, 1), 13, 1001}):
            for op in ("sum", "mean"):
                rec = comm_make_recorder(rank)
                x = _data(rank, numel, torch.float64, numel, integer=True)
                ref = _reference(x, op)
                fn(x, op=op, recorder=rec, batched=True)
                torch.testing.assert_close(x, ref, rtol=0, atol=1e-12,
                                           msg=f"{fn.__name__} {numel} {op}")
                sends = [r for r in _rows(rec) if r["side"] == "send"]
                if numel >= n:
                    assert len(sends) == (2 * (n - 1) if fn is ring_all_reduce else n - 1)


def _rows(rec: Any) -> list[dict]:
    return rec.message_rows()


def _check_null_recorder(n: int, rank: int) -> None:
    """Recording must not change the result: the default null recorder and a real one give
    bitwise identical tensors on every path (pipelined and batched), and the null one logs
    nothing."""
    from dpcore.write.capture.comm_log import NULL_RECORDER
    paths = [(algo, lambda x, algo=algo, **kw: all_reduce(x, algo=algo, op="mean", **kw))
             for algo in ALGOS]
    paths += [("ring batched", lambda x, **kw: ring_all_reduce(x, op="mean", batched=True, **kw)),
              ("naive batched", lambda x, **kw: naive_all_reduce(x, op="mean", batched=True,
                                                                  **kw)),
              ("ring sub-messages", lambda x, **kw: ring_all_reduce(x, op="mean", sub_bytes=400,
                                                                    inflight=2, **kw))]
    for where, fn in paths:
        x = _data(rank, 1009, torch.float32, 21, integer=False)
        y = x.clone()
        fn(x)                                   # default: NULL_RECORDER
        fn(y, recorder=comm_make_recorder(rank))
        assert torch.equal(x, y), where
    assert NULL_RECORDER.message_rows() == [] and NULL_RECORDER.collective_rows() == []


def _check_subgroup(n: int, rank: int) -> None:
    """Group-aware p2p: a group whose global ranks are not 0..k-1."""
    members = [r for r in range(n) if r != 0] if n > 2 else list(range(n))
    group = dist.new_group(members)  # every rank must call new_group
    if rank not in members:
        return
    for algo in ALGOS:
        x = _data(rank, 1001, torch.float32, 11, integer=True)
        ref = _reference(x, "mean", group)
        all_reduce(x, algo=algo, op="mean", group=group)
        torch.testing.assert_close(x, ref, msg=algo)


def _check_errors(n: int, rank: int) -> None:
    with pytest.raises(ValueError, match="ring"):
        all_reduce(torch.ones(3), algo="bogus")
    for algo in ALGOS:
        with pytest.raises(ValueError, match="mean"):
            all_reduce(torch.ones(3), algo=algo, op="max")
        with pytest.raises(ValueError):
            all_reduce(torch.ones(3, dtype=torch.int64), algo=algo, op="mean")
    # integer sums are fine
    x = torch.full((4,), rank, dtype=torch.int64)
    for algo in ALGOS:
        y = x.clone()
        all_reduce(y, algo=algo)
        assert torch.equal(y, torch.full((4,), sum(range(n)), dtype=torch.int64)), algo


CHECKS = [_check_errors, _check_values, _check_identical_across_ranks, _check_noncontiguous,
          _check_messages, _check_ring_pipelining, _check_batched, _check_null_recorder,
          _check_subgroup, _check_large_ring]


def comm_worker(rank: int, world_size: int, tmp_dir: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(str(Path(tmp_dir) / "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=90))
    report: dict[str, Any] = {"failures": [], "timings": {}}
    try:
        for check in CHECKS:
            t0 = time.perf_counter()
            try:
                check(world_size, rank)
            except AssertionError:  # collectives of a check run before its asserts
                report["failures"].append(f"{check.__name__}: {traceback.format_exc(limit=3)}")
            report["timings"][check.__name__] = round(time.perf_counter() - t0, 2)
            dist.barrier()
    finally:
        (Path(tmp_dir) / f"rank{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_all_reduce_algorithms(world_size: int, tmp_path: Path) -> None:
    reports = comm_spawn(comm_worker, world_size, tmp_path)
    print(f"ws={world_size} check seconds (rank 0): {reports[0]['timings']}")
    failures = [f"rank{r}: {f}" for r, rep in enumerate(reports) for f in rep["failures"]]
    assert not failures, "\n".join(failures)


def test_unknown_algo_names_choices() -> None:
    with pytest.raises(ValueError) as e:
        all_reduce(torch.ones(2), algo="tree")
    assert all(a in str(e.value) for a in ALGOS)
