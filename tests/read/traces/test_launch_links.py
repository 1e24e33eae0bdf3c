"""range_of_launch and collective_meta, vectorised, against a plain-Python statement of their
rules (a loop per kernel, a stack per thread) on random traces: nested and touching ranges,
several threads, ids launched twice, kernels without a launch, equal start times, coalesced
groups (several kernels under one range) and kernels that carry their own metadata."""
from __future__ import annotations

from bisect import bisect_right

import numpy as np
import pytest

from dpcore.read.traces.bytescan import Columns
from dpcore.read.traces.collectives import DTYPE_BYTES, collective_meta, range_of_launch

pytestmark = pytest.mark.usefixtures("scan_path")  # each test: a cache of its own

NAMES = ["record_param_comms", "aten::mm", "cudaLaunchKernel", "ncclKernel_AllReduce", "other"]
CATS = ["user_annotation", "cpu_op", "cuda_runtime", "kernel", "cuda_driver"]
COLLS = ["", "allreduce", "broadcast", "all_gather"]
DTYPES = ["", "Float", "BFloat16", "Weird", "Double"]


def _random_trace(seed: int) -> Columns:
    """Host ranges (nested per thread), launch calls and kernels with correlation ids."""
    rng = np.random.default_rng(seed)
    ts, dur, corr, stream, name, cat, pid, tid, coll, dtype, n_in, n_out = ([] for _ in range(12))

    def add(t, d, c, s, nm, ct, p, th, cl=0, dt=0, i=-1, o=-1):
        for lst, v in zip((ts, dur, corr, stream, name, cat, pid, tid, coll, dtype, n_in, n_out),
                          (t, d, c, s, nm, ct, p, th, cl, dt, i, o)):
            lst.append(v)

    next_corr = 1
    for _ in range(int(rng.integers(5, 40))):  # top-level ranges, each with nested children
        th = int(rng.integers(0, 3))
        t0 = float(rng.integers(0, 200)) * 0.5
        d0 = float(rng.integers(1, 30))
        meta = dict(cl=int(rng.integers(0, len(COLLS))), dt=int(rng.integers(0, len(DTYPES))),
                    i=int(rng.integers(-1, 5000)), o=int(rng.integers(-1, 5000)))
        add(t0, d0, -1, -1, 0, 0, 0, th, **meta)
        for _ in range(int(rng.integers(0, 3))):  # a child range, sometimes starting with its parent
            t1 = t0 + float(rng.integers(0, int(d0)))
            add(t1, float(rng.integers(0, int(d0))), -1, -1, 0, 0, 0, th, **meta)
        for _ in range(int(rng.integers(0, 4))):  # launches (some outside the range), kernels
            tl = t0 + float(rng.integers(-2, int(d0) + 3))
            c = next_corr if rng.random() < 0.9 else max(1, next_corr - 1)  # some ids launched twice
            next_corr += 1
            add(tl, 1.0, c, -1, 2, int(rng.choice([2, 4])), 0, th)
            for _ in range(int(rng.integers(1, 3))):  # a coalesced group: several kernels, one launch
                own = rng.random() < 0.2
                add(tl + float(rng.integers(0, 50)), 2.0, c, 7, 3, 3, 0, 9,
                    **(dict(cl=1, dt=2, i=10, o=20) if own else {}))
        if rng.random() < 0.3:  # a kernel with no launch
            add(t0 + 1, 1.0, 10_000 + next_corr, 7, 3, 3, 0, 9)
    c = {"name": name, "cat": cat, "pid": pid, "tid": tid, "coll": coll, "dtype": dtype}
    return Columns(np.asarray(ts), np.asarray(dur), np.asarray(corr, np.int64), np.asarray(stream, np.int64),
                   {f: np.asarray(v, np.int32) for f, v in c.items()},
                   {"name": NAMES, "cat": CATS, "pid": [1], "tid": [10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
                    "coll": COLLS, "dtype": DTYPES},
                   {"in_nelems": np.asarray(n_in, np.int64), "out_nelems": np.asarray(n_out, np.int64)})


def _reference_range(cols: Columns, is_range: np.ndarray, kernels: np.ndarray) -> np.ndarray:
    """The rule one kernel at a time: its launch (first call with its id), that thread's ranges
    sorted by (start, longer first), the last to start at or before the launch, then up its
    enclosing ranges (a stack) while closed."""
    is_launch = np.isin(cols.codes["cat"], [CATS.index("cuda_runtime"), CATS.index("cuda_driver")])
    host = cols.stream < 0
    by_thread: dict = {}
    for i in np.flatnonzero(is_range & host).tolist():
        by_thread.setdefault((int(cols.codes["pid"][i]), int(cols.codes["tid"][i])), []).append(i)
    parents, starts = {}, {}
    for key, idx in by_thread.items():
        idx.sort(key=lambda i: (cols.ts[i], -cols.dur[i]))
        starts[key] = [float(cols.ts[i]) for i in idx]
        stack: list[int] = []
        for r in idx:
            while stack and cols.ts[r] >= cols.ts[stack[-1]] + cols.dur[stack[-1]]:
                stack.pop()
            parents[r] = stack[-1] if stack else -1
            stack.append(r)
    launch_of: dict[int, int] = {}
    for i in np.flatnonzero(is_launch & host & (cols.corr > 0)).tolist():
        launch_of.setdefault(int(cols.corr[i]), i)
    out = []
    for k in kernels.tolist():
        li = launch_of.get(int(cols.corr[k]))
        key = None if li is None else (int(cols.codes["pid"][li]), int(cols.codes["tid"][li]))
        if key not in by_thread:
            out.append(-1)
            continue
        t = float(cols.ts[li])
        p = bisect_right(starts[key], t) - 1
        r = by_thread[key][p] if p >= 0 else -1
        while r >= 0 and t >= cols.ts[r] + cols.dur[r]:
            r = parents[r]
        out.append(r)
    return np.asarray(out, np.int64)


def _reference_meta(cols: Columns, comm: np.ndarray) -> tuple[list[str], list[str], list[float]]:
    """Per event: collective name and bytes, the kernels taken in the order they ran; a range's
    bytes on its first kernel only."""
    n = cols.ts.size
    names, nbytes = [""] * n, [float("nan")] * n
    kernels = np.flatnonzero(comm & (cols.stream >= 0))
    coll = [COLLS[c] for c in cols.codes["coll"]]
    is_range = np.asarray([NAMES[c] == "record_param_comms" and coll[i] != ""
                           for i, c in enumerate(cols.codes["name"])])
    src = [k if coll[k] else -1 for k in kernels.tolist()]
    need = [j for j, s in enumerate(src) if s < 0]
    linked = _reference_range(cols, is_range, kernels[need])
    for j, s in zip(need, linked.tolist()):
        src[j] = s
    seen: set[int] = set()
    for k, s in sorted(zip(kernels.tolist(), src), key=lambda p: cols.ts[p[0]]):
        if s < 0:
            continue
        names[k] = coll[s]
        if s not in seen:
            size = DTYPE_BYTES.get(DTYPES[cols.codes["dtype"][s]])
            m = max(int(cols.nums["in_nelems"][s]), int(cols.nums["out_nelems"][s]))
            nbytes[k] = float(m * size) if size is not None and m >= 0 else float("nan")
            seen.add(s)
    order = list(dict.fromkeys(names[k] for k in sorted(kernels.tolist(), key=lambda k: cols.ts[k]) if names[k]))
    return names, ["", *order], nbytes


@pytest.mark.parametrize("seed", range(40))
def test_range_of_launch_matches_the_rule(seed):
    cols = _random_trace(seed)
    is_range = cols.codes["name"] == NAMES.index("record_param_comms")
    kernels = np.flatnonzero(cols.stream >= 0)
    got = range_of_launch(cols, is_range, kernels)
    assert got.tolist() == _reference_range(cols, is_range, kernels).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_collective_meta_matches_the_rule(seed):
    cols = _random_trace(seed)
    comm = cols.codes["name"] == NAMES.index("ncclKernel_AllReduce")
    codes, table, nbytes = collective_meta(cols, comm)
    names, want_table, want_bytes = _reference_meta(cols, comm)
    assert table == want_table
    assert [table[c] for c in codes] == names
    np.testing.assert_array_equal(nbytes, np.asarray(want_bytes))


def test_a_coalesced_group_counts_its_bytes_once():
    """Two kernels launched under one range of 100 Float elements: the first to run carries 400 bytes."""
    cols = Columns(np.asarray([0.0, 1.0, 5.0, 3.0]), np.asarray([10.0, 1.0, 1.0, 1.0]),
                   np.asarray([-1, 4, 4, 4]), np.asarray([-1, -1, 7, 7]),
                   {"name": np.asarray([0, 2, 3, 3], np.int32), "cat": np.asarray([0, 2, 3, 3], np.int32),
                    "pid": np.zeros(4, np.int32), "tid": np.asarray([0, 0, 1, 1], np.int32),
                    "coll": np.asarray([1, 0, 0, 0], np.int32), "dtype": np.asarray([1, 0, 0, 0], np.int32)},
                   {"name": NAMES, "cat": CATS, "pid": [1], "tid": [1, 2], "coll": COLLS, "dtype": DTYPES},
                   {"in_nelems": np.asarray([100, -1, -1, -1]), "out_nelems": np.asarray([50, -1, -1, -1])})
    codes, table, nbytes = collective_meta(cols, np.asarray([False, False, True, True]))
    assert table == ["", "allreduce"] and codes.tolist() == [0, 0, 1, 1]
    assert np.isnan(nbytes[[0, 1, 2]]).all() and nbytes[3] == 400.0  # event 3 ran first (ts 3 < 5)


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 1000, 4099])
def testin_strings_is_the_prefix_parity_of_quotes(n):
    """The scanner's word-wise prefix xor equals the byte-wise one, across word boundaries."""
    from dpcore.read.traces.bytescan import in_strings
    quote = np.random.default_rng(n).random(n) < 0.3
    want = np.bitwise_xor.accumulate(quote.view(np.uint8)).astype(bool) if n else np.zeros(0, bool)
    assert in_strings(quote).tolist() == want.tolist()


def test_a_hash_collision_sends_the_file_to_the_full_parse(tmp_path, monkeypatch):
    """With every string hashing alike, the word-by-word check finds two names of one length that
    differ (in their first word only) and the scanner declines: the values stay exact."""
    import json

    from dpcore.read.traces import bytescan
    from dpcore.read.traces.columns import read_columns

    names = ["first_kernel_A_12345", "second_kernel_12345", "first_kernel_B_12345"]
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": n, "cat": "kernel", "pid": 1, "tid": 2,
                                              "ts": float(i), "dur": 1.0} for i, n in enumerate(names)]}))
    assert read_columns(f)[1].tables["name"] == names
    monkeypatch.setattr(bytescan, "_MIX", np.zeros_like(bytescan._MIX))
    with pytest.raises(bytescan.OddTrace):
        bytescan.Scanner(f).run(bytescan.WINDOW_BYTES)  # the numpy scan's hash
    cols = read_columns(f)[1]
    assert cols.tables["name"] == names and cols.codes["name"].tolist() == [0, 1, 2]
