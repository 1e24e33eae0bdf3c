"""Progress reporting for long commands: a terminal bar per job, or JSON lines.

``--progress json`` prints one JSON object per line on stdout (events ``run_start``,
``job_start``, ``step``, ``job_end``, ``run_end``) so the dashboard can follow a run it started
without scraping a progress bar. ``bar`` draws a tqdm bar per job on stderr (stdout stays
clean for tables). The modes' names are :data:`dpcore.contract.config.PROGRESS_MODES`.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any


class Progress:
    def __init__(self, mode: str = "bar", jobs_total: int = 0) -> None:
        self.mode = mode
        self.jobs_total = jobs_total
        self.job_index = 0
        self._bar: Any = None
        self._job_id = ""
        self._steps_total = 0
        self._steps_note = ""

    def emit(self, event: str, **fields: Any) -> None:
        if self.mode == "json":
            try:
                print(json.dumps({"event": event, **fields}, default=str), flush=True)
            except BrokenPipeError:
                self.reader_gone()

    def reader_gone(self) -> None:
        """Whoever read the progress (``| head``, a closed dashboard) is gone: stop printing
        it and let the run go on. Its jobs are measurements on disk; failing them because
        nobody watches would lose them (they ended ``failed``, and the CLI exited 0)."""
        self.mode = "none"
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        print("note: stdout was closed (broken pipe); progress is no longer printed, the run "
              "goes on", file=sys.stderr)

    def run_start(self, run_dir: str) -> None:
        self.emit("run_start", run_dir=run_dir, jobs_total=self.jobs_total)

    def job_start(self, job_id: str, steps_total: int, steps_note: str = "") -> None:
        """``steps_note`` says what the steps are ("3 warm-up + 6 timed + 4 under the profiler"),
        so that a count above ``--steps`` reads right."""
        self.job_index += 1
        self._job_id, self._steps_total, self._steps_note = job_id, steps_total, steps_note
        self.emit("job_start", job_id=job_id, job_index=self.job_index,
                  jobs_total=self.jobs_total, steps_total=steps_total, steps_note=steps_note)
        if self.mode == "bar":
            from tqdm import tqdm
            self._bar = tqdm(total=steps_total, unit="step", leave=True, file=sys.stderr,
                             desc=f"[{self.job_index}/{self.jobs_total}] {job_id}", ncols=90)

    def step(self, event: dict) -> None:
        """Called with the worker's ``{"step": i}`` events (rank 0 reports them)."""
        done = int(event.get("done", 0))
        self.emit("step", job_id=self._job_id, job_index=self.job_index,
                  jobs_total=self.jobs_total, step=done, steps_total=self._steps_total,
                  steps_note=self._steps_note, phase=event.get("phase", ""))
        if self._bar is not None:
            self._bar.n = min(done, self._steps_total)
            self._bar.set_postfix_str(event.get("phase", ""), refresh=False)
            self._bar.refresh()

    def job_end(self, job_id: str, status: str, error: str = "") -> None:
        self.emit("job_end", job_id=job_id, job_index=self.job_index,
                  jobs_total=self.jobs_total, status=status, error=error)
        if self._bar is not None:
            if status == "complete":
                self._bar.n = self._steps_total
            self._bar.set_postfix_str(status)
            self._bar.close()
            self._bar = None

    def run_end(self, run_dir: str, status: str) -> None:
        self.emit("run_end", run_dir=run_dir, status=status)
