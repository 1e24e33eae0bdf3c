"""Chrome trace -> columns of its complete ('X') events, without a Python object per event.

Why: a 250k-event torch.profiler trace is ~45 MB of JSON; a JSON parser turns it into ~2M
Python objects (~0.6 s with orjson, more to free), of which the analysis keeps 8 fields (and
the collective metadata of a few events: bytescan.META_KEYS). So the bytes that
:mod:`dpcore.contract.tracefile` read are scanned with numpy instead, a few MB at a time
(simdjson's structural index, vectorised): quotes are marked (escaped ones dropped), a prefix
xor gives the string interiors, the structural characters outside strings get a nesting depth,
keys are told apart by the 8 bytes that end them (and the bytes before, for keys that share
those; a key that holds a backslash is decoded, since JSON lets ``"t\\u0073"`` spell ``"ts"``),
and each needed value is read from its byte span: numbers at once (plain decimals, such as every
trace time, by integer arithmetic on the text's 8-byte words, N / 10**k, which is bit for bit
numpy's correctly rounded cast; the rest by that cast: ``bytescan.decimals``), strings
and ids by decoding only the distinct spans. The values are those of a full JSON parse
(``x_event_fields`` and :func:`meta_event_fields`, the references the tests compare with);
anything the scanner does not expect (entries that are not objects, duplicate keys,
truncation, ...) hands the file to that full parse, and so does any window of the array that
the full parse's own parser finds invalid (``bytescan._validate``): the scan reads exactly the
files the full parse reads (tests/read/traces/test_fuzz_parsers.py).

Why not pyarrow's C++ JSON reader (``pyarrow.json.read_json`` with an explicit schema, unknown
fields ignored, on the events array with its top-level commas blanked so that the entries are
whitespace-separated objects): on one rank of ``benchmarks.bench_trace_load`` (266k 'X' events,
48 MB of JSON) its parse alone, before gunzip, the blanking copy and the codes, took about as
long as this whole scan (medians of 5 interleaved, one thread: 1.19 s vs 1.26 s on a loaded
2-core machine; 0.98 s vs 0.96 s for the whole prototype on another run), and its threads only
help when cores are idle, which the rank workers already use.

Why not DuckDB's JSON reader (yyjson; ``read_json`` with the traceEvents array typed as a list
of STRUCTs, unnested, the 'X' rows fetched to numpy and factorised into the same codes): it gave
the same values on that rank, but a trace is one JSON document, so DuckDB parses it as one object
in one thread and builds a document tree of every value before the typed columns. On that rank,
gunzip included in both, one DuckDB thread (2.0.1), medians of 3: its parse alone
(``read_json_objects``) 0.44-0.50 s, the typed columns 0.75 s, fetched 0.88 s, against 0.96 s
(median of 5) for this whole scan; with the codes, medians of 5 interleaved in one process:
1.73 s against 1.64 s on a loaded machine. No win, and a dependency of ~70 MB installed.
Decompression is ~10 % of the scan (zlib: ~0.11 s of ~1 s); python-isal's igzip takes 0.07 s,
~5 % of a rank, which does not pay for a dependency either. Nor msgspec (typed Structs, unknown
fields skipped): its gunzip and decode alone took 1.03-1.16 s against 1.25-1.37 s for this scan.

Why no native code: a C loop written for this one array once read a rank ~3x faster than this
scan, but it was compiled with the system C compiler at run time, into a per-user cache, on a
trace's first read: a first read that waited on a compiler, speed that depended on whether one
happened to be installed, a third parser of other people's bytes (built without hardening flags)
that had to agree with the other two, and a compiler driver with its own expiry and pruning
rules. ``pip install`` is all a profiler's user expects; with the numpy scan alone dpcore's
first read of ``benchmarks.bench_trace_load`` took about a tenth of Holistic Trace Analysis's
time (0.097x, medians of 3 interleaved, loaded 2-core machine).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dpcore.contract.tracefile import as_id, as_text, load_trace, x_event_fields
from dpcore.read.traces import limits
from dpcore.read.traces.bytescan import META_KEYS, META_TEXT, WINDOW_BYTES, Columns, OddTrace, Scanner

__all__ = ["Columns", "WINDOW_BYTES", "columns_from_events", "meta_event_fields", "read_columns"]


def meta_event_fields(events: list[Any]) -> dict[str, list[Any]]:
    """The collective metadata (bytescan.META_KEYS) of every complete event, in file order, by the
    conventions of ``x_event_fields``: text as ``name`` ("" when absent), numbers as
    ``correlation`` (int() of the value if it fits int64, else -1); args that is not an object
    counts as absent."""
    out: dict[str, list[Any]] = {f: [] for f, _ in META_KEYS}
    for e in events:
        if type(e) is not dict or e.get("ph") != "X":
            continue
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        for f, key in META_KEYS:
            k = key[1:-1].decode()
            if f in META_TEXT:
                out[f].append(as_text(args[k]) if k in args else "")
            else:
                out[f].append(as_id(args.get(k)))
    return out


def columns_from_events(events: list[Any], path: str | Path) -> Columns:
    """Columns from parsed events (the reference; used for the files the scanner declines)."""
    out = {**x_event_fields(events, path), **meta_event_fields(events)}
    codes, tables = {}, {}
    for f in ("name", "cat", "pid", "tid", *META_TEXT):
        table: dict[Any, int] = {}
        codes[f] = np.asarray([table.setdefault(v, len(table)) for v in out[f]], dtype=np.int32)
        tables[f] = list(table)
    return Columns(np.asarray(out["ts"], np.float64), np.asarray(out["dur"], np.float64),
                   np.asarray(out["corr"], np.int64), np.asarray(out["stream"], np.int64), codes, tables,
                   {f: np.asarray(out[f], np.int64) for f, _ in META_KEYS if f not in META_TEXT})


def read_columns(path: str | Path, window: int = WINDOW_BYTES) -> tuple[dict[str, Any], Columns]:
    """(top-level metadata, Columns) of one trace file; TraceFormatError naming the file if bad.

    The file is scanned as it is decompressed, a window of about ``window`` bytes at a time,
    within :mod:`dpcore.read.traces.limits`' budget (events, bytes per event, seconds); a file
    the scanner declines is read again and parsed whole if its content is at most
    ``limits.MAX_PARSE_BYTES``.
    """
    try:
        found = Scanner(path).run(window)
    except OddTrace:
        found = None
    if found is None:
        meta, events = load_trace(path, max_json_bytes=limits.MAX_PARSE_BYTES)
        return meta, columns_from_events(events, path)
    return found


