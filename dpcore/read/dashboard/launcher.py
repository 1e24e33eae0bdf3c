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
    check_int,
    default_of,
    parse_bucket_sweep,
)
from dpcore.read.dashboard.picker import OPEN_ON_OVERVIEW
from dpcore.read.dashboard.text import md

QUICK = dict(model="mlp", size="tiny", width=default_of(TrainConfig, "width"),
             variants=["single", "flat", "ring", "overlap", "bucketed"],
             world_sizes=[1, 2], steps=6, bucket_mb=25.0, bucket_sweep=[])
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


def build_command(out_root: Path, model: str, size: str, variants: list[str], world_sizes: list[int], steps: int,
                  bucket_mb: float, bucket_sweep: list[float], optimizer: str = "sgd", width: int = 512,
                  device: str = "auto", backend: str = "auto", dtype: str = "auto") -> list[str]:
    """The argument list of the profile command (validated values only; never passed through a shell).
    ``size`` applies to the transformer, ``width`` to the mlp (the other is passed too, unused);
    ``device``, ``backend`` and ``dtype``: the command's own choices (``auto``: its defaults, a GPU
    where there is one)."""
    if model not in MODELS or size not in SIZES or not set(variants) <= set(VARIANTS) or optimizer not in OPTIMIZERS:
        raise ValueError("unknown model, size, variant or optimizer")
    for name, value, choices in (("device", device, DEVICES), ("backend", backend, BACKENDS), ("dtype", dtype, DTYPES)):
        if value not in choices:
            raise ValueError(f"unknown {name} {value!r}: choose one of {', '.join(choices)}")
    check_int("--width", int(width), 1)
    cmd = [sys.executable, "-m", "dpcore", "profile", "--model", model, "--size", size, "--width", str(int(width)),
           "--variants", ",".join(variants), "--world-sizes", ",".join(str(int(w)) for w in world_sizes),
           "--steps", str(int(steps)), "--bucket-mb", f"{float(bucket_mb):g}", "--out", str(out_root),
           "--progress", "json", "--optimizer", optimizer, "--device", device, "--backend", backend,
           "--dtype", dtype]
    if bucket_sweep:
        cmd += ["--bucket-sweep", ",".join(f"{float(b):g}" for b in bucket_sweep)]
    return cmd


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
        c = st.columns(4)
        model = c[0].selectbox("Model", MODELS)
        size = c[1].selectbox("Size (transformer)", SIZES, help="--size: the transformer's d_model, layers, heads")
        width = c[2].number_input("Width (mlp)", 1, 65_536, QUICK["width"],
                                  help="--width: hidden width of the mlp's 16 layers")
        steps = c[3].number_input("Steps per job", 3, 10_000, 10, help="At least 3: the last 3 steps are traced.")
        variants = st.multiselect("Variants", VARIANTS, default=QUICK["variants"])
        c = st.columns(3)
        world_sizes = c[0].multiselect("World sizes", [1, 2, 3, 4, 8, 16], default=[1, 2])
        bucket = c[1].number_input("Bucket size (MiB)", 0.01, 4096.0, 25.0)
        sweep = c[2].text_input("Bucket sweep (MiB, comma separated)", "", placeholder="e.g. 1,5,25")
        c = st.columns(4)
        optimizer = c[0].selectbox("Optimizer", OPTIMIZERS, help="SGD keeps no state, so what ZeRO-1 "
                                   "(zero1, torch_zero1) saves shows only with adam or adamw (Memory page).")
        device = c[1].selectbox("Device", DEVICES, help="--device: auto = cuda where a GPU is present, else cpu")
        backend = c[2].selectbox("Backend", BACKENDS, help="--backend: auto = nccl on cuda when every rank has "
                                 "its own GPU, else gloo")
        dtype = c[3].selectbox("Dtype", DTYPES, help="--dtype: fp32, or bf16 / fp16 autocast; auto = bf16 on a "
                               "GPU that supports it, fp32 on the CPU")
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
