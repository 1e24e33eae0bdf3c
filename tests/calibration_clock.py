"""Shared by the tests that a what-if calibration's times are on one scale (``profile``'s in
tests/write/training/test_calibration_clock.py, ``dpcore.record``'s in
tests/write/commands/test_record_calibration_clock.py): both run 2 ranks of
``tests/async_backend`` (NCCL's semantics on CPU: a call returns at enqueue, the op finishes
DELAY_MS later on the group's stream) with a model whose forward leaves DELAY_MS of work on the
stream, as a GPU forward's kernels do, and check the calibration rows the same way.

Importable by spawned ranks (``tests.calibration_clock``), so the model class lives here.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

DELAY_MS = 150.0
SPAWN_TIMEOUT_S = 300.0
#: The phase marks and the collectives' edges are resolved in two batches, each placed on the host
#: clock through its own anchor, known to within half the two host reads around it (a few us on
#: an idle GPU; up to ~0.1 ms measured here, tens of ms possible when the GIL is contended on a
#: loaded box): edges compared across batches agree to this much. A host-clock launch is off by
#: about DELAY_MS.
TOL_MS = DELAY_MS / 4
WIDTH, LAYERS = 128, 16  # 1 MiB of gradients: 1-2 buckets at 1 MiB, several at 0.25 MiB


class ForwardOnTheStream(torch.nn.Module):
    """An MLP whose forward also queues DELAY_MS of work on the test backend's stream and
    returns at once: a GPU forward's kernels, which the host launches and leaves behind. So
    the stream reaches backward's start well after the host did, as on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from tests import async_backend as ab
        ab.group_of().barrier()  # an op of DELAY_MS on the stream, not waited for
        return self.body(x)


def run_rank(rank: int, ranks: int, tmp: str, body: Callable[[int, int], dict]) -> None:
    """A spawned rank: :func:`tests.async_backend.run_rank` with DELAY_MS a op and blocking waits
    (its report, or the traceback, for :func:`rank_reports`; it leaves without teardown)."""
    from tests import async_backend as ab
    ab.run_rank(rank, ranks, tmp, DELAY_MS, "blocking", body)


def host_launches(rows: list[dict]) -> dict[str, list[float]]:
    """The host times of the calibration steps' all-reduce calls (ms), by step, in launch
    order: what a calibration's launch_ms held before the event-clock fix."""
    from dpcore.contract.calibration import CAL_STEP_BASE
    host: dict[str, list[float]] = {}
    for c in sorted(rows, key=lambda c: c["seq"]):
        if c["step"] >= CAL_STEP_BASE and c["op"] == "all_reduce":
            host.setdefault(str(c["step"]), []).append(round(int(c["t_launch_ns"]) / 1e6, 4))
    return host


def rank_reports(body: Callable[[int, int], dict], tmp: Path, ranks: int = 2) -> list[dict]:
    """Each rank's ``body(rank, ranks)`` (a module-level function: spawned ranks import it) on
    ``ranks`` spawned ranks (:func:`run_rank`). Fails the test on a rank's error or when they
    outlast SPAWN_TIMEOUT_S; ends only the processes it started."""
    procs = mp.start_processes(run_rank, args=(ranks, str(tmp), body), nprocs=ranks, join=False,
                               start_method="spawn")
    give_up = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        done = False
        while not done:
            if time.monotonic() > give_up:
                pytest.fail(f"ranks did not finish in {SPAWN_TIMEOUT_S}s")
            done = procs.join(timeout=1.0)
    finally:
        for proc in procs.processes:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
    found = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(ranks)]
    errors = [f"rank {r}:\n{rep['error']}" for r, rep in enumerate(found) if "error" in rep]
    assert not errors, "\n".join(errors)
    return found


def cal_steps(cal: dict) -> list[dict]:
    """Every rank-step of a calibration result, both plans."""
    return [st for plan in cal["plans"] for st in plan["steps"]]


def assert_one_scale(cal: dict) -> None:
    """A calibration's rows on one scale: each all-reduce, launched from backward's hook, lies
    within backward's window and no later than its own end; one op at a time on the stream, it
    launches no earlier than the previous one's end, and the stream spent DELAY_MS on it."""
    steps = cal_steps(cal)
    assert len(steps) == 4 and all(st["launch_ms"] for st in steps), cal
    assert max(len(st["launch_ms"]) for st in steps) >= 2, cal  # the small plan: several buckets
    for st in steps:
        launch, end = st["launch_ms"], st["end_ms"]
        assert len(launch) == len(end) == len(st["bytes"]) and None not in end, st
        prev_end = None
        for s, e in zip(launch, end):
            assert st["bwd_start_ms"] - TOL_MS <= s <= st["bwd_end_ms"] + TOL_MS, st
            assert s <= e + TOL_MS, st
            assert e - s >= DELAY_MS - TOL_MS, st  # the stream spent the delay on it
            assert prev_end is None or s >= prev_end - TOL_MS, st
            prev_end = e


def host_launch_lead_ms(cal: dict, host_launch_ms: dict[str, list[float]]) -> list[float]:
    """Per rank-step, how long before backward began (on the calibration's scale) the step's
    first all-reduce was called by the host (``host_launch_ms``: the host times of the calls by
    step, what launch_ms held before the event-clock fix)."""
    lead = []
    for st in cal_steps(cal):
        host = host_launch_ms[str(st["step"])]
        assert len(host) == len(st["launch_ms"]), (st, host)
        lead.append(st["bwd_start_ms"] - host[0])
    return lead
