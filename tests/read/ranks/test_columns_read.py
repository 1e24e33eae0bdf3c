"""A read whose tables all say which events columns they read leaves out the derived columns
no table reads, and its tables are those of the full events frame."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpcore.read.analysis.comm_overlap import OVERLAP_TABLE
from dpcore.read.analysis.gpu_kernels import KERNELS_TABLE
from dpcore.read.analysis.trace_arrivals import COMM_TABLE
from dpcore.read.ranks.reduce import reduce_events, reduce_trace
from dpcore.read.traces.rank_table import BASE, DERIVED, columns_read
from dpcore.read.traces.reader import read_trace_meta

DATA = Path(__file__).resolve().parents[2] / "data"


def test_columns_read_is_the_union_or_none() -> None:
    assert columns_read((OVERLAP_TABLE, COMM_TABLE)) == BASE
    assert columns_read((OVERLAP_TABLE, KERNELS_TABLE)) is None  # the kernels table does not say
    assert columns_read(()) == frozenset()


def test_derived_columns_left_out_only_where_no_table_reads_them() -> None:
    path = DATA / "shape_coll_meta.json.gz"  # comm kernels with their collective and bytes
    _, full = read_trace_meta(path)
    _, lean = read_trace_meta(path, columns=BASE)
    assert DERIVED <= set(full.columns) and not DERIVED & set(lean.columns)
    assert (full["bytes"] > 0).any() and (full["collective"].astype(str) != "").any()
    pd.testing.assert_frame_equal(lean, full[list(lean.columns)])
    _, some = read_trace_meta(path, columns=BASE | {"bytes"})
    assert {"collective", "bytes"} <= set(some.columns) and not {"flops", "mm_dtype"} & set(some.columns)
    tables = (OVERLAP_TABLE, COMM_TABLE)
    got = reduce_trace(path, True, tables)
    ref = reduce_events(full, got.rank, got.world_size, {}, tables)
    assert got.events == ref.events and got.notes == ref.notes and len(got.comm) > 0
    for t in tables:
        pd.testing.assert_frame_equal(got[t], ref[t])
