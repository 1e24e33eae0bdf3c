"""``dpcore.record``: a user's own training loop, recorded as a normal dpcore run directory.

Usage, on every rank (under ``torchrun``, ``mp.spawn`` or in one process without a group)::

    model = DistributedDataParallel(net)           # or dpcore.wrap(...), or any module
    with dpcore.record("profiles", name="mine", model=model, samples=batch_size) as rec:
        for x, y in loader:
            with rec.step():                       # one training step
                with rec.phase("forward"):         # optional marks: forward, backward,
                    loss = loss_fn(model(x), y)    # optimizer; time outside them counts
                with rec.phase("backward"):        # as sync_ms (grad sync and anything else)
                    loss.backward()
                with rec.phase("optimizer"):
                    opt.step(); opt.zero_grad()
    print(rec.run_dir)

Which steps become what (the loop's length is unknown in advance, so the rule counts from the
start): the user's step ``i`` (0-based count of ``rec.step()``) is row ``step == i``.
Steps ``0 .. warmup-1`` are warm-up and dropped (the last one doubles as torch.profiler's own
warm-up); steps ``warmup .. warmup+profile_steps-1`` run under torch.profiler and are written
with ``profiled=True`` (their trace's ``ProfilerStep#N`` is the same N); every later step is
timed with ``perf_counter`` only (CUDA events on GPU), ``profiled=False``: those are the step
times the summary uses, so the profiler's overhead never reaches them. Recording keeps one
small row per step and per collective in memory until the block ends.

Collectives: with a ``DistributedDataParallel`` model, a comm hook (the one the ``torch_ddp``
variant uses) launches and logs each bucket's all-reduce; with a DDP model whose user already
registered a comm hook (fp16/bf16 compression, PowerSGD, their own), that hook is kept and the
collectives it launches are logged with the bytes it really sends
(:class:`~dpcore.write.commands.record_hooks.CollectiveTap`; run.json's job names the hook);
with a ``dpcore.wrap`` wrapper, the wrapper's recorder is swapped for the recording one; with
no model (or another module), collectives are seen only in the trace. Under a process group,
each rank learns its clock offset to rank 0 (0 on rank 0's host, measured across hosts, as
``profile`` does), every rank writes its own trace, and at the end rank 0 gathers the rows and
writes run.json, the CSV tables and the merged trace. These messages of dpcore's own go over a
gloo side group on the CPU (:mod:`dpcore.write.runtime.control`), never the user's group, so a
loop on NCCL needs no GPU of dpcore's; while recording, the rank's GPU (the model's) is the
current device, so its CUDA events time the GPU the rank computes on.
Over gloo the ranks meet in a barrier just before the profiler stops (:meth:`Recording._settle`),
as ``profile``'s do: a collective's profiler range may still be open on gloo's thread after DDP's
wait returned, and stopping the profiler then frees what that thread writes into.

What-if calibration, when asked (``calibrate=fn``): on a clean exit of a 2+-rank DDP recording,
before anything is written, the ranks run ``profile``'s calibration protocol on the user's
forward (:func:`~dpcore.write.commands.record_hooks.calibrate_recording`), so run.json's job has
``whatif_calibration`` as ``profile`` writes it; none of its steps becomes a row.

Ending: a clean exit marks the run ``complete``; an exception marks it ``failed`` with the error
text (rank 0 writes what it measured, without waiting for ranks that may be gone) and
re-raises; Ctrl-C marks it ``interrupted`` and keeps the data. These are the run life cycle's
rules (:class:`~dpcore.write.capture.run_lifecycle.RunLife`, shared with ``profile`` and
``allreduce``), and the rows are built and written by the same functions as ``profile``'s.
"""
from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from dpcore.contract import runformat
from dpcore.contract.calibration import CAL_STEPS
from dpcore.write.capture.backward_end import BackwardEnd
from dpcore.write.capture.comm_log import NULL_RECORDER, Recorder
from dpcore.write.capture.job_monitor import JobMonitor
from dpcore.write.capture.rank_channel import RankChannel, live_row
from dpcore.write.capture.run_lifecycle import JobSpec, RunLife, steps_row, train_job_entry, write_job
from dpcore.write.capture.run_writer import RunWriter
from dpcore.write.capture.tracing import TraceCapture
from dpcore.write.commands.record_hooks import (
    CollectiveTap,
    HookState,
    calibrate_recording,
    describe,
    recording_allreduce_hook,
    user_comm_hook,
)
from dpcore.write.dp.variants.base import Wrapper
from dpcore.write.runtime import control
from dpcore.write.runtime.clock import measure_offset
from dpcore.write.runtime.launch import settle_collectives
from dpcore.write.runtime.world import MonitorThread, UserWorld, job_store
from dpcore.write.training.precision import autocast_precision, tf32_enabled

#: The optional phase marks, and the steps.csv column each one fills.
PHASES = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}


def record(out: str | Path = "profiles", *, name: str | None = None, model: nn.Module | None = None,
           warmup: int = 2, profile_steps: int = 3, trace: bool = True,
           samples: int | None = None, collectives: bool = True,
           calibrate: Callable[[nn.Module], torch.Tensor] | None = None,
           calibration_steps: int = CAL_STEPS) -> Recording:
    """A context manager that turns the loop inside it into a run directory under ``out``.

    ``model``: the DDP model or ``dpcore.wrap`` wrapper (its collectives are recorded, its
    variant and bucket size name the job), or None. ``samples``: samples per step on this rank
    (for throughput; ``rec.step(samples=...)`` overrides it per step). See the module docstring
    for which steps are warm-up, traced and timed. ``collectives=False``: leave a DDP model on
    its C++ all-reduce path (no comm hook; its collectives are then seen only in the trace),
    for the rare step so short that a Python comm hook's fixed cost per bucket matters.
    ``calibrate``: ``loss = calibrate(ddp_model)``, one forward on a batch of the user's; with a
    DDP model at 2+ ranks, a clean exit then spends ``2 * calibration_steps + 1`` untimed forward
    and backward steps on the what-if calibration (no optimizer step; run.json's
    ``whatif_calibration``, as ``profile`` writes it: :func:`dpcore.write.commands.record_hooks.calibrate_recording`).
    """
    if not str(out).strip():  # Path("") is the current folder: never write there unasked
        raise ValueError("out is empty; give the folder the run is written into, e.g. 'profiles'")
    if calibration_steps < 1 and calibrate is not None:
        raise ValueError(f"calibration_steps must be >= 1 with calibrate=, got {calibration_steps}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if trace and profile_steps < 1:
        raise ValueError(f"profile_steps must be >= 1 with trace=True, got {profile_steps}")
    return Recording(Path(out), name, model, warmup, profile_steps if trace else 0, samples,
                     collectives, calibrate, calibration_steps)


class _Step:
    """``with rec.step():`` (a reusable object, so a step costs no generator)."""

    __slots__ = ("rec", "samples")
    samples: int | None

    def __init__(self, rec: Recording) -> None:
        self.rec, self.samples = rec, None

    def __enter__(self) -> _Step:
        self.rec._begin_step()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.rec._end_step(self.samples, ok=exc_type is None)


class _Phase:
    __slots__ = ("rec", "name", "key", "_rf", "_t0")
    _rf: torch.profiler.record_function | None

    def __init__(self, rec: Recording, name: str) -> None:
        self.rec, self.name, self.key, self._rf, self._t0 = rec, name, PHASES[name], None, 0

    def __enter__(self) -> _Phase:
        r = self.rec
        if r._phase is not None or not r._in_step:
            raise RuntimeError(f"rec.phase({self.name!r}) must be inside rec.step() and not "
                               f"inside another phase")
        r._phase = self.name
        r._timer.mark("sync")  # time since the last mark: grad sync / other
        self._t0 = time.perf_counter_ns()
        if self.key == "bwd" and r._bwd_end is not None:
            r._bwd_end.take()  # an end left by a backward outside this phase is not this one's
        if r._tracing:
            self._rf = torch.profiler.record_function(self.name)
            self._rf.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        r = self.rec
        if self._rf is not None:
            self._rf.__exit__(exc_type, exc, tb)
            self._rf = None
        end = r._bwd_end.take(self._t0) if self.key == "bwd" and r._bwd_end is not None else None
        if end is not None:
            # DDP waits for its buckets inside backward(): backward's computation ended earlier
            r._timer.mark("bwd", at=end)
            r._timer.mark("sync")
        else:
            r._timer.mark(self.key)
        r._phase = None


class Recording:
    """One recording (see the module docstring). Built by :func:`record`."""

    def __init__(self, out: Path, name: str | None, model: nn.Module | None, warmup: int,
                 profile_steps: int, samples: int | None, collectives: bool = True,
                 calibrate: Callable[[nn.Module], torch.Tensor] | None = None,
                 calibration_steps: int = CAL_STEPS) -> None:
        self.out, self.name, self.model = out, name, model
        self.warmup, self.profile_steps, self.samples = warmup, profile_steps, samples
        self.variant, self.bucket_mb, self.model_class = describe(model)
        self.collectives = collectives
        self.run_dir: Path | None = None
        self.job_id = ""
        self.status = "running"
        self._n = 0                       # rec.step() calls so far == the next step's index
        self._rows: list[dict] = []
        self._in_step, self._tracing, self._phase = False, False, None
        self._step_ok = True  # the step that just ended ended without an exception
        self._step_obj = _Step(self)
        self._capture: TraceCapture | None = None
        self._undo: list[Any] = []
        #: where backward's computation ended, when grad sync waits inside backward() (DDP)
        self._bwd_end: BackwardEnd | None = None
        self._note = ""
        self.comm_hook: str | None = None  # the user's own DDP comm hook, kept, if any
        self.calibrate, self.calibration_steps = calibrate, calibration_steps
        self._hooked = False  # the recording's comm hook logs the DDP model's buckets
        #: the precision the user's forward ran in (fp32, bf16, fp16); None before a forward
        self.precision: str | None = None

    # -- the user's calls -------------------------------------------------------------
    def step(self, samples: int | None = None) -> _Step:
        """Mark one training step: ``with rec.step(): ...``."""
        self._step_obj.samples = samples
        return self._step_obj

    def phase(self, name: str) -> _Phase:
        """Mark a phase of the current step: ``forward``, ``backward`` or ``optimizer``."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; valid: {', '.join(PHASES)}")
        return _Phase(self, name)

    # -- setup --------------------------------------------------------------------------
    def __enter__(self) -> Recording:
        # the device the job really runs on is the model's (a process without a group, or
        # with a gloo group, may still train on a GPU)
        model_dev = next((p.device for p in self.model.parameters()), None) \
            if self.model is not None else None
        world = self._world = UserWorld(device=model_dev)
        ctx = self.ctx = world.ctx
        self._bind(ctx.device)
        offset, self.rtt_ns = measure_offset(ctx)  # collective (control plane): every rank is here
        ws = ctx.world_size
        self.job_id = runformat.job_id(self.variant, ws, self.bucket_mb or 0.0)
        # rank 0 makes the run folder; a failure to make it is raised on every rank
        self._life = RunLife(world, lambda: self._open_writer(world))
        self.run_dir = self._life.run_dir
        tdir = runformat.trace_dir(self.run_dir, self.job_id) if self.profile_steps else None
        self.spec = JobSpec(self.job_id, self.variant, ws, ws, self.bucket_mb,
                            str(tdir) if tdir else None)
        self._life.add_job({**train_job_entry(self.spec, "running", world.oversubscribed(ws)),
                            **world.job_fields()})
        self.rec = Recorder(self.job_id, ctx.rank, offset)
        # live.csv: every rank sends its rows over the job's store; rank 0 appends them
        store = job_store(ctx)
        # The user's store outlives this recording, and the next one may record a job of the same
        # id: the keys live under this run's name, so no recording reads another's counters.
        store_key = f"{Path(self.run_dir).name}/{self.job_id}"
        self._channel = RankChannel(store, store_key, ctx.rank, ws)
        self._poller = (MonitorThread(JobMonitor(self.job_id, ws, self.run_dir, watch=False, store_key=store_key),
                                      store) if self._life.writer is not None else None)
        self._mark = 0
        dev = next((p.device for p in self.model.parameters()), ctx.device) if self.model \
            is not None else ctx.device
        # a CUDA loop's collectives end when the stream says so, not when NCCL queued them
        self.rec.time_on(dev)
        # the phases on the recorder's clock: one clock, one anchor for phases and collectives
        self._timer = self.rec.phase_timer()
        self._attach(self.model)
        if self.model is not None:  # the precision the loop computes in, seen at its forward
            hook = self.model.register_forward_pre_hook(self._saw_forward)
            self._undo.append(hook.remove)
        if tdir is not None:
            first = self.warmup
            self._capture = TraceCapture(
                tdir, ctx.rank, self.job_id, offset,
                first=first, last=first + self.profile_steps - 1,
                warmup_step=first - 1 if first else None, cuda=dev.type == "cuda",
                settle=self._settle)
        return self

    def _bind(self, device: torch.device) -> None:
        """Make the rank's GPU the current one while the recording runs (undone at exit).

        Why: the phase timer's CUDA events, its ``synchronize`` and the trace's sync markers
        act on the current device; in a loop that put its model on ``cuda:r`` without
        ``set_device(r)`` that is GPU 0 on every rank, and every rank would time GPU 0."""
        if device.type != "cuda" or device.index is None:
            return
        before = torch.cuda.current_device()
        if before != device.index:
            torch.cuda.set_device(device)
            self._undo.append(lambda: torch.cuda.set_device(before))

    def _settle(self) -> None:
        """Before the profiler stops (after the last traced step, or at a clean exit before it):
        every rank meets in a gloo barrier, so no collective's profiler range is still open on
        gloo's thread when the profiler frees its event lists (the use-after-free behind the
        SIGABRT over gloo: docs/your-code.md; :func:`settle_collectives`). Only after a step that ended
        well: a rank whose step raised may be alone, and the others may never come."""
        if self._step_ok and self.ctx.world_size > 1:
            settle_collectives()

    def _open_writer(self, world: UserWorld) -> RunWriter:
        config = {"model": self.model_class, "variant": self.variant, "batch_size": self.samples,
                  "bucket_mb": self.bucket_mb, "steps": 0, "warmup": self.warmup,
                  "profile_steps": self.profile_steps, "trace": bool(self.profile_steps)}
        return RunWriter(self.out, self.name, command=list(sys.argv), config=config,
                         environment=world.environment(), kind="record")

    def _attach(self, model: nn.Module | None) -> None:
        """Route the model's collectives through this recording's Recorder (undone at exit)."""
        if not self.collectives:
            self._note = "collectives=False: collectives from the trace only"
        elif isinstance(model, DistributedDataParallel) and user_comm_hook(model):
            # the user's hook (fp16, PowerSGD, theirs) stays: its collectives are tapped
            self.comm_hook = user_comm_hook(model)
            tap = CollectiveTap(model.process_group, lambda: self.rec, lambda: self._in_step).install()
            self._undo.append(tap.remove)
            self._note = f"comm hook kept: {self.comm_hook} (its collectives logged as it launches them)"
        elif isinstance(model, DistributedDataParallel):
            state = HookState(model.process_group, self)
            try:
                model.register_comm_hook(state, recording_allreduce_hook)
                self._hooked = True
                # DDP cannot drop a hook: at exit it keeps averaging but stops logging
                self._undo.append(lambda: setattr(state, "recorder", NULL_RECORDER))
            except RuntimeError as exc:  # the model already has a comm hook (its own or ours)
                self._note = f"collectives from the trace only: {exc}"
        elif isinstance(model, Wrapper) and hasattr(model, "recorder"):
            old = model.recorder
            model.recorder = self.rec
            self._undo.append(lambda: setattr(model, "recorder", old))
        inner = getattr(model, "module", model)
        ddp = isinstance(model, DistributedDataParallel)
        in_backward = ddp or model is not None and getattr(model, "grad_sync_in_backward", False)
        if in_backward and (self.rec.clock is None or ddp):
            # as in train.Trainer: backward's computation ends before DDP's wait for its buckets
            # (on an event clock for DDP only: FSDP2's own final callback runs first there)
            self._bwd_end = BackwardEnd(self.rec.clock)
            self._undo.extend(h.remove for h in self._bwd_end.attach(inner.parameters()))

    def _saw_forward(self, _module: nn.Module, _args: Any) -> None:
        """Read the autocast state as the user's forward runs (inside their ``torch.autocast``,
        Lightning's ``bf16-mixed`` or the HF Trainer's ``bf16=True``): a half type once seen
        is the run's precision."""
        seen = autocast_precision(self._world.device)
        if seen != "fp32" or self.precision is None:
            self.precision = seen

    # -- steps --------------------------------------------------------------------------
    def _begin_step(self) -> None:
        if self._in_step:
            raise RuntimeError("rec.step() blocks cannot be nested")
        n, cap = self._n, self._capture
        if cap is not None:
            if not cap.running and n == (cap.first if cap.warmup_step is None else cap.warmup_step):
                cap.start()
            self._tracing = cap.running and cap.first <= n <= cap.last
            if self._tracing:
                cap.markers(self.rec.now)
        self._in_step = True
        self.rec.step = n
        self._mark = self.rec.collective_count()
        self._timer.start()

    def _end_step(self, samples: int | None, ok: bool) -> None:
        n = self._n
        self._timer.mark("sync")  # time since the last phase: grad sync / other
        self.rec.step = -1
        self._in_step, self._phase = False, None
        self._n += 1
        if ok and n >= self.warmup:
            row = steps_row(self.spec, self.ctx.rank, n, self._tracing, self._timer.finish(),
                            samples if samples is not None else self.samples)
            self._rows.append(row)
            self._channel.put(live_row(row), self.rec.rows_since(self._mark))
        if n == self.warmup - 1:
            self.rec.clear()  # warm-up collectives are not part of the run
        cap = self._capture
        if cap is not None and cap.running:
            self._step_ok = ok  # the profiler may stop in this step(): settle only if ok
            cap.step()
            if n >= cap.last:
                cap.stop()  # trace exported: every later step runs without the profiler
                if ok and self.ctx.world_size > 1:
                    # the export took a while: start the timed steps together. On gloo the job's
                    # own barrier first, which orders after the traced steps' collectives (their
                    # end stamps have run before any rank times a step; without it rank 1's live
                    # rows of the traced steps were measured missing their comm); then the
                    # control plane's, which meets every rank on any backend
                    settle_collectives()
                    control.barrier()
        self._tracing = False

    # -- the end ------------------------------------------------------------------------
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._in_step:  # left from inside a step: that step is incomplete, drop it
            self._in_step, self.rec.step = False, -1
        if self._capture is not None:
            if self._capture.running and exc_type is None:
                self._settle()  # the loop ended before the last traced step: all ranks are here
            self._capture.stop()
        cal = self._calibration() if exc_type is None else None
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self.status = self._life.outcome(exc_type)
        if exc_type is None:
            error = ""
        elif self.status == "interrupted":
            error = "interrupted (KeyboardInterrupt)"
        else:
            error = f"rank {self.ctx.rank}: {exc_type.__name__}: {exc}\n" + "".join(
                traceback.format_tb(tb, limit=6))
        mine = self._result()
        if cal is not None:
            mine["calibration"] = cal
        results = [mine]
        self._channel.close()  # this rank's last live rows are in the store
        if self.status == "complete" and self.ctx.world_size > 1:
            results = control.gather(mine) or []  # the control plane: CPU objects
        if self._poller is not None:  # after the gather, every rank's rows were sent
            self._poller.stop()
        if self._life.writer is not None:
            self._write(results, error)

    def _calibration(self) -> dict | None:
        """The what-if calibration when asked for and possible (every rank decides alike), else
        None, with the reason in the job's note; a failure is kept as the entry's ``error``."""
        if self.calibrate is None:
            return None
        why = ("the model is not a DistributedDataParallel" if not isinstance(self.model, DistributedDataParallel)
               else "needs 2+ ranks" if self.ctx.world_size < 2
               else "needs the recording's comm hook (collectives=True, no comm hook of the user's)"
               if not self._hooked else "")
        if why:
            self._note = "; ".join(x for x in (self._note, f"no what-if calibration: {why}") if x)
            return None
        try:
            return calibrate_recording(self, self.model, self.calibrate, float(self.bucket_mb or 25.0),
                                       self.calibration_steps)
        except Exception as exc:  # noqa: BLE001 - the recorded steps must survive a failed calibration
            return {"error": f"rank {self.ctx.rank}: {type(exc).__name__}: {exc}"}

    def _result(self) -> dict[str, Any]:
        """This rank's rows in the shape :func:`write_job` takes (as profile's ranks return)."""
        keep = {r["step"] for r in self._rows}
        coll = [c for c in self.rec.collective_rows() if c["step"] in keep]
        deadline = time.monotonic() + 1.0
        while any(c["t_end_ns"] < 0 for c in coll) and time.monotonic() < deadline:
            # work.wait() may return just before the backend thread runs the completion
            # callback that stamps t_end: give the last step's collectives a moment
            time.sleep(0.001)
            coll = [c for c in self.rec.collective_rows() if c["step"] in keep]
        cap = self._capture
        return {"steps": self._rows, "offset_ns": self.rec.offset_ns, "rtt_ns": self.rtt_ns,
                "collectives": coll,
                "messages": [m for m in self.rec.message_rows() if m["step"] in keep],
                "comm_calls": [c for c in self.rec.call_rows() if c["step"] in keep],
                "trace": str(cap.trace_file) if cap is not None and cap.trace_file else None,
                "trace_error": cap.error if cap is not None else "",
                "sync": cap.sync if cap is not None else [],
                "threads": self.ctx.threads, "cpus": []}

    def _write(self, results: list[dict], error: str) -> None:
        """Rank 0: rows, merged trace and final statuses (never masks the user's exception)."""
        life = self._life
        assert life.writer is not None
        status = self.status
        try:
            fields = write_job(life.writer, self.spec, results)
            if fields.get("status") == "failed" and status == "complete":  # a rank's trace is missing
                status, error = "failed", error or str(fields.get("error", ""))
        except Exception as exc:  # noqa: BLE001 - the rows are the point; say what broke
            fields = {"status": "failed"}
            error = error or f"writing the run failed: {type(exc).__name__}: {exc}"
            status = "failed" if status == "complete" else status
        fields["status"] = status
        if error:
            fields["error"] = error.strip()
        if self._note:
            fields["note"] = self._note
        if self.comm_hook:
            fields["comm_hook"] = self.comm_hook
        config = life.writer.meta["config"]
        config["steps"] = len({r["step"] for r in results[0]["steps"]})
        # what the loop ran in: autocast's type at its forward (fp32 without autocast)
        config["dtype"], config["tf32"] = self.precision or "fp32", tf32_enabled()
        life.end_job(self.job_id, fields)
        life.close(status)
