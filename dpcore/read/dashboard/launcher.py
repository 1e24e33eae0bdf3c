"""Start `python -m dpcore profile ... --progress json` from the page and follow it.

Why a subprocess plus reader threads plus a polling fragment: a profile takes minutes; the
Streamlit script must never block on it. Two daemon threads copy the child's stdout/stderr into
lists held in session state; an `st.fragment(run_every=...)` redraws only the progress box once
a second; when the child exits, one full rerun opens the new run. The command is an argument
list (no shell), built only from validated form values, so nothing typed into the page runs.

Why a job cap and a machine-wide lock: the page is reachable by whoever reaches the server, and
a profile takes the whole machine (every rank pinned to its own CPUs). A form that starts 1,825
jobs, or two sessions that each start one pinned to the same CPUs (both then measure each
other), cost hours and give wrong numbers. So the form refuses more than
:data:`MAX_FORM_JOBS` jobs (the CLI is there for big sweeps), and a profile started from any
dashboard on this machine holds an exclusive ``flock`` on one lock file (in ``$DPCORE_LOCK_DIR``,
default the system's temporary folder) for as long as its process lives: the lock is the
child's (its inherited descriptor), so it ends with the child however the child ends.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import streamlit as st

from dpcore.contract.config import (
    BACKENDS,
    BUCKET_SENSITIVE,
    DEVICES,
    DTYPES,
    MODELS,
    OPTIMIZERS,
    SINGLE_PROCESS,
    SIZES,
    VARIANTS,
    TrainConfig,
    parse_bucket_sweep,
)
from dpcore.contract.option_fields import option_fields
from dpcore.contract.options import ProfileOptions, model_batch_size
from dpcore.read.dashboard.picker import OPEN_ON_OVERVIEW
from dpcore.read.dashboard.text import md

#: The command's own defaults (the form starts from them; none is typed here again).
DEFAULTS = ProfileOptions()
QUICK = dict(model=DEFAULTS.train.model, size=DEFAULTS.train.size, width=DEFAULTS.train.width,
             variants=["single", "flat", "ring", "overlap", "bucketed"],
             world_sizes=list(DEFAULTS.world_sizes), steps=6, bucket_mb=DEFAULTS.train.bucket_mb, bucket_sweep=[])
#: The options the form's command states even at their defaults, so the progress box shows
#: what runs (field names: the flags are the options classes').
SHOWN = ("model", "size", "width", "steps", "bucket_mb", "optimizer", "dtype", "variants", "world_sizes", "out",
         "progress", "device", "backend")
#: Most jobs one profile started from the form may have (every variant at all six world sizes
#: with a 4-size sweep is 110; 1,825 was accepted before): bigger sweeps are the CLI's.
MAX_FORM_JOBS = 120
#: Environment variable naming the folder of the machine-wide lock file (default: tempdir).
LOCK_DIR_ENV = "DPCORE_LOCK_DIR"
LOCK_NAME = "dpcore-dashboard-profile.lock"


def job_count(variants: list[str], world_sizes: list[int], bucket_mb: float, sweep: list[float]) -> int:
    """How many jobs ``profile`` runs for these form values (its plan: single-process variants
    once, the others at every world size, bucket-sensitive ones at every bucket size)."""
    buckets = len(set(sweep) | {float(bucket_mb)})
    return sum(1 if v in SINGLE_PROCESS else len(set(world_sizes)) * (buckets if v in BUCKET_SENSITIVE else 1)
               for v in dict.fromkeys(variants))


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or tempfile.gettempdir()) / LOCK_NAME


def _try_lock() -> tuple[int | None, str]:
    """(descriptor holding the exclusive lock, "") or (None, what holds it)."""
    path = lock_path()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        return None, f"the lock file {path} cannot be opened ({exc.strerror})"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 300, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        return None, holder
    return fd, ""


def machine_busy() -> str:
    """What is profiling on this machine from a dashboard ("" when nothing is): the lock is
    tried and, when free, given back at once."""
    fd, holder = _try_lock()
    if fd is not None:
        os.close(fd)
    return holder


@dataclass
class Launch:
    """A profile subprocess and what it has printed so far."""
    cmd: list[str]
    proc: subprocess.Popen
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)


def option_help(cls: type, name: str) -> str:
    """The help of option ``name`` of options class ``cls`` as ``--help`` shows it: the form's
    widgets say what the command's options say."""
    for f, spec in option_fields(cls):
        if f.name == name:
            return f"{spec.flag}: " + spec.help.replace("%(default)s", str(spec.default_text(f.default)))
    raise KeyError(name)


def form_options(out_root: Path, model: str, size: str, variants: list[str], world_sizes: list[int], steps: int,
                 bucket_mb: float, bucket_sweep: list[float], optimizer: str | None = None,
                 width: int | None = None, device: str | None = None, backend: str | None = None,
                 dtype: str | None = None) -> ProfileOptions:
    """The profile the form's values ask for, as the command's own options object: a value the
    command refuses is refused here, with the command's one line (UsageError, a ValueError).
    None: the command's default; ``size`` applies to the transformer, ``width`` to the mlp; the
    batch is the model's own, as the command takes it when none is given."""
    given: dict[str, Any] = {"optimizer": optimizer, "width": None if width is None else int(width), "dtype": dtype}
    train = {k: v for k, v in given.items() if v is not None}
    job = {k: v for k, v in {"device": device, "backend": backend}.items() if v is not None}
    return ProfileOptions(variants=tuple(variants), world_sizes=tuple(int(w) for w in world_sizes),
                          bucket_sweep=tuple(float(b) for b in bucket_sweep), out=str(out_root), progress="json",
                          train=TrainConfig(model=model, size=size, steps=int(steps), bucket_mb=float(bucket_mb),
                                            batch_size=model_batch_size(model), **train), **job)


def build_command(out_root: Path, model: str, size: str, variants: list[str], world_sizes: list[int], steps: int,
                  bucket_mb: float, bucket_sweep: list[float], optimizer: str | None = None, width: int | None = None,
                  device: str | None = None, backend: str | None = None, dtype: str | None = None) -> list[str]:
    """The argument list of the profile command (never passed through a shell): the form's
    :func:`form_options` written back as the command line (``to_argv``), which the command
    parses into the same options."""
    opts = form_options(out_root, model, size, variants, world_sizes, steps, bucket_mb, bucket_sweep, optimizer,
                        width, device, backend, dtype)
    return [sys.executable, "-m", "dpcore", "profile", *opts.to_argv(keep=SHOWN)]


def parse_sweep(text: str) -> list[float]:
    """'1, 5, 25' -> [1.0, 5.0, 25.0] with exactly the CLI's rules (UsageError is a ValueError),
    so the form refuses what the command would refuse, before starting it."""
    return list(parse_bucket_sweep(text))


def parse_event(line: str) -> dict | None:
    """One progress line -> dict, or None for anything that is not a JSON object (parsed defensively)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        ev = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return ev if isinstance(ev, dict) else None


def _num(v: object, default: float) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def progress_of(events: list[dict]) -> tuple[float, str, str | None]:
    """(fraction 0..1, status text, run_dir) from the events seen so far."""
    frac, text, run_dir = 0.0, "starting…", None
    for ev in events:
        run_dir = ev.get("run_dir") or run_dir
        total = max(1.0, _num(ev.get("jobs_total"), 1))
        idx = max(1.0, _num(ev.get("job_index"), 1))
        kind = ev.get("event")
        if kind == "job_start":
            frac, text = (idx - 1) / total, f"job {int(idx)}/{int(total)}: {ev.get('job_id', '?')}"
        elif kind == "step":
            part = _num(ev.get("step"), 0) / max(1.0, _num(ev.get("steps_total"), 1))
            frac = (idx - 1 + min(1.0, part)) / total
            note = ev.get("steps_note")
            text = (f"job {int(idx)}/{int(total)}: {ev.get('job_id', '?')} · "
                    f"step {ev.get('step')}/{ev.get('steps_total')}" + (f" ({note})" if note else ""))
        elif kind == "job_end":
            frac, text = idx / total, f"job {int(idx)}/{int(total)}: {ev.get('job_id', '?')} {ev.get('status', '')}"
        elif kind == "run_end":
            frac, text = 1.0, f"run {ev.get('status', 'finished')}"
    return min(1.0, max(0.0, frac)), text, run_dir


def _pump(stream, sink: list[str]) -> None:
    for line in iter(stream.readline, ""):
        sink.append(line.rstrip("\n"))
    stream.close()


class MachineBusy(RuntimeError):
    """A profile started from a dashboard is already running on this machine."""


def start(cmd: list[str], cwd: Path) -> Launch:
    """Take the machine's lock, spawn the profiler holding it, start its two reader threads;
    store nothing but the handle. :class:`MachineBusy` (naming the holder) when it is taken."""
    fd, holder = _try_lock()
    if fd is None:
        raise MachineBusy(f"a profile is already running on this machine ({holder}); one at a time")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                stdin=subprocess.DEVNULL, pass_fds=(fd,))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {proc.pid}, started {time.strftime('%H:%M:%S')}".encode(), 0)
    finally:
        os.close(fd)  # from here the lock is the child's alone: it ends when the child does
    launch = Launch(cmd, proc)
    for stream, sink in ((proc.stdout, launch.out), (proc.stderr, launch.err)):
        threading.Thread(target=_pump, args=(stream, sink), daemon=True).start()
    return launch


def new_run_form(out_root: Path, cwd: Path) -> None:
    """The form that starts a profile; disabled while one is running. Only the button starts it:
    ``enter_to_submit=False``, because Enter in a field (typing a bucket sweep) starting a
    minutes-long profile with half-filled values is the last thing a user wants."""
    busy = isinstance(st.session_state.get("launch"), Launch) and st.session_state["launch"].proc.poll() is None
    other = "" if busy else machine_busy()
    if other:
        st.info(f"A profile started from a dashboard is running on this machine ({md(other)}); one runs "
                "at a time, so that no two measure each other. The form is enabled again when it ends.")
    busy = busy or bool(other)
    with st.form("new_run", enter_to_submit=False):
        d, train = DEFAULTS, DEFAULTS.train
        c = st.columns(4)
        model = c[0].selectbox("Model", MODELS, index=MODELS.index(train.model))
        size = c[1].selectbox("Size (transformer)", SIZES, index=SIZES.index(train.size),
                              help=option_help(TrainConfig, "size"))
        width = c[2].number_input("Width (mlp)", 1, 65_536, train.width, help=option_help(TrainConfig, "width"))
        steps = c[3].number_input("Steps per job", train.profile_steps, 10_000, train.steps,
                                  help=f"At least {train.profile_steps}: the last {train.profile_steps} steps "
                                       "are traced.")
        variants = st.multiselect("Variants", VARIANTS, default=QUICK["variants"])
        c = st.columns(3)
        world_sizes = c[0].multiselect("World sizes", sorted({1, 2, 3, 4, 8, 16, *d.world_sizes}),
                                       default=list(d.world_sizes))
        bucket = c[1].number_input("Bucket size (MiB)", 0.01, 4096.0, train.bucket_mb,
                                   help=option_help(TrainConfig, "bucket_mb"))
        sweep = c[2].text_input("Bucket sweep (MiB, comma separated)", "", placeholder="e.g. 1,5,25",
                                help=option_help(ProfileOptions, "bucket_sweep"))
        c = st.columns(4)
        optimizer = c[0].selectbox("Optimizer", OPTIMIZERS, index=OPTIMIZERS.index(train.optimizer),
                                   help=option_help(TrainConfig, "optimizer"))
        device = c[1].selectbox("Device", DEVICES, index=DEVICES.index(d.device),
                                help=option_help(ProfileOptions, "device"))
        backend = c[2].selectbox("Backend", BACKENDS, index=BACKENDS.index(d.backend),
                                 help=option_help(ProfileOptions, "backend"))
        dtype = c[3].selectbox("Dtype", DTYPES, index=DTYPES.index(train.dtype),
                               help=option_help(TrainConfig, "dtype"))
        go = st.form_submit_button("Start profile", disabled=busy, type="primary")
    if go:
        try:
            if not variants or not world_sizes:
                raise ValueError("choose at least one variant and one world size")
            buckets = parse_sweep(sweep)
            jobs = job_count(variants, world_sizes, bucket, buckets)
            if jobs > MAX_FORM_JOBS:
                raise ValueError(f"{jobs} jobs; the form starts at most {MAX_FORM_JOBS}: choose fewer "
                                 "variants, world sizes or bucket sizes, or run the sweep with "
                                 "`python -m dpcore profile`")
            cmd = build_command(out_root, model, size, variants, world_sizes, steps, bucket, buckets, optimizer,
                                int(width), device=device, backend=backend, dtype=dtype)
            st.session_state["launch"] = start(cmd, cwd)
        except (ValueError, MachineBusy) as exc:
            st.error(f"Cannot start: {md(str(exc))}")
            return
        st.rerun()


def quick_start(out_root: Path, cwd: Path) -> None:
    """One-click quick CPU profile (the empty state's offer); a note instead when another
    dashboard's profile holds the machine."""
    try:
        st.session_state["launch"] = start(build_command(out_root, **QUICK), cwd)
    except MachineBusy as exc:
        st.session_state["launch_busy"] = str(exc)


@st.fragment(run_every=1.0)
def follow() -> None:
    """Progress box of the running profile; redrawn every second without rerunning the page."""
    launch: Launch | None = st.session_state.get("launch")
    if launch is None:
        return
    events = [e for e in map(parse_event, list(launch.out)) if e]
    frac, text, run_dir = progress_of(events)
    rc = launch.proc.poll()
    with st.container(border=True):
        st.markdown(f"**Profiling** · `{' '.join(launch.cmd[1:])}`")
        st.progress(frac, text=f"{text} · {time.time() - launch.started:.0f} s")
        # a skipped job (e.g. data_parallel without GPUs) carries its reason in "error" too
        errors = [f"{md(e.get('job_id', '?'))}: {md(e['error'])}" for e in events
                  if e.get("error") and e.get("status", "failed") == "failed"]
        if errors:
            st.error("\n\n".join(errors))
        if rc is None:
            if st.button("Stop", key="launch-stop"):
                launch.proc.terminate()
            return
        st.session_state["launch_result"] = dict(rc=rc, run_dir=run_dir, err="\n".join(launch.err[-60:]),
                                                 errors=errors, cmd=launch.cmd)
        st.session_state.pop("launch", None)
        if rc == 0 and run_dir:
            st.session_state[OPEN_ON_OVERVIEW] = Path(run_dir).name
    st.rerun()


def show_result() -> None:
    """After the child exits: success note (the run is opened) or its error output verbatim."""
    res = st.session_state.get("launch_result")
    if not res:
        return
    if res["rc"] == 0:
        st.success(f"Profile finished: opened run {md(Path(res['run_dir'] or '?').name)}.")
    if res.get("errors"):
        st.error("Jobs that failed (the other jobs' results are kept):\n\n" + "\n\n".join(res["errors"]))
    if res["rc"] != 0:
        st.error(f"The profile command exited with code {res['rc']}. Its error output:")
        st.code(res["err"] or "(no output on stderr)", language=None)
    if st.button("Dismiss", key="launch-dismiss"):
        st.session_state.pop("launch_result", None)
        st.rerun()
