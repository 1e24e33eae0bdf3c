"""Low-memory Chrome trace parsing: trace file -> columnar arrays, no per-event objects kept.

Why: a 250k-event torch.profiler trace is ~60 MB of JSON but ~400 MB as Python dicts. We parse
the ``traceEvents`` array in ~4 MB batches (orjson when installed, else the stdlib ``json``),
pull the few fields we need into compact arrays (names/categories/threads as integer codes into
small tables), and drop each batch before parsing the next. Nothing in the file is executed.

Batch boundaries are guessed at ``}, {`` separators and *validated* by parsing: a prefix of the
array that starts at a top-level boundary parses only if the cut is also at top level (a cut
inside a nested object or a string leaves it unbalanced), so a bad guess costs one retry.
"""
from __future__ import annotations

import gzip
import re
from array import array
from pathlib import Path
from typing import Any, Callable

try:  # optional speed-up; the stdlib parser gives the same result
    import orjson as _orjson

    _loads: Callable[[bytes], Any] = _orjson.loads
    _DecodeError: tuple[type[BaseException], ...] = (_orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - exercised only without orjson
    import json as _json

    _loads = _json.loads
    _DecodeError = (ValueError, UnicodeDecodeError)

BATCH_BYTES = 4 << 20
_MAX_RETRIES = 16
_SEP = re.compile(rb"\}\s*,\s*\{")
_END = re.compile(rb"\}\s*\]")
_KEY = b'"traceEvents"'
_NONSPACE = re.compile(rb"\S")
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_driver_kernel"})


class TraceFormatError(ValueError):
    """The file is not a readable Chrome trace (missing, truncated, foreign)."""


class Columns:
    """Columnar accumulator; string-like fields are interned into code tables.

    ``add_batch`` runs once per field over a batch (C-level ``map``/``dict`` calls, no per-event
    Python function calls), because at ~1M events per trace directory per-event helper calls
    cost more than the JSON parse itself. Odd value types (a string ``ts``, a list ``pid``, a
    non-dict ``args``) send the batch to ``_add_generic``, which defines the semantics.
    """

    def __init__(self) -> None:
        self.ts, self.dur = array("d"), array("d")
        self.stream, self.corr = array("q"), array("q")
        self.tables: dict[str, dict[Any, int]] = {k: {} for k in ("name", "cat", "pid", "tid")}
        self.codes: dict[str, array] = {k: array("i") for k in self.tables}
        self.n_other = 0

    def _code(self, field: str, values: list[Any]) -> None:
        """Intern values: new ones get the next code in order of first appearance."""
        table = self.tables[field]
        self.codes[field].extend([table.setdefault(v, len(table)) for v in values])

    def add_batch(self, batch: list[Any]) -> None:
        """Append the complete ('X') events of one parsed batch; other events are only counted."""
        xs = [e for e in batch if type(e) is dict and e.get("ph") == "X"]
        self.n_other += len(batch) - len(xs)
        try:
            cols = self._fast_columns(xs)
        except (TypeError, AttributeError):  # an odd value type somewhere in the batch
            self._add_generic(xs)
            return
        for arr, new in zip((self.ts, self.dur, self.stream, self.corr, *self.codes.values()), cols):
            arr.extend(new)

    def _fast_columns(self, xs: list[dict[Any, Any]]) -> tuple[array, ...]:
        """New columns of a batch of well-typed events (same values as ``_add_generic``).

        Raises TypeError/AttributeError on any value ``_add_generic`` would convert; tables gain
        only entries that ``_add_generic`` would add in the same order, so a retry there is exact.
        """
        ts = array("d", [e.get("ts", 0.0) for e in xs])  # ints convert as float() does; str/None raise
        dur = array("d", [e.get("dur", 0.0) for e in xs])
        cats = [e.get("cat", "") for e in xs]
        codes = {"name": _intern(self.tables["name"], [e.get("name", "") for e in xs], str),
                 "cat": _intern(self.tables["cat"], cats, str),
                 "pid": _intern(self.tables["pid"], [e.get("pid", -1) for e in xs], (int, str, float)),
                 "tid": _intern(self.tables["tid"], [e.get("tid", -1) for e in xs], (int, str, float))}
        args = [e.get("args") or _NO_ARGS for e in xs]
        corr_v = [a.get("correlation", -1) for a in args]  # AttributeError if args is not an object
        dev = set(cats) & _DEVICE_CATS
        stream_v = [a.get("stream", -1) if c in dev else -1 for a, c in zip(args, cats)] if dev else [-1] * len(xs)
        try:
            corr, stream = array("q", corr_v), array("q", stream_v)
        except TypeError:  # null, float or string ids: convert one by one like _add_generic
            corr, stream = array("q", map(_int, corr_v)), array("q", map(_int, stream_v))
        return (ts, dur, stream, corr, *(codes[k] for k in self.codes))

    def _add_generic(self, xs: list[dict[Any, Any]]) -> None:
        """Per-event conversions for batches with unusual value types (the reference semantics)."""
        self.ts.extend([float(e.get("ts", 0.0)) for e in xs])
        self.dur.extend([float(e.get("dur", 0.0)) for e in xs])
        cats = [e.get("cat", "") for e in xs]
        self._code("name", [n if isinstance(n, str) else str(n) for n in (e.get("name", "") for e in xs)])
        self._code("cat", [c if isinstance(c, str) else str(c) for c in cats])
        self._code("pid", [_hashable(e.get("pid", -1)) for e in xs])
        self._code("tid", [_hashable(e.get("tid", -1)) for e in xs])
        args = [e.get("args") or {} for e in xs]
        self.stream.extend([_int(a.get("stream")) if c in _DEVICE_CATS else -1 for a, c in zip(args, cats)])
        self.corr.extend([_int(a.get("correlation")) for a in args])


_NO_ARGS: dict[str, Any] = {}


def _intern(table: dict[Any, int], values: list[Any], ok: type | tuple[type, ...]) -> array:
    """Codes of values in table, new values appended in order of first appearance.

    Checks only the batch's distinct values (a value ``_add_generic`` would convert with str()
    is None or unhashable, never equal to an accepted one); raises TypeError before touching
    table if one is not of type ``ok``.
    """
    distinct = dict.fromkeys(values)
    if not all(isinstance(v, ok) for v in distinct):
        raise TypeError("value needs conversion")
    for v in distinct:
        if v not in table:
            table[v] = len(table)
    return array("i", map(table.__getitem__, values))


def _hashable(v: Any) -> Any:
    return v if isinstance(v, (int, str, float)) else str(v)


def _int(v: Any) -> int:
    if type(v) is int:
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def read_bytes(path: Path) -> bytes:
    """File bytes, gunzipped when the file is gzip (by magic number, not by name)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TraceFormatError(f"truncated or corrupt gzip trace {path}: {exc}") from None
    return raw


def _parse_all(buf: bytes, path: Path, cols: Columns) -> tuple[dict[str, Any], Columns]:
    """Fallback: parse the whole document at once (odd layouts, or to report the exact error)."""
    try:
        doc = _loads(buf)
    except _DecodeError as exc:
        raise TraceFormatError(f"truncated or invalid JSON in trace {path}: {exc}") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFormatError(f"not a Chrome trace (no traceEvents list): {path}")
    events = doc.pop("traceEvents")
    cols.add_batch(events)
    return doc, cols


def _try(buf: bytes, lo: int, hi: int) -> list[Any] | None:
    try:
        out = _loads(b"[" + buf[lo:hi] + b"]")
    except _DecodeError:
        return None
    return out if isinstance(out, list) else None


def parse_trace(path: Path, batch_bytes: int = BATCH_BYTES) -> tuple[dict[str, Any], Columns]:
    """Parse one Chrome trace into (top-level metadata without traceEvents, Columns)."""
    buf = read_bytes(path)
    cols = Columns()
    head = buf[:64].lstrip()
    if not head:
        raise TraceFormatError(f"empty trace file: {path}")
    if head[:1] not in (b"{", b"["):
        raise TraceFormatError(f"not a JSON Chrome trace: {path}")
    key = buf.find(_KEY)
    if key < 0:
        return _parse_all(buf, path, cols)
    colon = buf.find(b"[", key + len(_KEY))
    if colon < 0 or buf[key + len(_KEY):colon].strip() not in (b":", b""):
        return _parse_all(buf, path, cols)
    pos, n = colon + 1, len(buf)
    while True:
        nxt = _NONSPACE.search(buf, pos)
        if nxt is None:
            raise TraceFormatError(f"truncated trace (traceEvents never closed): {path}")
        if buf[nxt.start():nxt.start() + 1] == b"]":
            end = nxt.start()
            break
        batch, cut = None, -1
        start = min(pos + batch_bytes, n)
        for i, m in enumerate(_SEP.finditer(buf, start)):
            if i >= _MAX_RETRIES:
                break
            batch = _try(buf, pos, m.start() + 1)
            if batch is not None:
                cut = m.end() - 1  # at the next '{'
                break
        if batch is None:  # last batch: find the array's closing bracket
            for i, m in enumerate(_END.finditer(buf, pos)):
                if i >= _MAX_RETRIES:
                    break
                batch = _try(buf, pos, m.start() + 1)
                if batch is not None:
                    cut = m.end() - 1  # at the ']'
                    break
        if batch is None:
            return _parse_all(buf, path, Columns())
        cols.add_batch(batch)
        del batch
        pos = cut
    try:
        meta = _loads(buf[:colon] + b"[]" + buf[end + 1:])
    except _DecodeError as exc:
        raise TraceFormatError(f"truncated or invalid JSON in trace {path}: {exc}") from None
    if not isinstance(meta, dict):
        raise TraceFormatError(f"not a Chrome trace: {path}")
    meta.pop("traceEvents", None)
    return meta, cols
