"""Flight-recorder dumps on disk: a run's ``hang/<job_id>/`` folders, one such folder, or a
folder of dumps that PyTorch wrote for a user's own job (``TORCH_FR_DUMP_TEMP_FILE<rank>``).

Why one loader: ``hang`` and the Hang page take the same PATHs and must find the same dumps.
Files are read through :func:`dpcore.contract.flightrec.load_dump` only (JSON, or a pickle that
may name no global), and only regular files are opened. Stacks are read through
:func:`dpcore.contract.files.open_inside` and cut at :data:`MAX_STACK_BYTES`. No file is read
through a link that leaves the run (or the folder of dumps) it is read as part of, and with
``root`` (the dashboard's profiles folder) no folder or file that resolves outside it is read:
a symlinked ``hang/<job>`` or ``rank0.stack.txt`` is left out, as the run loader does.

Why a budget: what a dump describes can be far larger than its bytes, and a folder can hold
the same file many times (hard links). So a file is read at most once ((st_dev, st_ino)), at
most :data:`MAX_HANG_BYTES` of dump files are read per call, and each dump is kept as its
collectives only (:func:`dpcore.contract.flightrec.slim`). A rank's dump that exists but is
refused, unreadable, a second link to a file already read or beyond the budget stands as
:func:`dpcore.contract.flightrec.unreadable`: that rank is "unknown" in the verdict, never a
rank without a dump (which would name it as the one behind); one line says what was set aside.

Why a folder of foreign dumps skips what it cannot read: PyTorch's dump prefix is any name, so
a folder of dumps may hold other files ending in digits; one of them must not hide the others'
verdict. Each skipped file is named (``HangSet.skipped``); a folder where nothing loads gives
the first file's one-line error.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcore.contract import flightrec
from dpcore.contract import runformat as rf
from dpcore.contract.files import open_inside
from dpcore.read.rundir.load import MAX_RUN_FILE_BYTES, inside_root

#: most dump files read from one folder (a folder of something else is refused, not read)
MAX_DUMPS = 4096
#: most of one rank's stack file shown (faulthandler writes a few KB per thread)
MAX_STACK_BYTES = 1 << 20
#: most bytes of dump files read by one call (all jobs, all ranks): 1,024 ranks' dumps of
#: 2,000 entries each (PyTorch's default buffer) are about 1 MB apiece
MAX_HANG_BYTES = 1 << 30


@dataclass
class HangSet:
    """Every rank's dump (and stack, where collected) of one job."""

    job_id: str
    dumps: dict[int, dict]
    stacks: dict[int, str] = field(default_factory=dict)
    world_size: int | None = None
    source: Path | None = None
    #: one line per file of the folder left out (not a dump, unreadable, set aside)
    skipped: list[str] = field(default_factory=list)


@dataclass
class _Reader:
    """Reads the dumps of one call: each file once, within the byte budget."""

    used: int = 0
    seen: dict[tuple[int, int], Path] = field(default_factory=dict)
    #: the files set aside unread: (why, path)
    aside: list[tuple[str, Path]] = field(default_factory=list)

    def load(self, p: Path, within: Path, skipped: list[str]) -> dict[str, Any] | None:
        """The slimmed dump at ``p``, or None when it was refused or unreadable (a line in
        ``skipped`` says why), or set aside unread (listed in ``aside``, summed up in one line
        by :meth:`note`): a second link to a file already read, or beyond the budget."""
        try:
            st = os.stat(p)
        except OSError as exc:
            skipped.append(f"{p}: cannot read ({exc.strerror or exc})")
            return None
        ident = (st.st_dev, st.st_ino)
        if ident in self.seen:
            self.aside.append(("link", p))
            return None
        if self.used + st.st_size > MAX_HANG_BYTES:
            self.aside.append(("budget", p))
            return None
        try:
            dump = flightrec.slim(flightrec.load_dump(p, within))
        except flightrec.DumpError as exc:
            skipped.append(str(exc))
            return None
        self.seen[ident] = p
        self.used += st.st_size
        return dump

    def note(self, hs: HangSet) -> HangSet:
        """``hs`` with one line per kind of dump set aside among its own files."""
        for why, text in (("link", "links to a dump file already read (hard links), read once"),
                          ("budget", f"beyond the {MAX_HANG_BYTES >> 20} MiB of dumps read at once")):
            mine = [p for w, p in self.aside if w == why and hs.source is not None and p.parent == hs.source]
            if mine:
                names = ", ".join(p.name for p in mine[:3]) + (" ..." if len(mine) > 3 else "")
                hs.skipped.append(f"{len(mine)} dump(s) set aside ({names}): {text}; their ranks "
                                  "are unknown")
        return hs


def _ok(p: Path, root: Path | None) -> bool:
    """A regular file (links followed) that, with ``root`` given, resolves inside it."""
    return p.is_file() and (root is None or inside_root(p, root))


def read_stack(p: Path, within: Path | None = None) -> str:
    """One rank's stack file, at most :data:`MAX_STACK_BYTES` of it ('' when unreadable or,
    links resolved, outside ``within``: by default the folder it is in)."""
    try:
        with open_inside(p, within if within is not None else p.parent, 1 << 62) as f:
            raw = f.read(MAX_STACK_BYTES + 1)
    except OSError:
        return ""
    text = raw[:MAX_STACK_BYTES].decode("utf-8", errors="replace")
    return text + (f"\n... (cut at {MAX_STACK_BYTES >> 20} MiB)" if len(raw) > MAX_STACK_BYTES else "")


def _job_folder(folder: Path, world_size: int | None = None, root: Path | None = None,
                within: Path | None = None, reader: _Reader | None = None) -> HangSet:
    """One job's ``rank<r>.fr.json`` dumps, stacks and verdict.json; ``within``: the run (or
    folder) every file must resolve inside (default: ``folder``)."""
    top = within if within is not None else folder
    reader = reader if reader is not None else _Reader()
    dumps: dict[int, dict] = {}
    stacks: dict[int, str] = {}
    skipped: list[str] = []
    for p in sorted(folder.glob("rank*.fr.json"))[:MAX_DUMPS]:
        r = flightrec.rank_of(p)
        if r is None:
            continue
        if not _ok(p, root) or not inside_root(p, top):
            where = root if root is not None and not inside_root(p, root) else top
            skipped.append(f"{p}: not a regular file inside {where}; not read")
            dumps[r] = flightrec.unreadable(skipped[-1])
            continue
        errors = len(skipped)
        got = reader.load(p, top, skipped)
        dumps[r] = got if got is not None else \
            flightrec.unreadable(skipped[-1] if len(skipped) > errors else "set aside")
    for p in sorted(folder.glob("rank*.stack.txt"))[:MAX_DUMPS]:
        r = flightrec.plausible_rank(p.name[4:-len(".stack.txt")])
        if r is not None and _ok(p, root) and inside_root(p, top):
            stacks[r] = read_stack(p, top)
    if world_size is None and _ok(folder / rf.VERDICT_FILE, root):
        try:
            with open_inside(folder / rf.VERDICT_FILE, top, MAX_STACK_BYTES) as f:
                meta = json.loads(f.read(MAX_STACK_BYTES))
            claimed = meta.get("no_answer", []) if isinstance(meta, dict) else []
            told = [flightrec.plausible_rank(r) for r in claimed if isinstance(claimed, list)]
            world_size = max([*dumps, *(r for r in told if r is not None), -1]) + 1 or None
        except (OSError, ValueError, RecursionError):
            pass
    if dumps and skipped and all(flightrec.is_unreadable(d) for d in dumps.values()):
        raise flightrec.DumpError(skipped[0])  # nothing to judge by: the first file's line
    return reader.note(HangSet(folder.name, dumps, stacks, world_size, folder, skipped))


def _dump_folder(folder: Path, reader: _Reader) -> HangSet:
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()]
    dumps: dict[int, dict] = {}
    skipped: list[str] = []
    for p in files[:MAX_DUMPS]:
        r = flightrec.rank_of(p)
        if r is None or p.name.endswith((".txt", ".csv")):
            continue
        errors = len(skipped)
        got = reader.load(p, folder, skipped)
        if got is not None:
            dumps[r] = got
        elif len(skipped) == errors:  # set aside unread: a dump, its rank unknown
            dumps[r] = flightrec.unreadable("set aside")
    if not any(not flightrec.is_unreadable(d) for d in dumps.values()) and skipped:
        raise flightrec.DumpError(skipped[0])
    return reader.note(HangSet(folder.name, dumps, {}, None, folder, skipped))


def hung_jobs(run_dir: str | Path) -> list[str]:
    """The job ids of a run that hung: its hang/<job_id>/ folders, in name order (none read), so
    a page can point to the Hang page without loading a dump."""
    root = Path(run_dir) / rf.HANG_DIR
    return [d.name for d in sorted(root.iterdir()) if d.is_dir()] if root.is_dir() else []


def load_hangs(path: str | Path, root: str | Path | None = None) -> list[HangSet]:
    """The dumps under ``path`` (a run, a job's hang folder, a folder of dumps, or one dump
    file), one :class:`HangSet` per job; with ``root``, only what resolves inside it.
    ValueError (one line) when there are none."""
    if not str(path).strip():  # Path("") is "." : an empty argument would read the current folder
        raise ValueError("the path is empty; give a run, a job's hang/ folder or a folder of "
                         "flight-recorder dumps")
    p = Path(path)
    r0 = Path(root) if root is not None else None
    if r0 is not None and not inside_root(p, r0):
        raise ValueError(f"{p} resolves outside the profiles folder {r0}; not read")
    if not p.exists():
        raise ValueError(f"no such file or directory: {p}")
    if p.is_file():
        r = flightrec.rank_of(p)
        return [HangSet(p.stem, {r if r is not None else 0: flightrec.slim(flightrec.load_dump(p))},
                        source=p)]
    reader = _Reader()
    if (p / rf.RUN_JSON).is_file():
        sizes: dict[str, int] = {}
        try:
            with open_inside(p / rf.RUN_JSON, p, MAX_RUN_FILE_BYTES) as f:  # a 3 GiB sparse file
                meta = json.loads(f.read(MAX_RUN_FILE_BYTES + 1))
            sizes = {str(j["id"]): flightrec.plausible_world(j.get("processes")
                                                             or j.get("world_size")) or 0
                     for j in meta.get("jobs", []) if isinstance(j, dict) and "id" in j}
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
            pass
        hang_root = p / rf.HANG_DIR
        folders = [d for d in sorted(hang_root.iterdir()) if d.is_dir()] if hang_root.is_dir() else []
        kept = [d for d in folders if inside_root(d, p)
                and (r0 is None or (inside_root(hang_root, r0) and inside_root(d, r0)))]
        sets = [_job_folder(d, sizes.get(d.name) or None, r0, p, reader) for d in kept]
        if not sets and folders:  # a linked hang/ (or every job in it) is not "no hang"
            where = f"the profiles folder {r0}" if r0 is not None and not inside_root(hang_root, r0) \
                else "the run"
            raise ValueError(f"{p}: its {rf.HANG_DIR}/ folders resolve outside {where}; not read")
        if not sets:
            raise ValueError(f"{p}: this run has no hang/ folder: none of its jobs hung (the "
                             "hang watchdog writes hang/<job_id>/ when one does)")
        return sets
    if any(p.glob("rank*.fr.json")):
        return [_job_folder(p, None, r0, p, reader)]
    subs = [d for d in sorted(p.iterdir()) if d.is_dir() and any(d.glob("rank*.fr.json"))
            and inside_root(d, p) and (r0 is None or inside_root(d, r0))]
    if subs:
        return [_job_folder(d, None, r0, p, reader) for d in subs]
    found = _dump_folder(p, reader)
    if not found.dumps:
        raise ValueError(f"{p}: no flight-recorder dumps here; give a run, a job's hang/ folder "
                         "or a folder of dumps named <prefix><rank> (TORCH_FR_DUMP_TEMP_FILE)")
    return [found]
