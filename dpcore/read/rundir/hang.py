"""Flight-recorder dumps on disk: a run's ``hang/<job_id>/`` folders, one such folder, or a
folder of dumps that PyTorch wrote for a user's own job (``TORCH_FR_DUMP_TEMP_FILE<rank>``).

Why one loader: ``hang`` and the Hang page take the same PATHs and must find the same dumps.
Files are read through :func:`dpcore.contract.flightrec.load_dump` only (JSON, or a pickle that
may name no global), and only regular files are opened.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from dpcore.contract import flightrec
from dpcore.contract import runformat as rf

#: most dump files read from one folder (a folder of something else is refused, not read)
MAX_DUMPS = 4096


@dataclass
class HangSet:
    """Every rank's dump (and stack, where collected) of one job."""

    job_id: str
    dumps: dict[int, dict]
    stacks: dict[int, str] = field(default_factory=dict)
    world_size: int | None = None
    source: Path | None = None


def _job_folder(folder: Path, world_size: int | None = None) -> HangSet:
    dumps, stacks = {}, {}
    for p in sorted(folder.glob("rank*.fr.json")):
        r = flightrec.rank_of(p)
        if r is not None and p.is_file():
            dumps[r] = flightrec.load_dump(p)
    for p in sorted(folder.glob("rank*.stack.txt")):
        digits = p.name[4:-len(".stack.txt")]
        if digits.isdigit() and p.is_file():
            stacks[int(digits)] = p.read_text(encoding="utf-8", errors="replace")
    if world_size is None and (folder / rf.VERDICT_FILE).is_file():
        try:
            meta = json.loads((folder / rf.VERDICT_FILE).read_text())
            world_size = max([*dumps, *meta.get("no_answer", []), -1]) + 1 or None
        except ValueError:
            pass
    return HangSet(folder.name, dumps, stacks, world_size, folder)


def _dump_folder(folder: Path) -> HangSet:
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()]
    dumps: dict[int, dict] = {}
    for p in files[:MAX_DUMPS]:
        r = flightrec.rank_of(p)
        if r is None or p.name.endswith((".txt", ".csv")):
            continue
        dumps[r] = flightrec.load_dump(p)
    return HangSet(folder.name, dumps, {}, None, folder)


def hung_jobs(run_dir: str | Path) -> list[str]:
    """The job ids of a run that hung: its hang/<job_id>/ folders, in name order (none read), so
    a page can point to the Hang page without loading a dump."""
    root = Path(run_dir) / rf.HANG_DIR
    return [d.name for d in sorted(root.iterdir()) if d.is_dir()] if root.is_dir() else []


def load_hangs(path: str | Path) -> list[HangSet]:
    """The dumps under ``path`` (a run, a job's hang folder, a folder of dumps, or one dump
    file), one :class:`HangSet` per job. ValueError (one line) when there are none."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"no such file or directory: {p}")
    if p.is_file():
        r = flightrec.rank_of(p)
        return [HangSet(p.stem, {r if r is not None else 0: flightrec.load_dump(p)}, source=p)]
    if (p / rf.RUN_JSON).is_file():
        sizes: dict[str, int] = {}
        try:
            meta = json.loads((p / rf.RUN_JSON).read_text())
            sizes = {j["id"]: int(j.get("processes") or j.get("world_size") or 0)
                     for j in meta.get("jobs", []) if isinstance(j, dict) and "id" in j}
        except (ValueError, TypeError, KeyError):
            pass
        sets = [_job_folder(p / rf.HANG_DIR / job, sizes.get(job) or None) for job in hung_jobs(p)]
        if not sets:
            raise ValueError(f"{p}: this run has no hang/ folder: none of its jobs hung (the "
                             "hang watchdog writes hang/<job_id>/ when one does)")
        return sets
    if any(p.glob("rank*.fr.json")):
        return [_job_folder(p)]
    subs = [d for d in sorted(p.iterdir()) if d.is_dir() and any(d.glob("rank*.fr.json"))]
    if subs:
        return [_job_folder(d) for d in subs]
    found = _dump_folder(p)
    if not found.dumps:
        raise ValueError(f"{p}: no flight-recorder dumps here; give a run, a job's hang/ folder "
                         "or a folder of dumps named <prefix><rank> (TORCH_FR_DUMP_TEMP_FILE)")
    return [found]
