"""How much work reading one trace file may take: events, bytes per event, seconds, and the
size of a file handed to the full JSON parse.

Why: run folders and trace folders come from other people. A sparse 2 GiB ``rank0.json.gz``
(``{"traceEvents":[`` then zeros, no disk used) or a 5 MB gzip bomb once kept every reader
(``summarize``, ``analyze``, the dashboard's first page) busy for minutes and took 7 GB. What a
real trace of a given size needs is known: torch.profiler writes ~250 bytes per event, an event
of a few KB at most, ~1M events per rank for a busy GPU step, read at >50 MB/s. The caps below
sit one to two orders of magnitude above that, and anything beyond them is refused with one
:class:`TraceFormatError` line naming the file and the cap (the byte caps themselves are in
:mod:`dpcore.contract.tracefile`). They are module attributes so that tests can lower them.
"""
from __future__ import annotations

import time
from pathlib import Path

from dpcore.contract.tracefile import TraceFormatError

#: Events (entries of the traceEvents array) read from one file: 16M is ~4 GB of JSON at
#: torch's ~250 bytes per event, above the content cap, so a real trace never reaches it; a
#: file of minimal events (~30 bytes each) does, before its events frame outgrows the memory.
MAX_TRACE_EVENTS = 16_000_000
#: Bytes of one entry of the array. Real events are < 10 KB (args of a kernel with many inputs);
#: a file that goes 16 MiB without one complete event (zeros, padding, a truncated tail) is not
#: a trace, and scanning on would widen the window (and the work) without end.
MAX_EVENT_BYTES = 16 << 20
#: Seconds one file may take to read: a 2 GiB trace scans in ~20 s on one loaded core; the
#: bound only ends what the caps above did not foresee.
MAX_READ_SECONDS = 180.0
#: Largest content handed to the full JSON parse (the fallback for layouts the scanner declines):
#: a parse holds ~10 bytes of Python objects per byte of JSON.
MAX_PARSE_BYTES = 512 << 20


class ReadBudget:
    """The work done so far on one file, checked by the scanner after every window."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.events = 0
        self.deadline = time.monotonic() + MAX_READ_SECONDS
        self.max_events, self.max_event_bytes, self.max_seconds = MAX_TRACE_EVENTS, MAX_EVENT_BYTES, MAX_READ_SECONDS

    def add_events(self, n: int) -> None:
        """Count ``n`` more events; refuse the file past max_events."""
        self.events += n
        if self.events > self.max_events:
            raise TraceFormatError(f"trace has more than {self.max_events:,} events (a real rank trace has "
                                   f"at most a few million): not read: {self.path}")

    def pending(self, nbytes: int, offset: int) -> None:
        """Refuse the file when ``nbytes`` have gone by without one complete event."""
        if nbytes > self.max_event_bytes:
            raise TraceFormatError(f"no complete event in {nbytes >> 20} MiB of the traceEvents array from "
                                   f"byte {offset:,} (padding, zeros or a damaged file; real events are a few "
                                   f"KB): not read: {self.path}")

    def tick(self) -> None:
        """Refuse the file once it has taken more than max_seconds."""
        if time.monotonic() > self.deadline:
            raise TraceFormatError(f"trace took more than {self.max_seconds:g} s to read ({self.events:,} "
                                   f"events so far): not read: {self.path}")
