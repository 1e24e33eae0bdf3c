"""Chrome trace files, byte level: the one reader that the writer and the analysis share.

The writer (``dpcore.write.capture.merged_trace``, which re-emits every event of every rank into the merged
trace) needs the events as dicts; the analysis (``dpcore.read.traces.columns``) needs a few
columns of 250k+ events and cannot afford a dict per event. Both start here, so both agree on
what a trace file is and fail the same way on files that are not one:

* :func:`iter_trace_bytes` / :func:`read_trace_bytes`: the file's bytes, in pieces or whole,
  gunzipped when it *is* gzip (by magic number, because a renamed or re-saved trace keeps its
  content, not its suffix);
* :func:`parse_trace`: the whole document (orjson when installed, else the stdlib ``json``;
  both give the same values, integers of 2**64 and more aside: floats with orjson) as
  ``(metadata, traceEvents)``;
* :class:`EventsArrayFinder` / :func:`parse_metadata`: where the ``traceEvents`` array starts,
  and the metadata around it, for readers that scan the array themselves.

Every problem is a :class:`TraceFormatError` whose one-line message names the file. The JSON
Object Format (``{"traceEvents": [...], ...}``) and the JSON Array Format (a bare list of
events) of the Trace Event Format are both accepted. Stdlib (+ optional orjson) only: this
module is imported by the torch side and the pandas side alike.
"""
from __future__ import annotations

import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

try:  # optional speed-up; the stdlib parser gives the same values, but for integers of 2**64 and
    # more, which orjson reads as floats (no torch.profiler field holds one: ids and ns are < 2**63)
    import orjson as _orjson

    loads: Callable[[bytes], Any] = _orjson.loads
    DECODE_ERRORS: tuple[type[BaseException], ...] = (_orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - exercised only without orjson
    import json as _json

    loads = _json.loads
    DECODE_ERRORS = (ValueError, UnicodeDecodeError)

GZIP_MAGIC = b"\x1f\x8b"
CHUNK_BYTES = 4 << 20
#: Largest trace file opened (size on disk). Real rank traces are tens to hundreds of MB (a
#: 1M-event GPU trace is ~250 MB of JSON, ~20 MB gzipped); a file can never need more than the
#: content cap below, so a larger one (a sparse 1 TB file) is refused before it is read.
MAX_TRACE_FILE_BYTES = 2 << 30
#: Largest trace *content* read (after gunzip): ~8M events of ~250 bytes, an events frame of
#: ~0.5 GB; above that a reader would hold more than a shared machine can give one file.
#: Deflate compresses up to ~1000:1, so a few MB on disk can claim terabytes: without this cap
#: a gzip bomb would fill the memory before any check on the file size could help.
MAX_TRACE_JSON_BYTES = 2 << 30
#: Largest inflated/compressed ratio accepted once GZIP_RATIO_FLOOR bytes are out: torch.profiler
#: traces compress 9:1 to 15:1 (measured on every sample trace), a stream of zeros or of one
#: repeated event ~1000:1. So a bomb is refused after 16 MiB, not after the content cap.
MAX_GZIP_RATIO = 200
GZIP_RATIO_FLOOR = 16 << 20
EVENTS_KEY = b'"traceEvents"'
# a JSON string (with escapes) or a bracket: enough to track nesting depth outside strings
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
# the same, and a lone quote where a string does not end in the bytes at hand
_HEAD_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|"', re.DOTALL)
_SPACE = b" \t\r\n"


class TraceFormatError(ValueError):
    """The file is not a readable Chrome trace (missing, empty, truncated, foreign).

    A ValueError, so callers that already treat bad input as ValueError keep working; the
    message is one line that names the file, for the CLI to print as is.
    """


class NotRegularFileError(OSError):
    """A path that is not a regular file of acceptable size (a FIFO, device, socket, folder, or
    a file above the caller's cap); its message names the path."""


def open_regular(path: str | Path, max_bytes: int) -> BinaryIO:
    """Open ``path`` for binary reading only if it is a regular file of at most ``max_bytes``.

    Why: run folders are user-supplied. ``open()`` on a FIFO blocks until a writer appears (the
    dashboard never renders) and ``/dev/zero`` reads forever; so the path is stat'ed first, opened
    with O_NONBLOCK (a FIFO that appeared after the stat does not block the open either) and the
    opened descriptor is checked again. Symlinks are followed: which of them may be trusted is the
    caller's rule (see ``dpcore.read.rundir.load``). Raises FileNotFoundError when missing,
    NotRegularFileError for a special or oversized file, other OSError as the system reports them.
    """
    p = Path(path)
    _check_regular(os.stat(p), p, max_bytes)
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        _check_regular(os.fstat(fd), p, max_bytes)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_regular(st: os.stat_result, p: Path, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"not a regular file (a pipe, device or folder): {p}")
    if st.st_size > max_bytes:
        raise NotRegularFileError(f"file larger than {max_bytes >> 20} MiB ({st.st_size >> 20} MiB): {p}")


def iter_trace_bytes(path: str | Path, chunk: int | None = CHUNK_BYTES,
                     max_json_bytes: int | None = None) -> Iterator[bytes]:
    """The trace's JSON bytes in pieces of ``chunk`` bytes (the last may be shorter; None: one
    piece), gunzipped on the fly when the file starts with the gzip magic number.

    Pieces, so a reader that scans the bytes holds a few MB instead of the whole document.
    Only a regular file of at most MAX_TRACE_FILE_BYTES is opened (:func:`open_regular`); at
    most ``max_json_bytes`` (default MAX_TRACE_JSON_BYTES) of content are read, and a gzip
    stream that inflates more than MAX_GZIP_RATIO:1 is refused (:func:`_gunzip`).
    Raises TraceFormatError for a missing/unreadable/special/oversized file, a corrupt or truncated gzip stream,
    an empty file, and content that cannot be JSON (first character not ``{`` or ``[``).
    """
    p = Path(path)
    try:
        fh = open_regular(p, MAX_TRACE_FILE_BYTES)
    except FileNotFoundError:
        raise TraceFormatError(f"trace file not found: {p}") from None
    except NotRegularFileError as exc:
        raise TraceFormatError(f"cannot read trace: {exc}") from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace {p}: {exc.strerror or exc}") from None
    total, cap = 0, MAX_TRACE_JSON_BYTES if max_json_bytes is None else max_json_bytes
    with fh:
        try:
            magic = fh.read(2)
            pieces = _gunzip(fh, magic, chunk, p, cap) if magic == GZIP_MAGIC else _plain(fh, magic, chunk)
            seen: bytes | None = b""  # the document must start with { or [ (after whitespace)
            for piece in pieces:
                total += len(piece)
                if total > cap:
                    raise _too_big(p, cap)
                if seen is not None:
                    seen += piece
                    head = seen.lstrip(_SPACE)
                    if not head:
                        continue
                    if head[:1] not in (b"{", b"["):
                        raise TraceFormatError(f"not a JSON Chrome trace: {p}")
                    piece, seen = seen, None
                yield piece
        except OSError as exc:
            raise TraceFormatError(f"cannot read trace {p}: {exc.strerror or exc}") from None
    if seen is not None:
        raise TraceFormatError(f"empty trace file: {p}")


def _too_big(p: Path, cap: int) -> TraceFormatError:
    size = f"{cap >> 20} MiB" if cap >= 1 << 20 else f"{cap} bytes"
    return TraceFormatError(f"trace content larger than {size} once "
                            f"decompressed (a gzip bomb, or too large to analyse here): {p}")


def _bomb(p: Path, out: int, read: int) -> TraceFormatError:
    return TraceFormatError(f"gzip trace inflates more than {MAX_GZIP_RATIO}:1 ({read >> 10} KiB to "
                            f"{out >> 20} MiB; real traces compress about 14:1): a gzip bomb, not read: {p}")


def _plain(fh: BinaryIO, first: bytes, chunk: int | None) -> Iterator[bytes]:
    data = first + fh.read(-1 if chunk is None else max(chunk - len(first), 1))
    while data:
        yield data
        data = fh.read(-1 if chunk is None else chunk)


def _gunzip(fh: BinaryIO, first: bytes, chunk: int | None, p: Path, cap: int) -> Iterator[bytes]:
    """Decompress a gzip file (one or more members, like gzip.decompress) into pieces of at
    most ``chunk`` bytes (bounded even for a file that compresses 1000:1): at most ``cap``
    bytes, and no more than MAX_GZIP_RATIO times the bytes read once GZIP_RATIO_FLOOR are out."""
    z, started, data = zlib.decompressobj(31), False, first
    out: list[bytes] = []
    size = total = 0
    read = len(first)
    while True:
        if not data:
            data = fh.read(1 << 16)
            read += len(data)
            if not data:
                break
        try:
            out.append(z.decompress(data, 0 if chunk is None else chunk - size))
        except zlib.error as exc:
            raise TraceFormatError(f"truncated or corrupt gzip trace {p}: {exc}") from None
        started, data, size = True, z.unconsumed_tail, size + len(out[-1])
        total += len(out[-1])
        if total > cap:  # checked per 64 KiB read, before anything piles up
            raise _too_big(p, cap)
        if total > GZIP_RATIO_FLOOR and total > MAX_GZIP_RATIO * read:
            raise _bomb(p, total, read)
        if z.eof:  # a member ends: what follows must be another member
            data, z, started = z.unused_data, zlib.decompressobj(31), False
        if chunk is not None and size >= chunk:
            yield b"".join(out)
            out, size = [], 0
    if started and not z.eof:
        raise TraceFormatError(f"truncated or corrupt gzip trace {p}: stream ends early")
    if out:
        yield b"".join(out)


def read_trace_bytes(path: str | Path, max_json_bytes: int | None = None) -> bytes:
    """The trace's JSON bytes in one piece (see :func:`iter_trace_bytes` for the cap and errors)."""
    return b"".join(iter_trace_bytes(path, chunk=None, max_json_bytes=max_json_bytes))


def parse_trace(buf: bytes, path: str | Path) -> tuple[dict[str, Any], list[Any]]:
    """The whole document: (top-level metadata without ``traceEvents``, the events list).

    One parser call over the whole buffer: simplest, and it yields the exact error (position
    included) for truncated or invalid JSON. Events are returned as parsed; callers decide
    what to do with non-object entries.
    """
    try:
        doc = loads(buf)
    except DECODE_ERRORS as exc:
        raise TraceFormatError(f"truncated or invalid JSON in trace {path}: {exc}") from None
    if isinstance(doc, list):
        return {}, doc
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFormatError(f"not a Chrome trace (no traceEvents list): {path}")
    events = doc.pop("traceEvents")
    return doc, events


def load_trace(path: str | Path, max_json_bytes: int | None = None) -> tuple[dict[str, Any], list[Any]]:
    """:func:`read_trace_bytes` then :func:`parse_trace`: what a reader that wants dicts calls.
    A parse holds ~10 bytes of objects per byte of JSON: callers that may meet hostile files
    pass a ``max_json_bytes`` below MAX_TRACE_JSON_BYTES."""
    return parse_trace(read_trace_bytes(path, max_json_bytes), path)


def _first_nonspace(buf: bytes, start: int = 0) -> int:
    """Index of the first non-whitespace byte at or after ``start`` (len(buf) if none)."""
    n = len(buf)
    while start < n and buf[start] in _SPACE:
        start += 1
    return start


class EventsArrayFinder:
    """Where the ``[`` that opens the document's top-level ``traceEvents`` array is, found in
    bytes that arrive in pieces, each byte tokenised once.

    Why resumable and one pass: the bytes before the array are other people's. A head that
    spells ``"traceEvents"`` 100,000 times (as strings in a list, 39 KB gzipped) made a search
    that re-scanned the head from its start at every occurrence quadratic: minutes for
    ``analyze``. Here the work is bounded by the bytes read: strings and brackets are
    tokenised from where the last call stopped (before a string that was not yet complete),
    and the first top-level ``"traceEvents"`` key decides.

    :meth:`find` returns the index of the ``[`` (for the Array Format, the document's first
    byte), or None: not yet (more bytes may tell) or, once :attr:`done`, never (the first
    top-level ``traceEvents`` is not an array, the document is not an object, or it closed
    without one). The caller then falls back to :func:`parse_trace`, whose verdict (and
    error message) is the reference.
    """

    def __init__(self) -> None:
        self.pos = -1  # next byte to tokenise (-1: the document's first byte not yet seen)
        self.depth = 0
        self.done = False

    def find(self, buf: bytes) -> int | None:
        """The array's ``[`` in ``buf`` (the bytes so far, a prefix of the document), or None."""
        if self.done:
            return None
        if self.pos < 0:
            start = _first_nonspace(buf)
            if start == len(buf):
                return None
            if buf[start:start + 1] == b"[":
                return start
            if buf[start:start + 1] != b"{":
                self.done = True
                return None
            self.pos, self.depth = start + 1, 1
        for m in _HEAD_TOKEN.finditer(buf, self.pos):
            tok = m.group()
            if tok == b'"':  # a string that does not end in these bytes: resume at its quote
                self.pos = m.start()
                return None
            if tok[:1] == b'"':
                if self.depth != 1 or tok != EVENTS_KEY:
                    continue
                colon = _first_nonspace(buf, m.end())
                bracket = _first_nonspace(buf, colon + 1) if buf[colon:colon + 1] == b":" else colon
                if bracket == len(buf):  # the bytes end before the key's value: resume at the key
                    self.pos = m.start()
                    return None
                if buf[colon:colon + 1] == b":":  # the first top-level key decides
                    self.done = True
                    return bracket if buf[bracket:bracket + 1] == b"[" else None
                continue  # a string value, not a key
            self.depth += 1 if tok in (b"{", b"[") else -1
            if self.depth == 0:  # the document closed without the array
                self.done = True
                return None
        self.pos = len(buf)
        return None


def find_events_array(buf: bytes) -> int | None:
    """Index of the ``[`` that opens the document's top-level ``traceEvents`` array in ``buf``,
    None when there is none (see :class:`EventsArrayFinder`, which also takes bytes in pieces)."""
    return EventsArrayFinder().find(buf)


def _is_key_at_top(tail: bytes, key: bytes) -> bool:
    """Whether ``key`` is a key of the top-level object in ``tail`` (the bytes after the events
    array, which is itself inside that object)."""
    depth = 1
    for m in _TOKEN.finditer(tail):
        tok = m.group()
        if tok[:1] != b'"':
            depth += 1 if tok in (b"{", b"[") else -1
        elif depth == 1 and tok == key:
            colon = _first_nonspace(tail, m.end())
            if tail[colon:colon + 1] == b":":
                return True
    return False


def parse_metadata(head: bytes, tail: bytes) -> dict[str, Any] | None:
    """The document's metadata, from the bytes before its ``traceEvents`` array's ``[`` and
    after its ``]`` (small: the array is the bulk of the file).

    Parses the document with the array emptied. None when that is not a JSON object with
    exactly that one ``traceEvents`` key, or, for the Array Format, when anything but
    whitespace follows the array: the caller then falls back to :func:`parse_trace`, whose
    verdict (and error message) is the reference.
    """
    if not head.strip(_SPACE):  # Array Format: the document is the array
        return {} if not tail.strip(_SPACE) else None
    if EVENTS_KEY in tail and _is_key_at_top(tail, EVENTS_KEY):  # a second one would win
        return None
    # The array's stand-in is unguessable: a later key spelt with escapes ("trace\u0045vents")
    # that the byte search above cannot see would win in the parse and replace it.
    token = os.urandom(8).hex()
    try:
        doc = loads(head + b'["' + token.encode() + b'"]' + tail)
    except DECODE_ERRORS:
        return None
    if not isinstance(doc, dict) or doc.pop("traceEvents", None) != [token]:
        return None
    return doc


# What the fields of a complete ('X') event mean to dpcore: the reference semantics, which
# every reader applies to the parsed JSON values (the columnar reader to each distinct value).
#: Categories of events that run on a device stream (``args.stream`` is read for these only),
#: with the names older kineto wrote before torch 1.10 (``Kernel``, ``Memcpy``, ``Memset``).
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_driver_kernel",
                         "Kernel", "Memcpy", "Memset"})
X_FIELDS = ("ts", "dur", "name", "cat", "pid", "tid", "corr", "stream")


def as_time(v: Any, path: str | Path) -> float:
    """``ts``/``dur`` (µs): any number, or text Python reads as one; anything else is an error."""
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        raise TraceFormatError(f"event time {v!r} is not a number in trace {path}") from None


def as_text(v: Any) -> str:
    """``name``/``cat``: strings as they are, other values as Python prints them."""
    return v if isinstance(v, str) else str(v)


def as_ident(v: Any) -> Any:
    """``pid``/``tid``: ints, strings and floats as they are (1 and 1.0 are one thread, as in a
    dict); other values as Python prints them."""
    return v if isinstance(v, (int, str, float)) else str(v)


def as_id(v: Any) -> int:
    """``args.correlation``/``args.stream``: int() of the value if it fits int64, else -1."""
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):
        return -1
    return i if -(1 << 63) <= i < (1 << 63) else -1


def x_event_fields(events: list[Any], path: str | Path) -> dict[str, list[Any]]:
    """The X_FIELDS of every complete event (an object with ``"ph": "X"``), in file order.

    Absent fields: ts/dur 0.0, name/cat "", pid/tid -1, corr/stream -1; ``args`` that is not an
    object counts as absent; ``stream`` is read for device categories (DEVICE_CATS) only.
    """
    out: dict[str, list[Any]] = {f: [] for f in X_FIELDS}
    for e in events:
        if type(e) is not dict or e.get("ph") != "X":
            continue
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        cat = as_text(e.get("cat", ""))
        out["ts"].append(as_time(e.get("ts", 0.0), path))
        out["dur"].append(as_time(e.get("dur", 0.0), path))
        out["name"].append(as_text(e.get("name", "")))
        out["cat"].append(cat)
        out["pid"].append(as_ident(e.get("pid", -1)))
        out["tid"].append(as_ident(e.get("tid", -1)))
        out["corr"].append(as_id(args.get("correlation")))
        out["stream"].append(as_id(args.get("stream")) if cat in DEVICE_CATS else -1)
    return out
