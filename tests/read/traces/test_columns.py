"""The one Chrome trace reader: the columnar scan gives what a plain json.load of the file gives.

The reference below is written independently of dpcore (json.load, then the documented field
conventions), so these tests compare the scanner with the JSON spec, not with itself.
"""
import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpcore.contract import tracefile as contract
from dpcore.read import traces
from dpcore.read.traces import columns as tf
from dpcore.read.traces import read_trace
from tests.synthetic import gpu_trace, write_gpu_trace_dir
from tests.trace_helpers import read_trace_dir

pytestmark = pytest.mark.usefixtures("scan_path")  # each test: a cache of its own

DATA = Path(__file__).resolve().parents[2] / "data"
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_driver_kernel",
          "Kernel", "Memcpy", "Memset"}  # and the legacy (pre-1.10 kineto) names


def _as_id(v):
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):
        return -1
    return i if -(2 ** 63) <= i < 2 ** 63 else -1


def reference(path: Path) -> dict:
    """X-event fields by json.load: absent ts/dur 0.0, name/cat "" (non-strings printed),
    pid/tid -1 (ints, strings, floats kept), args that is not an object counts as absent,
    correlation/stream int() or -1, stream for device categories only."""
    raw = Path(path).read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc if isinstance(doc, list) else doc["traceEvents"]
    out = {k: [] for k in ("ts", "dur", "name", "cat", "pid", "tid", "corr", "stream")}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        text = {k: (v if isinstance(v, str) else str(v)) for k, v in
                (("name", e.get("name", "")), ("cat", e.get("cat", "")))}
        out["ts"].append(float(e.get("ts", 0.0)))
        out["dur"].append(float(e.get("dur", 0.0)))
        out["name"].append(text["name"])
        out["cat"].append(text["cat"])
        for k in ("pid", "tid"):
            v = e.get(k, -1)
            out[k].append(v if isinstance(v, (int, str, float)) else str(v))
        out["corr"].append(_as_id(args.get("correlation")))
        out["stream"].append(_as_id(args.get("stream")) if text["cat"] in DEVICE else -1)
    return out


def check(path: Path, window: int = tf.WINDOW_BYTES, fast: bool = True) -> None:
    """read_columns equals the reference; with fast=True it must not fall back to a full parse."""
    if fast:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tf, "load_trace", lambda p, **_: pytest.fail(f"full parse of {p}"))
            _, cols = tf.read_columns(path, window=window)
    else:
        _, cols = tf.read_columns(path, window=window)
    ref = reference(path)
    for f in ("ts", "dur"):  # bit for bit, sign of zero included
        assert np.asarray(ref[f], np.float64).tobytes() == cols.__dict__[f].tobytes(), f
    for f in ("corr", "stream"):
        assert cols.__dict__[f].tolist() == ref[f], f
    for f in ("name", "cat", "pid", "tid"):
        table = dict.fromkeys(ref[f])  # distinct values in order of first appearance
        assert [(type(v), v) for v in cols.tables[f]] == [(type(v), v) for v in table], f
        assert [cols.tables[f][c] for c in cols.codes[f]] == ref[f], f


def write(path: Path, doc, text: str | None = None) -> Path:
    data = (text if text is not None else json.dumps(doc)).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


ODD_VALUES = [  # well-formed events whose values take the slow lanes of the scanner
    {"ph": "X", "name": "a", "cat": "cpu_op", "ts": "12.5", "dur": 3, "pid": [1, 2], "tid": {"t": 1},
     "args": None},
    {"ph": "X", "name": 7, "cat": None, "ts": 1e3, "dur": -0, "pid": 1.0, "tid": True, "args": [1]},
    {"ph": "X", "name": "q\"uote\\back\u00e9\n", "cat": "kernel", "ts": -0.0, "dur": 2.5e-3, "pid": 1,
     "tid": "stream 7", "args": {"stream": 7.9, "correlation": "12", "deep": {"correlation": 5}}},
    {"ph": "X", "name": "\u0058", "cat": "gpu_memcpy", "ts": 123456789012345678, "pid": 0, "tid": 7,
     "args": {"stream": None, "correlation": 2 ** 70}},
    {"ph": "X", "cat": "kernel", "dur": 1, "args": {"stream": 12345678901, "correlation": -3}},
    {"ph": "i", "name": "instant", "ts": 5}, {"name": "no ph", "ts": 6}, {"ph": "M", "name": "thread_name"},
    {"ph": "X", "name": "ncclDevKernel", "cat": "kernel", "ts": 9.5, "dur": 1.25, "pid": 0, "tid": 20,
     "args": {"correlation": 4, "stream": 20, "External id": 4}},
    {"ph": "X", 'x"ph': "M", "name\\": 1, "ts": 1, "args": {'"stream': 3, "correlation\"": 9, "stream": 1},
     "cat": "kernel"},
]


@pytest.mark.parametrize("name", ["odd.json", "odd.json.gz"])
def test_odd_values_match_json_load(tmp_path, name):
    check(write(tmp_path / name, {"schemaVersion": 1, "traceEvents": ODD_VALUES,
                                  "distributedInfo": {"rank": 0}}))


@pytest.mark.parametrize("layout", ["compact", "pretty", "spaced", "list"])
def test_layouts_match_json_load(tmp_path, layout):
    """Compact, indented, spaces around colons (read by the full parse), the Array Format."""
    doc = gpu_trace(0, steps=2, kernels_per_step=20)
    text = {"compact": json.dumps(doc, separators=(",", ":")), "pretty": json.dumps(doc, indent=2),
            "spaced": json.dumps(doc, separators=(" , ", " : ")),
            "list": json.dumps(doc["traceEvents"] + ODD_VALUES)}[layout]
    check(write(tmp_path / f"{layout}.json", None, text), fast=layout != "spaced")  # "k" : v: full parse


def test_small_windows_and_metadata_after_events(tmp_path):
    """Windows cut events, strings and escapes anywhere; metadata before and after the array."""
    doc = {"note": 'a "traceEvents": [ string', "traceEvents": gpu_trace(1, steps=2, kernels_per_step=15)["traceEvents"]
           + ODD_VALUES, "after": {"traceEvents": "nested, not the array"}, "distributedInfo": {"rank": 1}}
    path = write(tmp_path / "meta.json.gz", doc)
    for window in (40, 97, 1000):
        check(path, window=window)
    meta, _ = tf.read_columns(path, window=97)
    assert meta == {k: v for k, v in doc.items() if k != "traceEvents"}


def test_windows_without_complete_events(tmp_path):
    """Windows of metadata events only, and an event larger than the window (it grows)."""
    doc = {"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": i} for i in range(60)]
           + [{"ph": "X", "name": "big" * 200, "ts": 1, "dur": 2, "args": {"correlation": 3}}] + ODD_VALUES}
    for window in (16, 64):
        check(write(tmp_path / "m.json", doc), window=window)
    check(write(tmp_path / "empty.json", {"traceEvents": []}))


def _random_value(rng: random.Random):
    return rng.choice([rng.randint(-5, 10 ** 6), rng.uniform(-1e6, 1e9), str(rng.randint(0, 99)), None, True,
                       [rng.randint(0, 3)], {"k": 1}, "x\\\"y", "é", rng.random() * 10 ** rng.randint(-8, 12)])


def _random_event(rng: random.Random, junk: bool):
    if junk and rng.random() < 0.05:
        return rng.choice([1, "s", None, [1, {"ph": "X"}]])
    e = {"ph": rng.choice(["X"] * 8 + ["M", "i", "f"])}
    times = [rng.randint(-5, 10 ** 6), str(rng.uniform(0, 99)), True, -0, rng.random() * 10 ** rng.randint(-8, 12)]
    for k, good in (("ts", rng.uniform(0, 1e13)), ("dur", float(rng.randint(0, 500))),
                    ("name", rng.choice(["aten::mm", "ncclKernel_x", "void k<float>(int*)", "Memcpy DtoD"])),
                    ("cat", rng.choice(sorted(DEVICE) + ["cpu_op", "cuda_runtime"])),
                    ("pid", rng.choice([0, 1000, "Spans"])), ("tid", rng.choice([7, 20, 1001]))):
        if rng.random() < 0.9:
            e[k] = good if rng.random() < 0.9 else rng.choice(times) if k in ("ts", "dur") else _random_value(rng)
    if rng.random() < 0.8:
        e["args"] = {k: (rng.randint(0, 10 ** 7) if rng.random() < 0.85 else _random_value(rng))
                     for k in rng.sample(["correlation", "stream", "External id", "device"], rng.randint(0, 4))}
    keys = list(e)
    rng.shuffle(keys)
    return {k: e[k] for k in keys}


@pytest.mark.parametrize("seed", range(6))
def test_random_traces_match_json_load(tmp_path, seed):
    rng = random.Random(seed)
    events = [_random_event(rng, junk=seed % 2 == 1) for _ in range(400)]
    sep = rng.choice([(",", ":"), (", ", ": "), (",\n ", " :\t")])
    doc = events if seed % 3 == 0 else {"traceEvents": events, "displayTimeUnit": "ms"}
    path = write(tmp_path / f"r{seed}.json.gz", None, json.dumps(doc, separators=sep))
    fast = seed % 2 == 0 and " :" not in sep[1]  # junk entries, or "k" : v: the full parse
    check(path, window=rng.choice([300, 4096, tf.WINDOW_BYTES]), fast=fast)


def test_real_traces_take_the_fast_path(samples):
    files = sorted(DATA.glob("*.json.gz")) + sorted(samples.glob("*/traces/*/*.json.gz"))[:12]
    assert files
    for f in files:
        check(f)


def test_events_frame_same_as_full_parse(tmp_path, monkeypatch):
    """read_trace's frame is the same whether the scanner or the full parse read the file."""
    d = tmp_path / "gpu"
    write_gpu_trace_dir(d, world_size=1, steps=3, kernels_per_step=60, seed=5)
    fast = read_trace(d / "rank0.json.gz")
    monkeypatch.setattr(tf.Scanner, "run", lambda self, window: None)
    pd.testing.assert_frame_equal(fast, read_trace(d / "rank0.json.gz"), check_exact=True)
    for f in sorted(DATA.glob("*.json.gz")):
        monkeypatch.undo()
        fast = read_trace(f)
        monkeypatch.setattr(tf.Scanner, "run", lambda self, window: None)
        pd.testing.assert_frame_equal(fast, read_trace(f), check_exact=True)


def test_time_that_is_not_a_number(tmp_path, monkeypatch):
    path = write(tmp_path / "t.json", {"traceEvents": [{"ph": "X", "ts": 1}, {"ph": "X", "ts": "soon"}]})
    for _ in range(2):  # the scanner, then the full parse
        with pytest.raises(contract.TraceFormatError, match="'soon' is not a number.*t.json"):
            tf.read_columns(path)
        monkeypatch.setattr(tf.Scanner, "run", lambda self, window: None)


def test_duplicate_keys_fall_back_to_the_full_parse(tmp_path):
    text = '{"traceEvents": [{"ph": "X", "ts": 1, "ts": 2, "name": "a"}, {"ph": "X", "ph": "M"}]}'
    path = write(tmp_path / "dup.json", None, text)
    check(path, fast=False)
    assert tf.read_columns(path)[1].ts.tolist() == [2.0]


def _escaped(value, at: list[int]) -> str:
    """JSON text of ``value`` with one character of every key and string written as a \\u escape
    (a different position each time): the same document to json.loads."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_escaped(k, at)}:{_escaped(v, at)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_escaped(v, at) for v in value) + "]"
    if not isinstance(value, str) or not value:
        return json.dumps(value)
    at[0] += 1
    j = at[0] % len(value)
    return json.dumps(value[:j])[:-1] + f"\\u{ord(value[j]):04x}" + json.dumps(value[j + 1:])[1:]


def test_escaped_keys_and_names_read_as_json_loads_reads_them(tmp_path):
    """Keys spelt with escapes ("t\\u0073" is "ts") are the keys they decode to, in the events and
    their args, without a full parse; the trace's frame equals the plain file's."""
    doc = gpu_trace(0, steps=2, kernels_per_step=30)
    doc["traceEvents"] += [{"ph": "X", "name": "q\"k", "cat": "kernel", "ts": 7.5, "dur": 2,
                            "args": {"correlation": 11, "stream": 3, "Collective name": "allreduce"}}]
    plain = write(tmp_path / "plain_rank0.json", doc)
    rest = {k: v for k, v in doc.items() if k != "traceEvents"}  # the array's own key plain: found fast
    text = '{"traceEvents":' + _escaped(doc["traceEvents"], [0]) + "," + json.dumps(rest)[1:]
    assert '"t\\u0073"' in text and '"\\u0064ur"' in text and '"\\u0043ollective name"' in text
    escaped = write(tmp_path / "escaped_rank0.json.gz", None, text)
    for window in (97, 4096, tf.WINDOW_BYTES):
        check(escaped, window=window)  # fast: no full parse
    a, b = read_trace(plain), read_trace(escaped)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert b["dur"].sum() == pytest.approx(sum(e["dur"] for e in doc["traceEvents"] if e["ph"] == "X"))
    assert (b["collective"] == "allreduce").sum() == (a["collective"] == "allreduce").sum() > 0
    # one key spelt twice in an event: a JSON parser keeps the last, so the full parse reads it
    dup = write(tmp_path / "dup.json", None, '[{"ph":"X","ts":1,"t\\u0073":2,"n\\u0061me":"\\u0061b"}]')
    check(dup, fast=False)
    assert tf.read_columns(dup)[1].ts.tolist() == [2.0]


def test_dir_categories_as_pandas_concat(tmp_path):
    """Ranks with different pids (one with a string pid): the categories read_trace_dir always
    gave (pd.concat, then astype('category')), built without the object detour."""
    for r, pid in ((0, 1000), (1, "Spans"), (2, 1002)):
        doc = gpu_trace(r, world_size=3, steps=1, kernels_per_step=10)
        for e in doc["traceEvents"]:
            e["pid"] = pid if e.get("pid") else e.get("pid")
        write(tmp_path / f"rank{r}.json", doc)
    frames = [read_trace(tmp_path / f"rank{r}.json") for r in range(3)]
    want = pd.concat(frames, ignore_index=True)
    for c in ("name", "category", "pid", "tid", "collective"):
        if want[c].dtype != "category":
            want[c] = want[c].astype("category")
    pd.testing.assert_frame_equal(read_trace_dir(tmp_path), want, check_exact=True)


@pytest.mark.parametrize("name,content,match", [
    ("empty.json", b"", "empty"), ("blank.json", b" \n\t ", "empty"), ("text.json", b"hello", "not a JSON"),
    ("photo.json", b'{"camera": "x"}', "not a Chrome trace"), ("scalar.json", b"[1, 2", "truncated"),
    ("cut.json", b'{"traceEvents": [{"ph": "X", "ts": 1}, {"ph": "X", "t', "truncated"),
    ("events.json", b'{"traceEvents": {"ph": "X"}}', "not a Chrome trace"),
    ("bad.json.gz", b"\x1f\x8b\x08\x00garbage", "gzip"),
])
def test_bad_files_are_one_line_errors_naming_the_file(tmp_path, name, content, match):
    (tmp_path / name).write_bytes(content)
    for reader in (tf.read_columns, contract.load_trace, read_trace):
        with pytest.raises(contract.TraceFormatError, match=match) as err:
            reader(tmp_path / name)
        assert name in str(err.value) and "\n" not in str(err.value)


def test_truncated_gzip_and_missing_file(tmp_path):
    whole = gzip.compress(json.dumps(gpu_trace(0, steps=1, kernels_per_step=30)).encode())
    (tmp_path / "cut.json.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(contract.TraceFormatError, match="cut.json.gz"):
        tf.read_columns(tmp_path / "cut.json.gz")
    with pytest.raises(contract.TraceFormatError, match="not found"):
        tf.read_columns(tmp_path / "nope.json")
    assert traces.TraceFormatError is contract.TraceFormatError


def test_gzip_by_magic_number_and_multi_member(tmp_path):
    doc = gpu_trace(0, steps=1, kernels_per_step=10)
    text = json.dumps(doc).encode()
    (tmp_path / "plain.json.gz").write_bytes(text)  # not gzip, whatever the name says
    (tmp_path / "zipped.json").write_bytes(gzip.compress(text[:100]) + gzip.compress(text[100:]))
    for name in ("plain.json.gz", "zipped.json"):
        assert contract.read_trace_bytes(tmp_path / name) == text
        assert b"".join(contract.iter_trace_bytes(tmp_path / name, chunk=64)) == text
        check(tmp_path / name, window=128)


def test_writer_reads_the_same_file(tmp_path):
    """The merged-trace writer reads rank traces with the same reader (dicts, for re-emitting)."""
    from dpcore.write.capture.merged_trace import read_json_trace
    doc = gpu_trace(0, steps=1, kernels_per_step=10)
    write(tmp_path / "rank0.json", doc)
    assert read_json_trace(tmp_path / "rank0.json") == doc


def test_contract_reader_is_stdlib_only():
    code = ("import sys, dpcore.contract.tracefile; "
            "print([m for m in ('torch', 'pandas', 'numpy', 'dpcore.read', 'dpcore.write') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("chunk", [contract.CHUNK_BYTES, None])
def test_gzip_bomb_is_refused_before_it_fills_memory(tmp_path, monkeypatch, chunk):
    """A small .gz that inflates ~1000:1 stops at the content cap with one line naming it."""
    monkeypatch.setattr(contract, "MAX_TRACE_JSON_BYTES", 1 << 20)
    bomb = tmp_path / "rank0.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (64 << 20), 9))
    assert bomb.stat().st_size < (1 << 20)  # small on disk
    with pytest.raises(contract.TraceFormatError, match="larger than 1 MiB once decompressed"):
        for _ in contract.iter_trace_bytes(bomb, chunk=chunk):
            pass
    plain = tmp_path / "big.json"
    plain.write_bytes(b'{"traceEvents": [' + b" " * (2 << 20) + b"]}")
    with pytest.raises(contract.TraceFormatError, match="decompressed"):
        contract.read_trace_bytes(plain)
