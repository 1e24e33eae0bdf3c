"""The native scan (dpcore/read/traces/native/scan.c) against the reference and the numpy scan.

The reference is a full JSON parse (json.loads) and the documented field conventions
(``x_event_fields``, ``meta_event_fields``); the native scan must give the same Columns, bit
for bit, or decline the file (OddTrace) so that the numpy scan reads it. Hostile bytes run in
a child process: a crash there fails the test instead of the suite.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from dpcore.read.traces import native
from dpcore.read.traces.bytescan import Columns, OddTrace, Scanner
from dpcore.read.traces.columns import columns_from_events, read_columns

ROOT = Path(__file__).resolve().parents[3]
SHARED = [ROOT.parent / "shared" / "traces", ROOT.parent / "shared" / "gpu"]

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native scan: {native.why_not()}")


def same(a: Columns, b: Columns) -> None:
    """Two Columns hold the same values: floats bit for bit, tables with their types."""
    for f in ("ts", "dur", "corr", "stream"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f
    assert a.tables.keys() == b.tables.keys() and a.nums.keys() == b.nums.keys()
    for f in a.tables:
        assert [(type(v), v) for v in a.tables[f]] == [(type(v), v) for v in b.tables[f]], f
        assert a.codes[f].dtype == b.codes[f].dtype and a.codes[f].tolist() == b.codes[f].tolist(), f
    for f in a.nums:
        assert a.nums[f].dtype == b.nums[f].dtype and a.nums[f].tolist() == b.nums[f].tolist(), f


def reference(path: Path) -> Columns:
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return columns_from_events(doc if isinstance(doc, list) else doc["traceEvents"], path)


def native_columns(path: Path, window: int = 2 << 20) -> Columns:
    found = Scanner(path, use_native=True).run(window)
    assert found is not None
    return found[1]


NUMBERS = [0, -0.0, 1, -1, 7, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, -(2 ** 63), 2 ** 64 + 5, 10 ** 30, 1.5, -2.25,
           1e-7, 1.7976931348623157e308, 5e-324, 0.1, 123456.789, 1e21, 3.0e10, 2.5e-3, 9007199254740993.0]
TEXTS = ["", "a", "ncclDevKernel_AllReduce_Sum_f32", "q\"uote", "back\\slash", "tab\tnl\n", "é ü 中文",
         "emoji \U0001F600", "\u0000nul", "/", "long " * 30, "12", "X", "fp32", "[[1, 2], [3]]"]


def _number_text(rng: random.Random) -> str:
    """A JSON number in one of its spellings: exponents, signs, many digits."""
    kind = rng.randrange(6)
    if kind == 0:
        return json.dumps(rng.choice(NUMBERS))
    if kind == 1:
        return f"{rng.randint(-10 ** 6, 10 ** 6)}e{rng.randint(-30, 30)}"
    if kind == 2:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 17)}f}"
    if kind == 3:
        return f"{rng.uniform(0, 10):.{rng.randint(1, 20)}f}E{rng.choice('+-')}{rng.randint(0, 300)}"
    if kind == 4:
        return str(rng.randint(-(10 ** rng.randint(1, 25)), 10 ** rng.randint(1, 25)))
    return rng.choice(["-0", "0", "-0.0", "0e0", "-0E-5", "1E2"])


def _value_text(rng: random.Random, numbers_only: bool = False) -> str:
    """Any JSON value as text; numbers more often."""
    kind = rng.randrange(3 if numbers_only else 9)
    if kind < 3:
        text = _number_text(rng)
        if not numbers_only and text.lstrip("-").isdigit() and abs(int(text)) >= 2 ** 63:
            return "12"  # dpcore decodes text values with orjson, which reads such ints as floats
        return text
    if kind < 6:
        return json.dumps(rng.choice(TEXTS), ensure_ascii=rng.random() < 0.5)
    if kind == 6:
        return rng.choice(["null", "true", "false"])
    if kind == 7:
        return json.dumps([rng.choice(TEXTS), {"k": [1, {"deep": [[]]}]}])
    return json.dumps({"a": rng.choice(TEXTS), "b": [1.5, None]})


def _event_text(rng: random.Random, exotic: bool) -> str:
    """One event as JSON text: keys in random order, some absent, values of every kind; with
    ``exotic`` also string times/ids (which the native scan declines)."""
    members = [('"ph"', json.dumps(rng.choice(["X", "X", "X", "i", "M", "B"])))]
    for key in ("ts", "dur"):
        if rng.random() < 0.9:
            members.append((f'"{key}"', json.dumps(_number_text(rng)) if exotic and rng.random() < 0.1
                            else _number_text(rng)))
    for key in ("name", "cat", "pid", "tid"):
        if rng.random() < 0.85:
            if key == "cat":
                text = json.dumps(rng.choice(["kernel", "cpu_op", "gpu_memcpy", "Memset", "cuda_runtime", 5]))
            else:
                text = _value_text(rng)
            members.append((f'"{key}"', text))
    members += [('"other"', _value_text(rng)), ('"nested"', '{"ph": "M", "ts": "no", "args": {"stream": 1}}')]
    if rng.random() < 0.8:
        if rng.random() < 0.15:
            members.append(('"args"', _value_text(rng)))  # not an object: counts as absent
        else:
            args = []
            for key in ("correlation", "stream", "Collective name", "In msg nelems", "Out msg nelems", "dtype",
                        "Group size", "Input Dims", "Input type", "External id", "deep"):
                if rng.random() < 0.5:
                    numeric = key in ("correlation", "stream", "In msg nelems", "Out msg nelems", "Group size")
                    text = _value_text(rng, numbers_only=numeric and rng.random() < 0.7)
                    if numeric and not exotic and text.startswith('"'):
                        text = "null"
                    args.append((json.dumps(key), text))
            rng.shuffle(args)
            members.append(('"args"', "{" + rng.choice([",", ", ", ",\n  "]).join(
                f"{k}{rng.choice([':', ': ', ' : '])}{v}" for k, v in args) + "}"))
    rng.shuffle(members)
    sep = rng.choice([",", ", ", " ,\n\t"])
    return "{" + sep.join(f"{k}{rng.choice([':', ': '])}{v}" for k, v in members) + "}"


def _write(path: Path, events: list[str], rng: random.Random) -> Path:
    sep = rng.choice([",", ",\n", " , "])
    body = "[" + sep.join(events) + "]"
    text = body if rng.random() < 0.3 else '{"schemaVersion": 1, "traceEvents": ' + body + ', "x": {"y": 1}}'
    data = text.encode()
    path.write_bytes(gzip.compress(data, 1) if path.name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("seed", range(12))
def test_random_events_match_the_reference(tmp_path, seed):
    """Every value shape the native scan converts itself gives the reference's value; with
    ``exotic`` shapes it may decline, and read_columns (numpy scan or full parse) stays exact."""
    rng = random.Random(seed)
    exotic = seed % 3 == 2
    events = [_event_text(rng, exotic) for _ in range(rng.choice([1, 50, 600]))]
    path = _write(tmp_path / f"r{seed}.json{'.gz' if seed % 2 else ''}", events, rng)
    ref = reference(path)
    assert len(ref.ts) > 0 or len(events) < 5
    if exotic:
        same(read_columns(path, window=rng.choice([256, 4096, 2 << 20]))[1], ref)
        return
    for window in (211, 4096, 2 << 20):
        same(native_columns(path, window), ref)


def test_numbers_are_read_as_python_reads_them(tmp_path):
    """Times are float() of the text, bit for bit (signed zeros, subnormals, ints past 2**53); ids
    int() of it when it fits int64 (floats truncated, -2**63 included), else -1."""
    times = ["0", "-0", "-0.0", "0e5", "-0e5", "5e-324", "2.2250738585072011e-308", "9007199254740993",
             "123456789012345678901234567890", "1.7976931348623157e308", "0.1", "1e-400", "-1e-400",
             "17.000000000000000000000001", "2.5e+3"]
    ids = ["9223372036854775807", "-9223372036854775808", "9223372036854775808", "-9.223372036854775808e18",
           "9.223372036854775807e18", "1e19", "-1.5", "2.9999", "1e400", "-1e400", "true", "false", "null",
           "[]", "{}", "123456789012345678", "-0"]
    events = [f'{{"ph":"X","ts":{t},"dur":{t}}}' for t in times]
    events += [f'{{"ph":"X","args":{{"correlation":{v},"stream":{v},"Group size":{v}}},"cat":"kernel"}}' for v in ids]
    path = tmp_path / "numbers.json"
    path.write_text("[" + ",".join(events) + "]")
    cols, ref = native_columns(path), reference(path)
    same(cols, ref)
    assert [math.copysign(1, t) for t in cols.ts[:5]] == [1, 1, -1, 1, -1]
    assert cols.corr[len(times):].tolist()[:5] == [2 ** 63 - 1, -(2 ** 63), -1, -(2 ** 63), -1]


@pytest.mark.parametrize("text", [
    '[{"ph":"X","ts":"12"}]',  # a time in a string: float() reads it; the numpy scan converts it
    '[{"ph":"X","ts":1,"ts":2}]',  # a duplicate key: the last one wins
    '[{"ph":"\\u0058","ts":1}]',  # an escaped "ph"
    '[{"ph":"X","t\\u0073":1}]',  # an escaped key
    '[{"ph":"X"},5]',  # an entry that is not an object
    '[{"ph":"X"},]',  # a trailing comma
    '[{"ph":"X","args":{"correlation":"7"}}]',  # an id in a string
    '[{"ph":"X","args":{"stream":1,"stream":2}}]',  # a duplicate key in args
    '[{"ph":"X","args":{"stream":1},"args":{"dtype":"Float"}}]',  # args twice
    '[{"ph":"X","args":{"corr\\u0065lation":7}}]',  # an escaped key in args
    '[{"ph":"X","ts":123456789012345678901234567890123456789012345678901234567890123456789012345678901234}]',
])
def test_what_the_native_scan_declines_the_others_read(tmp_path, text):
    path = tmp_path / "odd.json"
    path.write_text(text)
    with pytest.raises(OddTrace):
        Scanner(path, use_native=True).run(2 << 20)
    try:
        ref = reference(path)
    except ValueError:
        ref = None  # not JSON: read_columns refuses it (tests/read/traces/test_columns.py)
    if ref is not None:
        same(read_columns(path)[1], ref)


def test_escaped_quotes_anywhere_in_a_string(tmp_path):
    """A string ends at its first unescaped quote wherever the escapes fall: within the first
    bytes scan.c checks one by one, across that stretch, or after it (where memchr takes over)."""
    events = []
    for k in range(0, 40):
        for tail in ('\\"', '\\\\', '\\\\\\"', '\\u0022'):
            name = "n" * k + tail + "x" * (k % 5)
            events.append(f'{{"ph":"X","name":"{name}","cat":"{tail}{name}","ts":{k},"dur":1,'
                          f'"args":{{"dtype":"{name}","stream":{k}}}}}')
    path = tmp_path / "escapes.json"
    path.write_text("[" + ",".join(events) + "]")
    ref = reference(path)
    assert len(ref.ts) == 160 and len(set(ref.tables["name"])) == 120  # \\" and \\u0022 are one text
    for window in (97, 4096, 2 << 20):
        same(native_columns(path, window), ref)


HOSTILE = r"""
import random, sys
from dpcore.read.traces import native
scan = native.NativeScan(native.load(), rows=64)
base = open(sys.argv[1], "rb").read()
rng = random.Random(int(sys.argv[2]))
cases = [b"[" * 1_000_000, b"[" + b"{" * 500_000, b'[{"a":"' + b"\\" * 100_001, b"[" + b"\x00" * 4096,
         b'[{"ph":"X","ts":' + b"9" * 100_000 + b"}]", b'[{"ph":"X","ts":1e99999}]', base[:len(base) // 2],
         b'[{"ph":"X","args":{"stream":' + b"-" * 10 + b"}}]", b"", b"[", b'[{"', b'[{"ph"']
for _ in range(300):  # random damage to a valid trace: flipped, cut, inserted bytes
    b = bytearray(base)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        op = rng.randrange(3)
        if op == 0:
            b[i] = rng.choice(b'{}[]",:\\ 0e-.X\x00\xff')
        elif op == 1:
            del b[i:i + rng.randint(1, 40)]
        else:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
    cases.append(bytes(b[:rng.randint(1, len(b))]) if rng.random() < 0.3 else bytes(b))
n = 0
for buf in cases:
    raws = [scan.raws(k, 0) for k in range(native.N_TEXT)]
    assert all(len(set(r)) == len(r) for r in raws)
    for first in (True, False):
        pos = 1 if first and buf[:1] == b"[" else 0
        while True:  # as the scanner does: batches until the window is used up
            status, end, entries, rows = scan.scan(buf, pos, first)
            if rows:
                counts = [scan.lib.dp_count(scan.state, k) for k in range(native.N_TEXT)]
                assert all(0 <= scan.texts[k, :rows].min() <= scan.texts[k, :rows].max() < counts[k]
                           for k in range(native.N_TEXT))
            if status != native.FULL:
                break
            assert pos < end <= len(buf)
            pos, first = end, False
        n += 1
print("survived", n)
"""


@pytest.mark.parametrize("seed", [0, 1])
def test_hostile_bytes_never_crash_the_scan(tmp_path, seed):
    """Deep nesting, endless backslashes, NUL bytes, huge numbers, truncation and randomly
    damaged traces: every call returns (in a child process, so a crash fails here), and every
    text id it reports is one of the distinct texts it kept."""
    base = tmp_path / "base.json"
    rng = random.Random(seed)
    base.write_bytes(_write(tmp_path / "b.json", [_event_text(rng, True) for _ in range(80)], rng).read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", HOSTILE, str(base), str(seed)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "survived 624" in done.stdout


def _shared_files() -> list[Path]:
    return sorted(p for d in SHARED if d.is_dir() for p in d.rglob("*.json*") if p.is_file())


@pytest.mark.skipif(not _shared_files(), reason="no ../shared traces on this machine")
def test_shared_traces_native_equals_numpy():
    """Every real trace in ../shared: the native scan reads it (no decline) with the numpy
    scan's values."""
    for path in _shared_files():
        try:
            want = Scanner(path, use_native=False).run(2 << 20)
        except OddTrace:
            want = None
        if want is None:
            continue
        got = Scanner(path, use_native=True).run(2 << 20)
        assert got is not None and got[0] == want[0], path
        same(got[1], want[1])


def test_build_cache_and_switches(tmp_path):
    """A fresh cache folder gets the library built once (a second process loads it); with no
    compiler the numpy scan reads the trace and why_not says why; DPCORE_NATIVE=0 turns it off."""
    trace = tmp_path / "t.json"
    trace.write_text('[{"ph":"X","ts":1.5,"name":"k"}]')
    code = ("import sys; from dpcore.read.traces import native; from dpcore.read.traces.columns import read_columns;"
            f"print(native.why_not()); print(read_columns({str(trace)!r})[1].ts.tolist())")
    base = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    (tmp_path / "cache" / "dpcore" / "native").mkdir(parents=True, mode=0o700)
    (tmp_path / "cache" / "dpcore" / "native" / "dpscan-0000000000000000.so").write_bytes(b"an older scan.c's")
    runs, errs = {}, {}
    for name, extra in (("build", {}), ("again", {"CC": "no-such-cc"}), ("none", {"CC": "no-such-cc"}),
                        ("off", {"DPCORE_NATIVE": "0"})):
        base.pop("DPCORE_NATIVE", None)
        if name in ("again", "none"):
            extra["DPCORE_NATIVE"] = "1"  # asked for: a process that cannot have it says so on stderr
        if name == "none":
            base["XDG_CACHE_HOME"] = str(tmp_path / "empty")
            extra["TMPDIR"] = str(tmp_path / "tmp")
            os.makedirs(extra["TMPDIR"])
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**base, **extra}, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        runs[name], errs[name] = done.stdout.splitlines(), done.stderr
    assert runs["build"] == ["None", "[1.5]"]
    assert runs["again"] == ["None", "[1.5]"]  # built already: no compiler needed
    assert runs["none"][0].startswith("not built (cannot run the C compiler 'no-such-cc'")
    assert runs["none"][1] == "[1.5]"
    assert errs["none"].count("native trace scan is not in use") == 1 and errs["build"] == errs["again"] == ""
    assert runs["off"] == ["turned off by DPCORE_NATIVE=0", "[1.5]"]
    built = list((tmp_path / "cache" / "dpcore" / "native").iterdir())  # the older library deleted
    assert [(p.name[:7], p.suffix) for p in built] == [("dpscan-", ".so")] and "dpscan-0000" not in built[0].name


HARNESS = r"""#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include SCAN_C
/* each file: scanned from every start, as a window of exactly its size (ASAN sees any overread) */
int main(int argc, char **argv) {
    enum { CAP = 7 };
    double times[2 * CAP]; int64_t ints[5 * CAP]; int32_t texts[8 * CAP]; int64_t out[3];
    long calls = 0;
    for (int a = 1; a < argc; a++) {
        FILE *fh = fopen(argv[a], "rb");
        if (!fh) return 2;
        fseek(fh, 0, SEEK_END); long n = ftell(fh); fseek(fh, 0, SEEK_SET);
        uint8_t *b = malloc(n ? n : 1);
        if (fread(b, 1, n, fh) != (size_t)n) return 2;
        fclose(fh);
        for (long cut = n; cut >= 0; cut -= (n / 50 + 1)) {
            uint8_t *w = malloc(cut ? cut : 1);
            memcpy(w, b, cut);
            dp_state *st = dp_new();
            for (int pass = 0; pass < 2; pass++) {
                int first = pass;
                int64_t pos = first && cut && w[0] == '[' ? 1 : 0;
                if (first && cut && w[0] == '{') {
                    uint8_t *k = memmem(w, cut, "\"traceEvents\"", 13);
                    uint8_t *br = k ? memchr(k, '[', cut - (k - w)) : NULL;
                    if (br) pos = br - w + 1;
                }
                for (;;) {
                    int r = dp_scan(st, w, cut, pos, first, CAP, times, ints, texts, out);
                    calls++;
                    if (r != DP_FULL) break;
                    if (out[0] <= pos || out[0] > cut) { printf("bad next\n"); return 3; }
                    pos = out[0]; first = 0;
                }
            }
            dp_free(st);
            free(w);
        }
        free(b);
    }
    printf("calls %ld\n", calls);
    return 0;
}
"""


def test_scan_is_clean_under_address_sanitizer(tmp_path):
    """scan.c built with AddressSanitizer and UBSan, each case copied into a buffer of exactly its
    size and scanned whole and cut at 50 places, from the array's start and as a later window,
    in batches of 7 rows: any read out of bounds, overflow or leak-free crash fails the run."""
    rng = random.Random(11)
    base = _write(tmp_path / "base.json", [_event_text(rng, True) for _ in range(60)], rng).read_bytes()
    cases = [base, b"[" * 100_000, b"[" + b"{" * 50_000, b'[{"a":"' + b"\\" * 1001, b"[" + b"\x00" * 4096,
             b'[{"ph":"X","ts":' + b"9" * 1000 + b"}]", b'[{"ph":"X","ts":-}]', b'[{"ph":"X","ts":1.}]',
             b'[{"ph":"X","name":"a\\"}]', b'{"traceEvents": [{"ph":"X"}  ,  {"ph":"X"}  ]}', b"", b"["]
    for _ in range(150):
        b = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            j = rng.randrange(len(b))
            junk = bytes(rng.choice(b'{}[]",:\\ 0e-.X\x00\xff') for _ in range(rng.randint(0, 3)))
            b[j:j + rng.choice([0, 1, 1, 9])] = junk
        cases.append(bytes(b))
    files = []
    for i, case in enumerate(cases):
        files.append(tmp_path / f"case{i}")
        files[-1].write_bytes(case)
    (tmp_path / "harness.c").write_text(HARNESS)
    exe = tmp_path / "harness"
    cc = subprocess.run(["cc", "-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                         f'-DSCAN_C="{native.SOURCE}"', "-o", str(exe), str(tmp_path / "harness.c"), "-lm"],
                        capture_output=True, text=True, check=False)
    if cc.returncode != 0:
        pytest.skip(f"no sanitizer build here: {cc.stderr.strip()[-200:]}")
    done = subprocess.run([str(exe), *map(str, files)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("calls ") and int(done.stdout.split()[1]) > 10 * len(cases)


def test_a_cache_folder_others_can_write_is_not_loaded_from(tmp_path):
    """A library is loaded from the cache: a cache folder that other users can write (or a
    temporary folder someone else made) is passed over for the next one."""
    shared = tmp_path / "cache" / "dpcore" / "native"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "TMPDIR": str(tmp_path / "tmp")}
    code = "from dpcore.read.traces import native; lib = native.load(); print(lib._name if lib else native.why_not())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == tmp_path / "tmp" / f"dpcore-{os.getuid()}"
    assert not list(shared.iterdir())
