"""Fuzz: the numpy scan and the full JSON parse agree on every damaged real trace.

dpcore reads a trace's bytes with two parsers: the numpy structural scan
(:class:`~dpcore.read.traces.bytescan.Scanner`), and for what it declines the full parse
(``load_trace`` then ``columns_from_events``, the reference). They must agree on what is valid:
where the scan gives columns, the full parse gives the same columns (bit for bit) and the same
metadata; where the scan refuses a file (TraceFormatError), the full parse refuses it too. A
scan that declines (None, OddTrace) is always fine: the full parse then decides.

The cases are real traces (tests/data, and /work/shared/traces where present) damaged the ways
other people's files are: bit flips, truncations, deep nesting, duplicate keys, keys spelt with
escapes (``"trace\\u0045vents"``), a repeated ``traceEvents`` key, a head that spells
``"traceEvents"`` 100,000 times. A fixed seed and a bounded count: the same cases every run.
No assertion on speed beyond a per-case bound far above a healthy read (seconds): it turns a
hang into a failure.
"""
from __future__ import annotations

import gzip
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpcore.contract.tracefile import EventsArrayFinder, TraceFormatError, find_events_array, load_trace
from dpcore.read.traces import limits
from dpcore.read.traces.bytescan import FIELDS, Columns, OddTrace, Scanner
from dpcore.read.traces.columns import columns_from_events, read_columns

DATA = Path(__file__).resolve().parents[2] / "data"
SHARED = Path("/work/shared/traces")
SEED = 20261201
#: Per-case bound: a healthy read of these few-hundred-KB cases takes well under a second even
#: on a loaded 2-core machine; a regression to quadratic work takes minutes.
CASE_SECONDS = 60.0
#: Events kept from a large trace (its first ones, re-serialised): cases stay small and fast.
SAMPLE_EVENTS = 300
RAW_MAX_BYTES = 256 << 10


def _seeds() -> list[tuple[str, bytes]]:
    """(name, JSON bytes) of each seed trace: the file's own bytes when small, else its metadata
    and first events written again with ``json.dumps`` (some seeds gzip-free, some kept as is)."""
    files = sorted(DATA.glob("*.json.gz")) + sorted(DATA.glob("*/*.json.gz"))
    if SHARED.is_dir():
        files += sorted(f for f in SHARED.rglob("*.json*") if f.is_file() and f.stat().st_size < 8 << 20)
    out = []
    for f in files:
        raw = gzip.decompress(f.read_bytes()) if f.read_bytes()[:2] == b"\x1f\x8b" else f.read_bytes()
        if len(raw) > RAW_MAX_BYTES:
            meta, events = load_trace(f)
            xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
            keep = events[:SAMPLE_EVENTS // 2] + [e for e in xs if e.get("args")][:SAMPLE_EVENTS // 2]
            raw = json.dumps({**meta, "traceEvents": keep}).encode()
        out.append((f.name, raw))
    return out


def _flip(rng: random.Random, b: bytes) -> bytes:
    out = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _structural_flip(rng: random.Random, b: bytes) -> bytes:
    """One byte replaced by a JSON structural or string character: the damage a parser must see."""
    i = rng.randrange(len(b))
    return b[:i] + bytes([rng.choice(b'{}[]:,"\\ 0-e.')]) + b[i + 1:]


def _truncate(rng: random.Random, b: bytes) -> bytes:
    return b[:rng.randrange(len(b))]


def _nest(rng: random.Random, b: bytes) -> bytes:
    """A deeply nested value in an event's args (or at the top, or unbalanced)."""
    depth = rng.choice([50, 500, 5000, 200_000])
    nested = b"[" * depth + b"1" + b"]" * (depth - rng.choice([0, 0, 1]))
    at = b.find(b'"args"')
    if at < 0 or rng.random() < 0.3:
        return b[:1] + b'"deep": ' + nested + b", " + b[1:]
    colon = b.find(b":", at) + 1
    return b[:colon] + b'{"deep": ' + nested + b', "x": ' + b[colon:] + b"}"


def _duplicate_key(rng: random.Random, b: bytes) -> bytes:
    """One key of an event written twice, the first with another value (the last one wins)."""
    key = rng.choice([b'"ts"', b'"dur"', b'"ph"', b'"name"', b'"cat"', b'"pid"', b'"args"', b'"correlation"',
                      b'"stream"'])
    hits = [i for i in range(len(b)) if b.startswith(key, i)][:200]
    if not hits:
        return b
    i = rng.choice(hits)
    colon = b.find(b":", i + len(key))
    other = rng.choice([b'7', b'"X"', b'"i"', b'{}', b'null', b'"kernel"', b'-1.5e3'])
    return b[:i] + key + b": " + other + b", " + b[i:colon] + b[colon:]


def _escape_key(rng: random.Random, b: bytes) -> bytes:
    """A key spelt with a JSON escape: the same key to a parser."""
    key, esc = rng.choice([(b'"traceEvents"', b'"trace\\u0045vents"'), (b'"ts"', b'"t\\u0073"'),
                           (b'"ph"', b'"\\u0070h"'), (b'"dur"', b'"du\\u0072"'), (b'"args"', b'"arg\\u0073"'),
                           (b'"name"', b'"n\\u0061me"'), (b'"correlation"', b'"correlatio\\u006e"')])
    hits = [i for i in range(len(b)) if b.startswith(key, i)][:200]
    if not hits:
        return b
    i = rng.choice(hits)
    return b[:i] + esc + b[i + len(key):]


def _repeat_events(rng: random.Random, b: bytes) -> bytes:
    """A second ``traceEvents`` key, before or after the first (the last one wins)."""
    other = rng.choice([b"[]", b'[{"ph": "X", "ts": 1, "dur": 2, "name": "late"}]', b"0", b'"x"'])
    if b.lstrip()[:1] != b"{":
        return b
    if rng.random() < 0.5:
        return b[:b.find(b"{") + 1] + b'"traceEvents": ' + other + b", " + b[b.find(b"{") + 1:]
    end = b.rfind(b"}")
    return b[:end] + b', "traceEvents": ' + other + b[end:]


def _many_events_keys(rng: random.Random, b: bytes) -> bytes:
    """A head that spells ``"traceEvents"`` 100,000 times (as strings, keys or nested keys)."""
    unit = rng.choice([b'"traceEvents",', b'"traceEvents" ,', b'{"traceEvents":[]},'])
    start = b.find(b"{")
    if start < 0:
        return b
    return b[:start + 1] + b'"head": [' + unit * 100_000 + b'1], ' + b[start + 1:]


MUTATIONS = [_flip, _flip, _structural_flip, _structural_flip, _truncate, _nest, _duplicate_key,
             _escape_key, _escape_key, _repeat_events, _many_events_keys]


def _scan(path: Path, window: int) -> tuple[str, Any]:
    """('ok', (meta, Columns)), ('declined', None) or ('refused', message) of the numpy scan."""
    try:
        found = Scanner(path).run(window)
    except OddTrace:
        return "declined", None
    except TraceFormatError as exc:
        return "refused", str(exc)
    return ("declined", None) if found is None else ("ok", found)


def _full(path: Path) -> tuple[str, Any]:
    """('ok', (meta, Columns)) or ('refused', message) of the full parse, the reference."""
    try:
        meta, events = load_trace(path, max_json_bytes=limits.MAX_PARSE_BYTES)
        return "ok", (meta, columns_from_events(events, path))
    except TraceFormatError as exc:
        return "refused", str(exc)


def _same_columns(a: Columns, b: Columns) -> None:
    for f in ("ts", "dur", "corr", "stream"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f  # bit for bit (-0.0, NaN)
    assert a.tables.keys() == b.tables.keys()
    for f in a.tables:
        assert a.tables[f] == b.tables[f] and [type(v) for v in a.tables[f]] == [type(v) for v in b.tables[f]], f
        assert np.array_equal(a.codes[f], b.codes[f]), f
    assert a.nums.keys() == b.nums.keys() and all(np.array_equal(a.nums[f], b.nums[f]) for f in a.nums)


def _cases() -> list[tuple[str, str, bytes]]:
    rng = random.Random(SEED)
    cases = []
    for name, raw in _seeds():
        for _ in range(8):
            mutate = rng.choice(MUTATIONS)
            cases.append((name, mutate.__name__, mutate(rng, raw)))
    return cases


def test_fields_cover_the_reference() -> None:
    """The comparison below covers every field the scan keeps."""
    assert set(FIELDS) >= {"ts", "dur", "name", "cat", "pid", "tid", "corr", "stream"}


def test_numpy_scan_and_full_parse_agree_on_damaged_real_traces(tmp_path: Path) -> None:
    cases = _cases()
    assert len(cases) >= 80  # the seed traces were found
    rng = random.Random(SEED + 1)
    counts: dict[str, int] = {}
    for k, (name, how, data) in enumerate(cases):
        path = tmp_path / f"case{k}.json"
        path.write_bytes(gzip.compress(data, 1) if k % 3 == 0 else data)
        window = rng.choice([64, 4096, 2 << 20])
        t0 = time.monotonic()
        got, want = _scan(path, window), _full(path)
        took = time.monotonic() - t0
        where = f"{name} {how} (case {k}, window {window})"
        assert took < CASE_SECONDS, f"{where}: {took:.0f} s"
        counts[got[0]] = counts.get(got[0], 0) + 1
        if got[0] == "ok":
            assert want[0] == "ok", f"{where}: the scan read a file the full parse refuses: {want[1]}"
            assert got[1][0] == want[1][0], where
            _same_columns(got[1][1], want[1][1])
        elif got[0] == "refused":
            assert want[0] == "refused", f"{where}: the scan refused a file the full parse reads: {got[1]}"
        # the reader as a whole (scan, then the full parse for what it declines) is the reference
        try:
            whole: tuple[str, Any] = ("ok", read_columns(path, window))
        except TraceFormatError as exc:
            whole = ("refused", str(exc))
        assert whole[0] == want[0], f"{where}: read_columns {whole[0]}, full parse {want[0]}"
        if whole[0] == "ok":
            assert whole[1][0] == want[1][0], where
            _same_columns(whole[1][1], want[1][1])
    assert counts.get("ok", 0) >= 10, counts  # damage that leaves valid JSON is read by the scan


@pytest.mark.parametrize("unit", [b'"traceEvents",', b'"traceEvents" ,', b'{"traceEvents":[1]},',
                                  b'"traceEvents\\"x",'])
def test_head_repeating_the_events_key_reads_in_bounded_work(tmp_path: Path, unit: bytes) -> None:
    """100,000 ``"traceEvents"`` before the real array (39 KB gzipped for some spellings): once
    quadratic (every occurrence re-scanned the head from its start: minutes), now one pass."""
    event = {"ph": "X", "name": "k", "cat": "kernel", "ts": 1.5, "dur": 2, "pid": 1, "tid": 1,
             "args": {"stream": 7, "correlation": 3}}
    doc = b'{"head": [' + unit * 100_000 + b'1], "traceEvents": ' + json.dumps([event]).encode() + b"}"
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(doc))
    t0 = time.monotonic()
    meta, cols = read_columns(path)
    assert time.monotonic() - t0 < CASE_SECONDS
    assert cols.ts.tolist() == [1.5] and cols.dur.tolist() == [2.0] and cols.stream.tolist() == [7]
    assert cols.corr.tolist() == [3] and cols.tables["name"] == ["k"] and len(meta["head"]) == 100_001


def test_events_array_found_alike_in_pieces() -> None:
    """Fed a document piece by piece (cut anywhere: in strings, escapes, between key and
    value), the finder gives the index a whole-document search gives."""
    docs = [b'{"a": "x\\"traceEvents\\"", "b": {"traceEvents": [1]}, "traceEvents" : [ {}]}',
            b'  [{"ph": "X"}]', b'{"traceEvents": 0, "traceEvents": []}', b'{"x": ["traceEvents", 1]}',
            b'{"trace\\u0045vents": [], "traceEvents":\n[]}', b'{"a": "\\\\", "traceEvents": []}']
    want = [docs[0].rindex(b"[ {}]"), 2, None, None, docs[4].rindex(b"[]"), docs[5].rindex(b"[]")]
    assert [find_events_array(d) for d in docs] == want
    for doc, w in zip(docs, want):
        for cut in range(1, len(doc)):
            finder = EventsArrayFinder()
            first = finder.find(doc[:cut])
            got = first if first is not None or finder.done else finder.find(doc)
            assert got == w, (doc, cut)


_EV = b'{"ph": "X", "ts": 1.5, "dur": 2, "name": "k", "args": {"stream": 7}}'
#: Entries whose validity only a parser that checks every byte can see: the scan reads none of
#: the broken values (``a`` is no key it keeps). Each once valid, then broken.
_VALID = [b'{"ph": "X", "ts": 1, "a": [1, -2.5e3, true, null, {"b": []}], "s": "\\\\ \\" \\u00e9"}',
          '{"ph": "X", "ts": 1, "name": "é€ 😀", "a": "\\ud83d\\ude00"}'.encode(), b'{"ph": "X", "ts": -0, "a": 1E+5}']
_BROKEN = [b'"a": 1 2', b'"a": 01', b'"a": tru', b'"a" 1', b'"a": [1,]', b'"a": {"b": 1,}', b'"a": 1.2.3',
           b'"a": 1e5.3', b'"a": 1"x"2', b'"a": "x\\q"', b'"a": "x\\ud800"', b'"a": [1}', b'"a": {1: 2}',
           b'"a": "\xff"', b'"a": "\x01"', b'"a": 1e400', b'"a": -', b'"a": .5', b'"a": "x""y"', b'"a": true false',
           b'"a": nulll', b'"a": 1,, "b": 2', b'"a": {"b": 1]', b'"a": [' * 70 + b']' * 70]


@pytest.mark.parametrize("window", [64, 300, 2 << 20])
@pytest.mark.parametrize("entry", _VALID + [b'{"ph": "X", "ts": 1, ' + b + b"}" for b in _BROKEN])
def test_scan_reads_exactly_what_the_full_parse_reads(tmp_path: Path, entry: bytes, window: int) -> None:
    """The scan reads a file where the full parse does (same columns), and declines or refuses
    it where the full parse refuses it, whichever window the broken entry falls in."""
    doc = b'{"traceEvents": [\n' + b",\n".join([_EV] * 30 + [entry] + [_EV] * 30) + b"\n], \"x\": 1}"
    path = tmp_path / "rank0.json"
    path.write_bytes(doc)
    got, want = _scan(path, window), _full(path)
    assert want[0] == ("ok" if entry in _VALID else "refused"), want
    if want[0] == "ok":
        assert got[0] == "ok", got
        assert got[1][0] == want[1][0]
        _same_columns(got[1][1], want[1][1])
    else:
        assert got[0] in ("declined", "refused"), got
        with pytest.raises(TraceFormatError, match="invalid JSON|not a number"):
            read_columns(path, window)
