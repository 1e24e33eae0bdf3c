"""``dpcore.trace_handler``: torch.profiler's ``on_trace_ready`` that writes a dpcore run.

Usage, on every rank (plain loop, Accelerate's ``ProfileKwargs(on_trace_ready=...)``,
Lightning's ``PyTorchProfiler(on_trace_ready=...)``)::

    handler = dpcore.trace_handler("profiles", name="mine")
    with torch.profiler.profile(schedule=handler.schedule(wait=1, warmup=1, active=3, repeat=2),
                                on_trace_ready=handler) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

Why this shape: it is ``dpcore import`` run while the traces are written, so the numbers come
from the same reader and rules. Each call (one profiler cycle on one rank) exports that rank's
trace and appends its events to ``traces/<job>/rank<r>.json.gz`` of one run: several cycles
become several steps of that run (their ``ProfilerStep#N`` keep the loop's step numbers), never
several runs. Under a process group, rank 0 names the run on the first cycle and every rank
learns it (one broadcast); after every cycle the ranks meet in a barrier and rank 0 rewrites
steps.csv, collectives.csv and run.json from all cycles so far, so the run on disk is complete
after each cycle (a handler is never told which cycle is the last). Every rank calls the
handler at the same step (the schedule is the same on every rank), so the collectives here
cannot deadlock a job that profiles on every rank, which is the only way torch.profiler
schedules run. That broadcast and barrier are dpcore's own messages: they go over a gloo side
group on the CPU (:mod:`dpcore.write.runtime.control`), never the job's group, so on NCCL they
touch no GPU (an NCCL barrier or object broadcast would use the current device, GPU 0 on every
rank of a loop that did not call ``set_device``).

Why ``handler.schedule``: over gloo, a collective's future completes (what DDP waits on) before
gloo's worker thread closes the collective's profiler range (``Work::finish`` runs the range's
end after ``markCompleted``). A ``prof.step()`` that ends a cycle in that window stops the
profiler, which frees its event lists while that thread still writes the range's end time into
one of them: a use-after-free in PyTorch that later aborts the rank ("malloc(): unsorted double
linked list corrupted", SIGABRT; docs/your-code.md, "The SIGABRT over gloo"). ``handler.schedule(...)`` is
``torch.profiler.schedule(...)`` plus, on every rank, a ``dist.barrier()`` just before the
profiler stops: gloo's barrier waits until every earlier collective has finished, range
included (the same for every rank, as the schedule is).
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.profiler import ProfilerAction
from torch.profiler import schedule as torch_schedule

from dpcore.contract import runformat as rf
from dpcore.contract.files import atomic_write_bytes, new_run_id
from dpcore.contract.tracefile import load_trace
from dpcore.write.runtime import control
from dpcore.write.runtime.launch import settle_collectives
from dpcore.write.runtime.world import device_names

#: the one job of a handler's run: what the traces show, named as ``import`` names it
JOB_PREFIX = "imported"


def trace_handler(out: str | Path = "profiles", name: str | None = None) -> TraceHandler:
    """A callable for ``torch.profiler.profile(on_trace_ready=...)`` that writes one run under
    ``out`` (see the module docstring). Build one per process; every rank builds its own."""
    return TraceHandler(Path(out), name)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TraceHandler:
    """One run, fed one profiler cycle at a time. ``run_dir`` is set after the first cycle."""

    def __init__(self, out: Path, name: str | None) -> None:
        self.out, self.name = out, name
        self.run_dir: Path | None = None
        self.cycles = 0
        #: where the job ran, as this process saw it (run.json's config; the importer's
        #: environment reads the traces themselves)
        self.where: dict[str, Any] = {}

    def __call__(self, prof: Any) -> None:
        rank, ws = _world()
        if self.run_dir is None:
            self.run_dir = self._open(rank, ws)
        tdir = rf.trace_dir(self.run_dir, f"{JOB_PREFIX}-ws{ws}")
        meta = self._append(prof, tdir / f"rank{rank}.json.gz")
        if not self.where:
            self.where = ran_on(meta)
        self.cycles += 1
        if ws > 1:
            control.barrier()  # every rank's file of this cycle is in place
        if rank == 0:
            from dpcore.read.importer.write_run import index_run  # pandas: on rank 0 only
            index_run(self.run_dir, name=self.name, kind="trace_handler", command=list(sys.argv),
                      config={"cycles": self.cycles, "source": "dpcore.trace_handler",
                              **self.where})

    def schedule(self, inner: Callable[[int], ProfilerAction] | None = None,
                 **kwargs: Any) -> Callable[[int], ProfilerAction]:
        """``torch.profiler.schedule(**kwargs)`` (or ``inner``, any schedule callable) that calls
        :func:`settle_collectives` when the profiler is about to stop: torch.profiler asks the
        schedule about step ``n`` after step ``n - 1`` ended, and stops when step ``n - 1`` was
        ``RECORD_AND_SAVE``. (A loop that ends on such a step without a last ``prof.step()``
        stops at the ``with`` block's exit, unsettled.)"""
        sched = inner if inner is not None else torch_schedule(**kwargs)

        def settled(step: int) -> ProfilerAction:
            if step > 0 and sched(step - 1) == ProfilerAction.RECORD_AND_SAVE:
                settle_collectives()
            return sched(step)
        return settled

    def _open(self, rank: int, ws: int) -> Path:
        """Rank 0 makes the run folder; every rank learns its name."""
        box: list[Any] = [None]
        if rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            while True:  # two runs started in the same second get different ids
                run_id = new_run_id(self.name or "trace")
                try:
                    (self.out / run_id).mkdir()
                    break
                except FileExistsError:
                    continue
            box[0] = run_id
        if ws > 1:
            control.broadcast(box)
        return self.out / str(box[0])

    @staticmethod
    def _append(prof: Any, dest: Path) -> dict:
        """This cycle's events appended to the rank's trace (the first cycle's metadata kept);
        returns this cycle's trace metadata."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".json", dir=dest.parent, prefix=".cycle-")
        os.close(fd)
        try:
            prof.export_chrome_trace(tmp)
            meta, events = load_trace(tmp)
        finally:
            os.unlink(tmp)
        mine = meta
        if dest.exists():
            meta, old = load_trace(dest)
            events = old + events
        doc = {**meta, "traceEvents": events}
        atomic_write_bytes(dest, gzip.compress(json.dumps(doc).encode(), compresslevel=3))
        return mine


def ran_on(meta: dict) -> dict[str, Any]:
    """The backend, device and device names a profiled job really ran on: the default process
    group's backend (``none`` without one) and the GPUs the trace's ``deviceProperties`` list
    (torch.profiler writes them when CUDA activity was profiled), else the CPU."""
    backend = str(dist.get_backend()) if dist.is_available() and dist.is_initialized() else "none"
    gpus = [str(d.get("name", "")) for d in meta.get("deviceProperties") or [] if isinstance(d, dict)]
    if gpus:
        return {"backend": backend, "device": "cuda", "devices": gpus}
    return {"backend": backend, "device": "cpu", "devices": device_names("cpu")}
