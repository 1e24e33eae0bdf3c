"""Record what every read command prints, so a change to the read path can be shown to change none of it.

Why: the read wing's refactors (one read path through the per-rank tables, modules renamed and
split) must leave every command's output identical. This runs ``analyze``, ``summarize``,
``stragglers``, ``gpu``, ``whatif`` and ``import`` (with ``--csv`` where the command has it) on the
committed samples (``profiles/sample-*``, or copies of them: ``--profiles``) and, with ``--shared``,
on the real traces and GPU runs under ``../shared`` (``traces/*``, ``gpu/runs/*``), and writes each
command's exit status and output into a folder, one file per command. ``--hash`` writes a SHA-256 of
each output instead of its text, so outputs of data that must not be copied into the repository can
still be compared.

Outputs are made independent of where they ran: the repository's and ``../shared``'s absolute
paths become ``<REPO>`` and ``<SHARED>`` (the folder of the samples ``<REPO>/profiles``, also when
``--profiles`` names a copy elsewhere), the import's output folder ``<OUT>`` and the run id it
makes (a timestamp) ``<RUN_ID>``. Every command reads through a fresh cache folder
(``DPCORE_CACHE_DIR``): the first read of a run is a cold read, the later ones cache hits, so
both paths are recorded.

    python scripts/golden_outputs.py OUT_DIR                # the committed samples
    python scripts/golden_outputs.py OUT_DIR --profiles DIR # copies of them (the test suite's)
    python scripts/golden_outputs.py OUT_DIR --shared       # ../shared's runs and traces
    python scripts/golden_outputs.py OUT_DIR --shared --hash
    diff -r tests/data/golden OUT_DIR                       # compare
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
#: a run id made by ``dpcore import``: YYYYmmdd-HHMMSS-import[-name]-xxxx
_RUN_ID = re.compile(r"\d{8}-\d{6}-import(?:-[\w.]+)*?-[0-9a-f]{4}\b")
#: the whatif job of the committed training sample
_WHATIF_JOB = "bucketed-ws2-b25"
#: The committed sample runs, read by name: the runs a user's ``dpcore profile`` or ``import`` adds
#: to profiles/ beside them are no part of the recording.
SAMPLES = ("sample-allreduce", "sample-gpu", "sample-hang", "sample-train")


def _read_commands(label: str, path: Path, csv: bool = True) -> Iterator[tuple[str, list[str]]]:
    """(file name, argv) of the commands that read traces, on a run or a folder of traces."""
    for cmd in ("analyze", "stragglers"):
        yield f"{label}.{cmd}", [cmd, str(path)]
        if csv:
            yield f"{label}.{cmd}.csv", [cmd, str(path), "--csv"]
    for extra in ([], ["--per-step"], ["--kernels"], ["--collectives"]):
        name = ".".join([f"{label}.gpu", *(e.lstrip("-") for e in extra)])
        yield name, ["gpu", str(path), *extra]
        if csv:
            yield f"{name}.csv", ["gpu", str(path), *extra, "--csv"]


def _run_commands(label: str, run: Path) -> Iterator[tuple[str, list[str]]]:
    """The commands on a run directory: summarize, the trace readers, whatif on its first job."""
    yield f"{label}.summarize", ["summarize", str(run)]
    yield f"{label}.summarize.csv", ["summarize", str(run), "--csv"]
    if (run / "traces").is_dir():
        yield from _read_commands(label, run)


def commands(shared: bool, profiles: Path = REPO / "profiles") -> Iterator[tuple[str, list[str]]]:
    """Every (file name, argv) this script runs: the samples' (in ``profiles``), or ../shared's."""
    if not shared:
        for run in (profiles / name for name in SAMPLES):
            if (run / "run.json").is_file():
                yield from _run_commands(run.name, run)
        train = profiles / "sample-train"
        for extra in ([], ["--csv"]):
            yield ".".join(["sample-train.whatif", *(e.lstrip("-") for e in extra)]), \
                ["whatif", str(train), "--job", _WHATIF_JOB, *extra]
            yield ".".join(["sample-train.whatif.fabric", *(e.lstrip("-") for e in extra)]), \
                ["whatif", str(train), "--job", _WHATIF_JOB, "--fabric", "nvlink-h100,ib-ndr400", *extra]
        yield "whatif.fabric-list", ["whatif", "--fabric", "list"]
        yield "sample-train.import", ["import", str(train / "traces" / _WHATIF_JOB)]
        return
    for run in sorted(p for p in (SHARED / "gpu" / "runs").glob("*") if (p / "run.json").is_file()):
        yield from _run_commands(run.name, run)
        jobs = sorted(p for p in (run / "traces").iterdir() if p.is_dir()) if (run / "traces").is_dir() else []
        if jobs:
            yield f"{run.name}.import", ["import", str(jobs[0])]
    for folder in sorted(p for p in (SHARED / "traces").glob("*") if p.is_dir() and any(p.iterdir())):
        yield from _read_commands(folder.name, folder, csv=False)
        yield f"{folder.name}.import", ["import", str(folder)]


def normalize(text: str, out: Path, profiles: Path = REPO / "profiles") -> str:
    """``text`` with the machine's paths and the import's timestamped run id replaced (a copy of
    the samples reads as the checkout's ``<REPO>/profiles``)."""
    for path, name in ((out, "<OUT>"), (profiles, "<REPO>/profiles"), (SHARED.resolve(), "<SHARED>"),
                       (SHARED, "<SHARED>"), (REPO, "<REPO>")):
        text = text.replace(str(path), name)
    return _RUN_ID.sub("<RUN_ID>", text)


def run_one(argv: list[str], env: dict[str, str], out: Path, profiles: Path = REPO / "profiles") -> str:
    """One command's exit status and stdout (stderr too when it failed), normalized. An import
    is followed by ``summarize --csv`` and ``analyze --csv`` of the run it wrote."""
    done = subprocess.run([sys.executable, "-m", "dpcore", *argv], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=900)
    text = f"exit {done.returncode}\n{done.stdout}"
    if done.returncode:
        text += f"--- stderr\n{done.stderr}"
    if argv[0] == "import" and done.returncode == 0:
        for run in sorted(p for p in out.iterdir() if p.is_dir()):
            for cmd in ("summarize", "analyze"):
                text += f"--- {cmd} --csv of the imported run\n" + run_one([cmd, str(run), "--csv"], env, out, profiles)
    return normalize(text, out, profiles)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder the outputs are written into (made if absent)")
    ap.add_argument("--shared", action="store_true", help="../shared's runs and traces instead of the samples")
    ap.add_argument("--hash", action="store_true", help="write a SHA-256 of each output instead of its text")
    ap.add_argument("--only", default=None, help="only the commands whose file name contains this")
    ap.add_argument("--profiles", type=Path, default=REPO / "profiles",
                    help="the folder holding the samples (default: the checkout's profiles/); the tests pass a copy")
    args = ap.parse_args(argv)
    if args.shared and not SHARED.is_dir():
        print(f"error: {SHARED} is absent: --shared needs the shared runs and traces", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dpcore-golden-") as tmp:
        env = {**os.environ, "DPCORE_CACHE_DIR": str(Path(tmp) / "cache"), "PYTHONPATH": str(REPO)}
        profiles = args.profiles.resolve()
        for name, cmd in commands(args.shared, profiles):
            if args.only and args.only not in name:
                continue
            out = Path(tmp) / "import" / name
            if cmd[0] == "import":
                out.mkdir(parents=True)
                cmd = [*cmd, "--out", str(out)]
            text = run_one(cmd, env, out, profiles)
            if args.hash:
                (args.out / f"{name}.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
            else:
                (args.out / f"{name}.txt").write_text(text)
            print(name, text.split("\n", 1)[0], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
