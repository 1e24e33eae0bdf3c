"""The run directory (docs/DESIGN.md): run.json, CSV tables and traces, always written atomically.

Why atomic writes everywhere: the dashboard reads runs while they are being written, and a
crash or Ctrl-C must never leave half a file that poisons a run. Every file is written to a
temporary name in the same folder and ``os.replace``-d into place, so a reader sees either the
old complete file or the new complete file.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from dpcore.contract import runformat
from dpcore.contract.errors import UsageError
from dpcore.contract.files import atomic_write_text, csv_text, new_run_id, now_iso


def _unwritable(root: Path, exc: OSError) -> UsageError:
    """A run folder that cannot be made under --out: one line, before anything ran."""
    return UsageError(f"--out {root}: cannot create a run folder there ({exc.strerror}); "
                      "choose a writable folder")


class RunWriter:
    """Owns one ``profiles/<run_id>/`` folder for the lifetime of a profiler invocation."""

    def __init__(self, out_root: Path | str = "profiles", name: str | None = None, *,
                 command: list[str], config: dict, environment: dict,
                 kind: str = "profile", run_id: str | None = None) -> None:
        root = Path(out_root)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise UsageError(f"--out {root}: not a folder (a file is in the way); "
                             "choose a writable folder") from None
        except OSError as exc:  # read-only, no permission, disk gone: nothing ran yet
            raise UsageError(f"--out {root}: cannot create it ({exc.strerror}); "
                             "choose a writable folder") from None
        if run_id is not None:  # an exact id (e.g. the committed sample): never overwrite
            self.run_id, self.run_dir = run_id, root / run_id
            try:
                self.run_dir.mkdir()
            except FileExistsError:
                raise UsageError(f"run directory {self.run_dir} already exists; "
                                 "choose another --run-id or remove it") from None
            except OSError as exc:
                raise _unwritable(root, exc) from None
        while run_id is None:  # two runs started in the same second get different ids
            self.run_id = new_run_id(name)
            self.run_dir = root / self.run_id
            try:
                self.run_dir.mkdir()
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise _unwritable(root, exc) from None
        self.meta: dict[str, Any] = {
            "run_id": self.run_id, "name": name or "", "kind": kind,
            "created": now_iso(), "finished": None, "status": "running",
            # who writes this run: a reader seeing "running" whose owner is gone shows it stale
            # (runformat.is_stale); a killed launcher cannot mark its own run
            "owner": {"pid": os.getpid(), "host": socket.gethostname()},
            "command": command, "config": config, "environment": environment, "jobs": [],
        }
        self._rows: dict[str, list[dict]] = {t: [] for t in runformat.TABLES}
        self._write_meta()

    def _write_meta(self) -> None:
        atomic_write_text(self.run_dir / runformat.RUN_JSON, json.dumps(self.meta, indent=1, default=str))

    def add_job(self, job: dict) -> None:
        """Insert or update (by ``id``) one job entry and rewrite run.json."""
        for i, existing in enumerate(self.meta["jobs"]):
            if existing["id"] == job["id"]:
                self.meta["jobs"][i] = {**existing, **job}
                break
        else:
            self.meta["jobs"].append(job)
        self._write_meta()

    def append_rows(self, table: str, rows: list[dict]) -> None:
        """Add rows to ``<table>.csv`` and rewrite it whole (atomic; runs are small)."""
        path = self.run_dir / runformat.table_file(table)  # ValueError naming the valid tables
        self._rows[table].extend(rows)
        atomic_write_text(path, csv_text(self._rows[table], runformat.TABLES[table]))

    def write_empty_tables(self) -> None:
        """Make every CSV exist (header only) so readers find a complete schema."""
        for table, cols in runformat.TABLES.items():
            path = self.run_dir / runformat.table_file(table)
            if not path.exists():
                atomic_write_text(path, csv_text([], cols))

    def close(self, status: str, why: str = "") -> None:
        """End the run, whatever ended it: a job still ``running``/``pending`` becomes
        ``interrupted`` (Ctrl-C) or ``failed`` (anything else), then :meth:`finish`. A failed
        job left so gets an error that says it never started or was cut off, and by what
        (``why``, e.g. the disk's error): a failed job with no error reads as a dpcore bug."""
        leftover = "interrupted" if status == "interrupted" else "failed"
        cause = f" ({why.strip()})" if why.strip() else ""
        for job in self.meta["jobs"]:
            if job.get("status") in ("running", "pending"):
                if leftover == "failed" and not job.get("error"):
                    job["error"] = ("never started: the run ended before it" if job["status"] == "pending"
                                    else "the run ended while this job ran") + cause
                job["status"] = leftover
        self.finish(status)

    def finish(self, status: str) -> None:
        """Write the final status. On a full disk (the empty tables or the atomic run.json
        cannot be written) run.json is still rewritten, in place, so the run never reads as
        ``running``; the disk's error is raised after that (the CLI reports it, exit 1)."""
        if status not in runformat.RUN_STATUSES:
            raise ValueError(f"bad run status {status!r}; valid: {', '.join(runformat.RUN_STATUSES)}")
        error: OSError | None = None
        try:
            self.write_empty_tables()
        except OSError as exc:
            error = exc
        self.meta["status"] = status
        self.meta["finished"] = now_iso()
        try:
            self._write_meta()
        except OSError as exc:
            self._overwrite_meta()
            error = error or exc
        if error is not None:
            raise error

    def _overwrite_meta(self) -> None:
        """run.json rewritten in place: no temporary file, so it needs no free block beyond
        the file's own (run.json only grows by a few bytes when it ends, within its last
        block). Not atomic, which is why it is only the fallback of a full disk."""
        data = json.dumps(self.meta, indent=1, default=str).encode("utf-8")
        with open(self.run_dir / runformat.RUN_JSON, "r+b") as f:
            f.write(data)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
