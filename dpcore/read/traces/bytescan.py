"""The numpy structural scanner behind :func:`dpcore.read.traces.columns.read_columns`.

Why a module of its own: it is the one intricate piece of trace reading (simdjson's structural
index, vectorised with numpy), and it is easier to review and test apart from the small API
around it. See columns.py's docstring for the method; every value it produces equals a full
JSON parse's (``x_event_fields``), and anything unexpected raises :class:`OddTrace` so the caller
falls back to that parse.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpcore.contract.tracefile import (
    DECODE_ERRORS,
    DEVICE_CATS,
    X_FIELDS,
    EventsArrayFinder,
    TraceFormatError,
    as_id,
    as_ident,
    as_text,
    as_time,
    iter_trace_bytes,
    loads,
    parse_metadata,
)
from dpcore.read.traces.limits import ReadBudget

WINDOW_BYTES = 2 << 20  # cache-sized, and the work arrays stay small
_EVENT_KEYS = (b'"ph"', b'"ts"', b'"dur"', b'"name"', b'"cat"', b'"pid"', b'"tid"', b'"args"')
#: The collective's metadata that torch.profiler (2.1+) writes into the ``args`` of its
#: ``record_param_comms`` ranges and of NCCL kernels: (field, key). Text fields are read like
#: ``name`` ("" when absent), the others like ``correlation`` (int, -1 when absent or not a number).
#: With ``record_shapes=True`` every CPU op also carries its inputs' shapes and types (``Input Dims``,
#: ``Input type``; kept as text, as Python prints the lists): what a matrix product's FLOPs are
#: computed from (:mod:`dpcore.read.traces.matmuls`); ``Concrete Inputs`` (the scalar arguments, where
#: the profiler writes them) says whether an attention call was causal.
META_KEYS = (("coll", b'"Collective name"'), ("in_nelems", b'"In msg nelems"'),
             ("out_nelems", b'"Out msg nelems"'), ("dtype", b'"dtype"'), ("group_size", b'"Group size"'),
             ("in_dims", b'"Input Dims"'), ("in_types", b'"Input type"'), ("in_concrete", b'"Concrete Inputs"'))
META_FIELDS = tuple(f for f, _ in META_KEYS)
META_TEXT = ("coll", "dtype", "in_dims", "in_types", "in_concrete")
_ARG_KEYS = (b'"correlation"', b'"stream"') + tuple(k for _, k in META_KEYS)
#: Every field the scan keeps: X_FIELDS (= _EVENT_KEYS[1:7] + the first two _ARG_KEYS), then META_FIELDS.
FIELDS = X_FIELDS + META_FIELDS
_DELTA = np.zeros(256, np.int8)
_DELTA[list(b"{[")], _DELTA[list(b"}]")] = 1, -1
_TEXT: dict[str, tuple[Callable[[Any], Any], Any]] = {"name": (as_text, ""), "cat": (as_text, ""),
                                                     "pid": (as_ident, -1), "tid": (as_ident, -1),
                                                     **{f: (as_text, "") for f in META_TEXT}}
_ENTRY = np.frombuffer(b",{}", np.uint8)  # the array's tokens: a comma, then an object
_SPACES = np.uint64(0x2020202020202020)
_LOW_BYTES = np.asarray([(1 << 8 * k) - 1 for k in range(8)] + [(1 << 64) - 1], np.uint64)
_MIX = np.asarray([0xC2B2AE3D27D4EB4F] + [0x9E3779B97F4A7C15 + 2 * j for j in range(64)], np.uint64)


class OddTrace(Exception):
    """The scanner met a layout it does not handle: use the full parse."""


@dataclass
class Columns:
    """The 'X' events of one trace: parallel arrays, strings/ids as codes into ``tables``.

    ``tables[f]`` lists the distinct values of field f in order of first appearance (what the
    events frame's categories are built from); ts/dur in µs as in the file; corr/stream -1
    when absent (see ``x_event_fields`` for every convention). The collective metadata
    (META_KEYS): ``coll`` and ``dtype`` in codes/tables like ``name``, the element counts and
    group size in ``nums`` (-1 when absent).
    """

    ts: np.ndarray
    dur: np.ndarray
    corr: np.ndarray
    stream: np.ndarray
    codes: dict[str, np.ndarray]
    tables: dict[str, list[Any]]
    nums: dict[str, np.ndarray] = field(default_factory=dict)


def _leads(keys: tuple[bytes, ...]) -> list[int]:
    """For each key, the first key that ends with the same 8 bytes (itself if none does): keys
    that share their last 8 bytes (``"In msg nelems"``, ``"Out msg nelems"``) are told apart by
    the bytes before. A key of 8 bytes or fewer shares its ending with no other key."""
    tails = [k[-8:] for k in keys]
    leads = [tails.index(t) for t in tails]
    assert all(len(keys[j]) > 8 for j, lead in enumerate(leads) if tails.count(tails[j]) > 1), keys
    return leads


def _key_index(word: int, keys: tuple[bytes, ...]) -> int:
    """Which of ``keys`` the 8 bytes that end a key (little-endian ``word``) end with: -1 for
    none, -2 if they do not end with a quote (spaces before the colon)."""
    tail = word.to_bytes(8, "little")
    if tail[-1:] != b'"':
        return -2
    return next((j for j, k in enumerate(keys) if tail.endswith(k[-8:])), -1)


class Scanner:
    """Structural scan of one ``traceEvents`` array, window by window.

    The file's bytes arrive in pieces as they are decompressed; a window is the unfinished
    event of the previous one plus the next piece, so it starts outside any string at a known
    depth. Its whole events are reduced to their 'X' events' values while the bytes are in
    cache: a value is first a byte span [start, end) (end -1: absent; the whitespace around the
    value included, which every conversion ignores), then a number, or for strings and ids the
    index of its span's text among the distinct texts seen so far (decoded once, at the end).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.parts: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}  # per window
        self.raw: dict[str, dict[bytes, int]] = {f: {} for f in _TEXT}  # distinct spans, in order
        self.escapes = False  # whether the current window has a backslash
        self.quotes = self.slashes = np.zeros(0, np.int64)  # their positions in such a window
        self.d_arr = 2  # depth inside the array
        self.work, self.window = np.empty((3, 0), np.uint8), WINDOW_BYTES
        self.entries = 0  # entries of the array in the last window

    def _scratch(self, n: int) -> tuple[np.ndarray, ...]:
        """Three work arrays of n bytes (uint8, bool, bool), kept between windows."""
        if self.work.shape[1] < n:
            self.work = np.empty((3, max(n, self.window + (self.window >> 2))), np.uint8)
        return self.work[0, :n], self.work[1, :n].view(bool), self.work[2, :n].view(bool)

    def _use(self, buf: bytes) -> None:
        """Make ``buf`` (the current window) the bytes that positions refer to."""
        self.buf, self.a = buf, np.frombuffer(buf, np.uint8)
        self.word = np.ndarray((max(len(buf) - 7, 0),), "<u8", buffer=buf, strides=(1,))  # 8 bytes at i
        self.aligned = np.frombuffer(buf, "<u8", count=len(buf) // 8)

    def at(self, i: np.ndarray) -> np.ndarray:
        """The 8 bytes at each offset i as a little-endian uint64, from two aligned reads
        (numpy's unaligned gather is ~2x slower)."""
        base, a = i >> 3, self.aligned
        if not a.flags.aligned or not len(a) or int(base.max(initial=0)) + 1 >= len(a):
            return self.word[i]
        off = ((i & 7) << 3).view(np.uint64)
        w = a.take(base)  # take: ~2x faster than fancy indexing here
        w >>= off
        hi = a.take(base + 1)
        hi <<= np.uint64(63) - off
        hi <<= np.uint64(1)  # in two steps: a shift by 64 is not 0 on x86
        w |= hi
        return w

    def run(self, window: int) -> tuple[dict[str, Any], Columns] | None:
        """Scan the file; None when its traceEvents array is not found near its start."""
        pieces, self.window = iter_trace_bytes(self.path, window), window
        buf, start, finder = b"", None, EventsArrayFinder()
        piece: bytes | None
        for piece in pieces:  # the array's "[" is in the first piece, but for huge metadata
            buf += piece
            start = finder.find(buf)
            if start is not None or finder.done or len(buf) > 16 * window:
                break
        if start is None:
            return None
        head, self.d_arr = buf[:start], 1 if not buf[:start].strip() else 2
        pos, first, budget, offset = start + 1, True, ReadBudget(self.path), 0
        while True:
            self._use(buf)
            nxt, done = self._window(pos, first)
            budget.add_events(self.entries)
            budget.tick()
            if done:
                meta = parse_metadata(head, buf[nxt + 1:] + b"".join(pieces))
                return None if meta is None else (meta, self.columns())
            piece = next(pieces, None)
            if piece is None:
                raise OddTrace  # cut short: the full parse reports it
            if nxt >= 0:  # keep the unfinished event, start the next window with it
                offset += nxt
                buf, pos, first = buf[nxt:] + piece, 0, False
            else:  # not one whole event in the window: widen it (up to the budget's event size)
                budget.pending(len(buf) - pos, offset + pos)
                buf += piece

    def _window(self, w0: int, first: bool) -> tuple[int, bool]:
        """Keep the values of the whole events in buf[w0:]. Returns (where the next window
        starts: just after the last whole event, -1 if none, False) or (the array's
        closing bracket, True)."""
        seg = self.a[w0:]
        low, mark, tmp = self._scratch(len(seg))  # reused: no fresh pages per window
        quote = np.equal(seg, 34, out=tmp)
        self.escapes = self.buf.find(b"\\", w0) >= 0
        if self.escapes:  # the quotes and backslashes, for keys written with escapes (_keys)
            self.slashes = _drop_escaped(quote, seg) + w0
            self.quotes = np.flatnonzero(quote) + w0
        inside = in_strings(quote)
        np.bitwise_or(seg, 0x20, out=low)
        np.equal(low, 0x7B, out=mark)  # { [
        mark |= np.equal(low, 0x7D, out=tmp)  # } ]
        mark |= np.equal(seg, 0x3A, out=tmp)
        mark |= np.equal(seg, 0x2C, out=tmp)
        np.greater(mark, inside, out=mark)  # and not inside a string
        p = np.flatnonzero(mark)
        ch = seg.take(p)
        p += w0
        dl = _DELTA.take(ch)
        depth = np.cumsum(dl, dtype=np.int32)
        depth += self.d_arr
        left = np.flatnonzero(depth < self.d_arr)  # the array's closing bracket
        stop = int(left[0]) if left.size else len(ch)
        if left.size and ch[stop] != 93:
            raise OddTrace
        item = np.flatnonzero((depth[:stop] - (dl[:stop] > 0)) == self.d_arr)  # the array's own tokens
        seq = ch[item]
        if first:  # as if a comma came before the first entry: every entry is then ",{}"
            seq, item = np.concatenate((_ENTRY[:1], seq)), np.concatenate(([-1], item))
        k = self.entries = len(seq) // 3
        if not (seq[:3 * k].reshape(k, 3) == _ENTRY).all():
            raise OddTrace  # an entry that is not an object, or not JSON
        rest = seq[3 * k:].tobytes()
        if rest not in ((b"", b"," if first and k == 0 else b"") if left.size else (b"", b",", b",{")):
            raise OddTrace
        nt = stop + 1 if left.size else (int(item[3 * k - 1]) + 1 if k else 0)
        if nt:  # the bytes of the whole entries (and the closing bracket): valid JSON, or the full parse decides
            if int(depth[:nt].max()) > self.d_arr + MAX_DEPTH:
                raise OddTrace
            _validate(self.buf, w0, int(p[nt - 1]) + 1, first, bool(left.size))
        if k:
            last = int(item[3 * k - 1]) + 1
            self._events(p[:last], ch[:last], dl[:last], depth[:last], item[1:3 * k:3])
        if left.size:
            return int(p[stop]), True
        return (int(p[item[3 * k - 1]]) + 1 if k else -1), False

    def _events(self, p: np.ndarray, ch: np.ndarray, dl: np.ndarray, depth: np.ndarray,
                opens: np.ndarray) -> None:
        """Keep the values of the 'X' events among the window's whole events (see the class)."""
        nev, d_ev = len(opens), self.d_arr + 1
        evid = np.zeros(len(ch), np.int64)
        evid[opens] = 1
        evid = np.cumsum(evid)
        evid -= 1
        colon = ch == 58
        keys = self._keys(np.flatnonzero(colon & (depth == d_ev)), _EVENT_KEYS, p, evid, nev)
        xe = np.flatnonzero(self._equal(*self._spans(keys[:, 0], p, dl, depth), "X"))
        # keys of args: colons one level down, inside an object that is the value of "args"
        nested = np.cumsum((dl > 0) & (depth == d_ev + 1), dtype=np.int32)
        is_args = np.zeros(int(nested[-1]) + 1, bool)
        value = keys[:, 7][keys[:, 7] >= 0] + 1
        is_args[nested[value[ch[value] == 123]]] = True
        ac = np.flatnonzero(colon & (depth == d_ev + 1))
        args = self._keys(ac[is_args[nested[ac]]], _ARG_KEYS, p, evid, nev)
        for f, t in zip(FIELDS, [*keys[xe, 1:7].T, *args[xe].T]):  # converted while in cache
            self.parts[f].append(self._values(f, t, p, dl, depth))

    def _values(self, f: str, t: np.ndarray, p: np.ndarray, dl: np.ndarray, depth: np.ndarray) -> np.ndarray:
        """Field ``f`` of each event whose key's colon is at token index t (-1: absent). Only the
        present values are read: most events lack most args (the collective metadata, shapes)."""
        rows = np.flatnonzero(t >= 0)
        vs, ve = self._spans(t if rows.size == t.size else t.take(rows), p, dl, depth)
        if f in _TEXT:
            return self._raw_ids(f, vs, ve, rows, t.size)
        is_float = f in ("ts", "dur")
        got = self._numbers(vs, ve, np.float64 if is_float else np.int64, repeats=f in ("dur", "stream", "group_size"))
        if rows.size == t.size:
            return got
        out = np.zeros(t.size, np.float64) if is_float else np.full(t.size, -1, np.int64)
        out[rows] = got
        return out

    def _keys(self, kc: np.ndarray, keys: tuple[bytes, ...], p: np.ndarray, evid: np.ndarray,
              nev: int) -> np.ndarray:
        """Token index of each key's colon among the colons ``kc``: (event, key) -> index or -1.

        The 8 bytes that end a key take few distinct values; each is decided once.
        """
        nk = len(keys)
        e = p.take(kc)
        e -= 1  # the key's closing quote
        word = self.at(np.maximum(e - 7, 0))
        for i in np.flatnonzero(e < 7):  # keys in the first bytes of the file
            word[i] = int.from_bytes(bytes(7 - int(e[i])) + self.buf[:int(e[i]) + 1], "little")
        codes, uniq = pd.factorize(word)
        lut = [_key_index(int(u), keys) for u in uniq]
        if -2 in lut:
            raise OddTrace  # spaces between a key and its colon: rare enough for the full parse
        tail = np.asarray([nk if k == -1 else k for k in lut] + [nk], np.int64).take(codes)  # nk: other keys
        kid, leads = tail.copy(), _leads(keys)
        for j, key in enumerate(keys):  # a group's first key comes first: it clears the group's hits
            hit = np.flatnonzero(tail == leads[j]) if len(key) > 8 or self.escapes else ()
            if not len(hit):
                continue
            ok = np.ones(len(hit), bool)
            at = e[hit] - len(key) + 1  # the opening quote
            ok &= at >= 0
            for c in range(0, len(key) - 8, 8):  # check the bytes before the last 8, 8 at a time
                chunk = key[c:min(c + 8, len(key) - 8)]
                got = self.at(np.maximum(at + c, 0)) & _LOW_BYTES[len(chunk)]
                ok &= got == np.uint64(int.from_bytes(chunk, "little"))
            if self.escapes:  # a backslash before the opening quote: a longer key
                ok &= self.a[np.maximum(at - 1, 0)] != 92
            if leads[j] == j:
                kid[hit] = nk
            kid[hit[ok]] = j
        if self.escapes:
            self._escaped_keys(kid, e, keys)
        cell = evid.take(kc)
        cell *= nk + 1
        cell += kid
        out = np.full(nev * (nk + 1), -1, np.int64)
        out[cell] = kc
        ours = kid < nk  # (other keys share one cell per event)
        if not (out.take(cell.compress(ours)) == kc.compress(ours)).all():
            raise OddTrace  # a duplicate key (two colons, one cell): the last one wins in a JSON parser
        return out.reshape(nev, nk + 1)[:, :nk]

    def _escaped_keys(self, kid: np.ndarray, e: np.ndarray, keys: tuple[bytes, ...]) -> None:
        """Set ``kid`` of the keys (closing quotes at ``e``) that hold a backslash to the key they
        decode to: JSON lets a key be spelt with escapes (``"t\\u0073"`` is ``"ts"``), which
        the bytes that end it do not tell. Only windows with a backslash get here, and only
        keys with one are decoded (each distinct spelling once)."""
        opening = self.quotes.take(np.searchsorted(self.quotes, e) - 1)
        odd = np.flatnonzero(np.searchsorted(self.slashes, e) > np.searchsorted(self.slashes, opening))
        if not odd.size:
            return
        known = {loads(k): j for j, k in enumerate(keys)}
        found: dict[bytes, int] = {}
        for i, s, t in zip(odd.tolist(), opening.take(odd).tolist(), e.take(odd).tolist()):
            raw = self.buf[s:t + 1]
            if raw not in found:
                found[raw] = known.get(self._decode(raw), len(keys))
            kid[i] = found[raw]

    def _spans(self, t: np.ndarray, p: np.ndarray, dl: np.ndarray, depth: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Byte spans [vs, ve) of the values after the colons at token indices t; ve = -1 (and
        any vs) where t = -1 (absent)."""
        vt = t + 1
        vs = p.take(t)
        vs += 1
        ve = p.take(vt)  # a scalar ends at the next structural character
        np.putmask(ve, t < 0, -1)
        nest = dl.take(vt) > 0
        if nest.any():
            nest &= t >= 0
            for dv in np.unique(depth[vt[nest]]):  # an object/array value ends at its closing bracket
                closes = np.flatnonzero((dl < 0) & (depth == dv - 1))
                sel = np.flatnonzero(nest & (depth[vt] == dv))
                ve[sel] = p[closes[np.searchsorted(closes, vt[sel])]] + 1
        return vs, ve

    def _decode(self, raw: bytes) -> Any:
        try:
            return loads(raw)
        except DECODE_ERRORS:
            raise TraceFormatError(f"invalid JSON value {raw[:60]!r} in trace {self.path}") from None

    def _equal(self, vs: np.ndarray, ve: np.ndarray, value: Any) -> np.ndarray:
        """Whether each span's JSON value equals ``value``."""
        codes, first = self._distinct(vs, ve)
        hit = [ve[i] >= 0 and self._decode(self.buf[vs[i]:ve[i]]) == value for i in first.tolist()]
        return np.asarray(hit + [False], bool).take(codes)

    def columns(self) -> Columns:
        """The kept values; strings and ids: each distinct span decoded and converted once."""
        cols: dict[str, np.ndarray] = {f: np.concatenate(v) if v else np.zeros(0, np.int32 if f in _TEXT else
                                                         np.float64 if f in ("ts", "dur") else np.int64)
                for f, v in self.parts.items()}
        codes, tables = {}, {}
        for f, (conv, default) in _TEXT.items():
            table: dict[Any, int] = {}
            remap = np.asarray([table.setdefault(conv(self._decode(raw)) if raw else default, len(table))
                                for raw in self.raw[f]] + [0], np.int32)
            # distinct texts that are distinct values (the rule): the ids are the codes already
            codes[f] = cols[f] if len(table) == len(self.raw[f]) else remap.take(cols[f])
            tables[f] = list(table)
        cols["stream"][~np.asarray([c in DEVICE_CATS for c in tables["cat"]] + [False], bool).take(codes["cat"])] = -1
        return Columns(cols["ts"], cols["dur"], cols["corr"], cols["stream"], codes, tables,
                       {f: cols[f] for f in META_FIELDS if f not in _TEXT})

    def _raw_ids(self, f: str, vs: np.ndarray, ve: np.ndarray, rows: np.ndarray, size: int) -> np.ndarray:
        """Ids of the byte strings of ``size`` events among the field's distinct ones: the spans
        are those of the events ``rows`` (ascending), the other events lack the field (b"").
        Found by :meth:`_distinct` in the window, then by a dict of the window's few distinct,
        which takes them in order of first appearance (b"" where the first event without the
        field is)."""
        codes, first = self._distinct(vs, ve)
        seen, buf = self.raw[f], self.buf
        raws = [buf[s:e] if e >= 0 else b"" for s, e in zip(vs.take(first).tolist(), ve.take(first).tolist())]
        gap = -1
        if rows.size < size:  # the first event without the field: where rows first skips one
            skip = np.flatnonzero(rows != np.arange(rows.size))
            gap = int(np.searchsorted(rows.take(first), skip[0] if skip.size else rows.size))
            raws.insert(gap, b"")
        ids = [seen.setdefault(r, len(seen)) for r in raws]
        if gap < 0:
            return np.asarray(ids, np.int32).take(codes)
        out = np.full(size, ids.pop(gap), np.int32)
        out[rows] = np.asarray(ids, np.int32).take(codes)
        return out

    def _numbers(self, vs: np.ndarray, ve: np.ndarray, dtype: type, repeats: bool) -> np.ndarray:
        """Values of number spans: the short ones at once by :func:`decimals` (their text,
        right-aligned after spaces, read as numpy's cast reads it: like Python's float(),
        correctly rounded), the others (long, strings, null, ...) one by one with the reference
        conversion. ``repeats``: the values repeat (durations, streams): read each distinct text once."""
        is_float = dtype is np.float64
        out: np.ndarray = np.zeros(len(vs), dtype) if is_float else np.full(len(vs), -1, dtype)
        n = ve - vs  # ints: at most 15 characters, so at most 15 digits: exact as a float64
        fast = np.flatnonzero((ve >= 0) & (n <= (24 if is_float else 15)))
        words = (int(n.take(fast).max(initial=1)) + 7) // 8
        fast = fast.compress(ve.take(fast) >= 8 * words)
        text: np.ndarray = np.empty((len(fast), words), "<u8")  # little-endian: its bytes are the text
        for j in range(words):  # word j holds bytes ve-8(words-j) .. ve-8(words-j)+7
            keep = ~_LOW_BYTES.take(8 - np.clip(n.take(fast) - 8 * (words - 1 - j), 0, 8))
            text[:, j] = (self.at(ve.take(fast) - 8 * (words - j)) & keep) | (_SPACES & ~keep)
        inv, uniq = pd.factorize(text[:, 0]) if repeats and words == 1 else (None, text)
        text = text.view(f"S{8 * words}").ravel()
        try:
            val = decimals(np.ascontiguousarray(uniq, "<u8").reshape(len(uniq), words))
        except ValueError:  # a string, null, ...: this window's numbers one by one
            fast, val, inv = fast[:0], np.zeros(0), None
        val = val if inv is None else val.take(inv)
        if is_float:  # "-0" is the integer 0 in JSON, so +0.0; "-0.0" stays -0.0
            z = np.flatnonzero((val == 0) & np.signbit(val))
            val[z[[not any(c in t for c in b".eE") for t in text.take(z).tolist()]]] = 0.0
            out[fast] = val
        else:  # int() of the number
            good = np.isfinite(val) & (np.abs(val) < 2.0 ** 63)
            out[fast[good]] = np.trunc(val[good]).astype(np.int64)
        slow = ve >= 0
        slow[fast] = False
        conv: Callable[[Any], Any] = (lambda v: as_time(v, self.path)) if is_float else as_id
        for i in np.flatnonzero(slow).tolist():
            out[i] = conv(self._decode(self.buf[vs[i]:ve[i]]))
        return out

    def _distinct(self, vs: np.ndarray, ve: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First-appearance codes of the byte strings at the spans, and each code's first index.

        Each string is read as 8-byte words (the last one ending where the string ends), hashed
        with position-dependent multipliers and factorised by hash; then every string is
        compared word by word with its code's first string, so a hash collision cannot merge
        two strings (it sends the file to the full parse instead). A string of up to 8 bytes is
        its own key: one word and its length.
        """
        n = ve - vs
        np.putmask(n, ve < 0, 0)
        if ((ve < 8) & (n > 0)).any():
            raise OddTrace  # no value of ours ends in a window's first 8 bytes
        top = int(n.max(initial=0))
        if top <= 8:  # one word holds the string: word and length are an exact key
            w = self.at(ve - 8) >> ((64 - 8 * n) & 63).astype(np.uint64)
            np.putmask(w, n == 0, 0)
            if top == 8 and (((w >> np.uint64(56)) - np.uint64(1) < 7) & (n == 8)).any():
                raise OddTrace  # a control character ends an 8-byte string: not JSON
            key = np.where(n < 8, w | (n.astype(np.uint64) << np.uint64(56)), w)
            codes, uniq = pd.factorize(key)
            first = np.empty(len(uniq), np.int64)
            first[codes[::-1]] = np.arange(len(n) - 1, -1, -1)
            return codes.astype(np.int32), first
        nw = (n + 7) >> 3  # 8-byte words per string, the last one ending where the string ends
        start = np.cumsum(nw) - nw
        k = np.arange(int(nw.sum())) - np.repeat(start, nw)
        last = (start + nw - 1)[nw > 0]
        shift = np.zeros(len(k), np.uint64)
        shift[last] = (8 * (8 - (n - 8 * (nw - 1)))[nw > 0]).astype(np.uint64)

        at = np.repeat(vs, nw) + 8 * k
        at[last] = ve.compress(nw > 0) - 8
        w = self.at(at) >> shift
        h = n.astype(np.uint64) * _MIX[0]
        has = np.flatnonzero(nw > 0)
        h[has] += np.add.reduceat(w * _MIX[1:].take(np.minimum(k, len(_MIX) - 2)), start[has])
        h ^= h >> np.uint64(29)
        codes, uniq = pd.factorize(h)
        first = np.empty(len(uniq), np.int64)
        first[codes[::-1]] = np.arange(len(n) - 1, -1, -1)
        rep = first.take(codes)
        # each string's words against its code's first string's (the same count once the lengths match)
        if not (n.take(rep) == n).all() or not (w.take(np.repeat(start.take(rep), nw) + k) == w).all():
            raise OddTrace  # a hash collision
        return codes.astype(np.int32), first


#: Nesting below the events array beyond which the full parse decides (real traces: ~4 levels).
#: Why a bound: :func:`_validate` parses a window as an array of its own, one level shallower
#: than in the document, so a value nested just at orjson's limit (1024) would pass there alone.
MAX_DEPTH = 64


def _validate(buf: bytes, w0: int, end: int, first: bool, last: bool) -> None:
    """Raise OddTrace unless buf[w0:end] (a window's whole entries of the events array, after
    its "[" when ``first``, else after an entry's "}"; ending with the array's "]" when ``last``)
    is valid JSON there.

    Why: the scan reads only the values it keeps, so a file the full parse refuses (a flipped bit
    in a value no one reads, a missing colon) would otherwise be read by the scan alone: two
    parsers with two ideas of a valid trace. So the window is parsed by the full parse's own
    parser (:func:`~dpcore.contract.tracefile.loads`) as an array left open at its end: a valid
    window fails only there ("unexpected end of data"), any fault fails before. orjson checks
    the whole input before it builds any object, so a window that fails at its end costs its
    check alone: about a tenth of the scan (measured on a rank of benchmarks.bench_trace_load:
    0.8 s of 8 s on a loaded machine), against about as much as the scan itself for the same
    checks in numpy. A window that fails is not refused here: the full parse decides, and says
    why. (Without orjson, the stdlib parser gives the same verdicts, slower.)
    """
    body = buf[w0:end - 1] if last else buf[w0:end]  # without the array's "]": left open
    if not first:
        body = body.lstrip(b" \t\r\n")
        if not body and last:  # only the array's "]" was left
            return
        if body[:1] != b",":
            raise OddTrace
        body = body[1:]
    doc = b"[" + body
    try:
        loads(doc)
    except DECODE_ERRORS as exc:
        text = getattr(exc, "doc", "")  # the document as text ("" when it is not UTF-8)
        if text and getattr(exc, "pos", -1) == len(text):  # its end (in characters): all before is valid
            return
    raise OddTrace


def decimals(text: np.ndarray) -> np.ndarray:
    """The float64 values of number texts, exactly as numpy's cast of the text reads them.

    ``text``: (m, words) little-endian uint64, each row a JSON value's text (valid JSON: the
    window was checked by :func:`_validate`) right-aligned after spaces. Why not the cast alone:
    numpy reads text to float a character at a time, about a fifth of a scan. Rows of spaces,
    digits and at most one "." that end with a digit, with at most 17 characters and a value N
    (the digits, the dot removed) of at most 2**53 (every trace time: torch writes µs with up to
    3 decimals, ~1.7e15) are read by arithmetic on whole words instead: each byte is classed by
    SWAR tests, each word's 8 digits become a number by three multiply-shift steps (their low
    nibbles; a space's is 0, the dot's is zeroed), which reads the text with the dot as a 0
    digit, G; then N = G // 10**(k+1) * 10**k + G % 10**k for k digits after the dot, and the
    value N / 10**k. That is bit for bit the correctly rounded value the cast gives: N and 10**k
    are exact doubles and IEEE division rounds their exact quotient correctly. Other rows (signs,
    exponents, longer numbers, whitespace after the value, strings, ...) go to the cast, which
    raises ValueError for text that is not a number, as before.
    """
    m, words = text.shape
    ok = np.ones(m, bool)
    digits, at, hasdot = [], np.zeros(m, np.int64), np.zeros(m, np.int64)
    for j in range(words):
        w = text[:, j]
        nondigit = _bytes_above(w ^ _B30, 9)
        nonspace = _bytes_above(w ^ _B20, 0)
        nondot = _bytes_above(w ^ _B2E, 0)
        ok &= (nondigit & nonspace & nondot) == 0
        dot = nondot ^ _B80  # the high bit of the "." bytes
        ones = np.bitwise_count(dot).astype(np.int64)
        hasdot += ones
        # the dot's byte i: its high bit is bit 8i + 7, so 8i + 7 bits below it are set in dot - 1
        at += np.where(ones > 0, 8 * j + (np.bitwise_count(dot - np.uint64(1)).astype(np.int64) - 7) // 8, 0)
        digits.append(_eight_digits(w & _B0F & ~((dot >> np.uint64(7)) * np.uint64(0x0F))))
    ok &= _bytes_above((text[:, -1] >> np.uint64(56)) ^ np.uint64(0x30), 9) == 0  # ends with a digit
    ok &= hasdot <= 1
    if words == 3:  # 17 characters at most: the first word's first 7 bytes are spaces
        ok &= (text[:, 0] & np.uint64(0x00FFFFFFFFFFFFFF)) == np.uint64(0x0020202020202020)
    g = digits[-1]
    if words > 1:
        g = g + digits[-2] * np.uint64(10 ** 8)
    if words > 2:
        g += digits[-3] * np.uint64(10 ** 16)
    k = np.where(hasdot == 1, 8 * words - 1 - at, 0)  # digits after the dot
    p = _POW10I.take(np.minimum(k, 19))
    n = np.where(hasdot == 1, g // (p * np.uint64(10)) * p + g % p, g)
    ok &= n <= np.uint64(1 << 53)
    out = n.astype(np.float64)
    out /= _POW10.take(np.minimum(k, 22))
    if not ok.all():
        bad = np.flatnonzero(~ok)
        out[bad] = np.ascontiguousarray(text[bad]).view(f"S{8 * words}").astype(np.float64).ravel()
    return out


_B0F, _B20, _B2E, _B30, _B7F, _B80 = (np.uint64(0x0101010101010101 * c) for c in (0x0F, 0x20, 0x2E, 0x30, 0x7F, 0x80))
_POW10 = 10.0 ** np.arange(23)  # exact doubles up to 1e22
_POW10I = np.asarray([10 ** i for i in range(20)], np.uint64)


def _bytes_above(x: np.ndarray, limit: int) -> np.ndarray:
    """The high bit of each byte of ``x`` that is above ``limit`` (< 128), the other bits 0."""
    return (((x & _B7F) + np.uint64(0x0101010101010101 * (127 - limit))) | x) & _B80


def _eight_digits(w: np.ndarray) -> np.ndarray:
    """The number that 8 digit values (one per byte, the first in the low byte) spell."""
    w = (w * np.uint64(10) + (w >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    w = (w * np.uint64(100) + (w >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    return (w * np.uint64(10000) + (w >> np.uint64(32))) & np.uint64(0xFFFFFFFF)


def in_strings(quote: np.ndarray) -> np.ndarray:
    """Whether each byte is inside a string (or its opening quote): the parity of the quotes up
    to it, a prefix xor. Computed 64 bytes per uint64 word (a prefix xor within each word by
    six shifts, then each word flipped by the parity of the words before it): ~3x faster than
    ``np.bitwise_xor.accumulate`` over the bytes, which numpy does not vectorise."""
    n = len(quote)
    w = np.zeros((n + 63) // 64, "<u8")
    bits = np.packbits(quote, bitorder="little")
    w.view(np.uint8)[:bits.size] = bits
    for s in (1, 2, 4, 8, 16, 32):
        w ^= w << np.uint64(s)
    carry = np.bitwise_xor.accumulate(w >> np.uint64(63))  # parity of the words up to each
    w[1:] ^= carry[:-1] * np.uint64(0xFFFFFFFFFFFFFFFF)
    return np.unpackbits(w.view(np.uint8), count=n, bitorder="little").view(bool)


def _drop_escaped(quote: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Unmark quotes escaped by a backslash (those after an odd run of backslashes); returns
    the backslashes' positions."""
    bs = np.flatnonzero(seg == 92)
    brk = np.flatnonzero(np.diff(bs) != 1)
    first, last = np.r_[bs[:1], bs[brk + 1]], np.r_[bs[brk], bs[-1:]]
    after = last[(last - first) % 2 == 0] + 1
    quote[after[after < len(quote)]] = False
    return bs
