"""The FLOPs and input data type of the matrix products a trace's kernels run, from the CPU op's shapes.

Why: a kernel's time says how long a GEMM ran, not how much work it did; achieved TFLOP/s and
MFU need the work. With ``record_shapes=True`` the profiler writes each CPU op's ``Input Dims``
and ``Input type``, and a matrix product's FLOPs follow from them: 2·M·N·K for ``aten::mm`` and
``aten::addmm`` (the bias add is not counted), 2·B·M·N·K for ``aten::bmm``/``aten::baddbmm``,
and for ``aten::matmul``/``aten::linear`` the same over the broadcast leading dimensions. A
kernel belongs to the innermost such op around the runtime call that launched it (same
correlation id, same thread: :func:`dpcore.read.traces.collectives.range_of_launch`); when one
op launched several kernels (split-K and its reduction), its FLOPs are shared among them in
proportion to their durations, so a sum over kernels counts the op once and FLOPs / time is the
op's rate. Only these op names are parsed (a few distinct shapes per trace), so the rest of
the trace's shapes cost nothing beyond the scan.
"""
from __future__ import annotations

import ast
import math

import numpy as np

from dpcore.read.traces.bytescan import Columns
from dpcore.read.traces.collectives import range_of_launch

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
#: c10 ScalarType names (``Input type``) -> the dtype names of the peak table.
INPUT_DTYPES = {"c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16",
                "float": "fp32", "Float": "fp32", "double": "fp64", "Double": "fp64",
                "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8"}


def _dims(text: str) -> list:
    """The list the profiler wrote (as Python prints it), [] when it is not one."""
    try:
        v = ast.literal_eval(text) if text else []
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return []
    return v if isinstance(v, list) else []


def _shape(v: object) -> list[int] | None:
    return [int(d) for d in v] if isinstance(v, list) and all(isinstance(d, int) and d >= 0 for d in v) else None


def matmul_flops(op: str, dims: list) -> float:
    """FLOPs of one matrix product from its op name and ``Input Dims``; NaN when the shapes do
    not describe one (a missing shape, 1-D operands, mismatched inner dimensions)."""
    shapes = [_shape(d) for d in dims]
    pick = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::matmul": (0, 1),
            "aten::addmm": (1, 2), "aten::baddbmm": (1, 2)}.get(op)
    if op == "aten::linear" and len(shapes) >= 2 and shapes[0] and shapes[1] and len(shapes[1]) == 2:
        x, (n, k) = shapes[0], shapes[1]
        return 2.0 * math.prod(x[:-1]) * k * n if x[-1] == k else float("nan")
    if pick is None or len(shapes) <= max(pick):
        return float("nan")
    a, b = shapes[pick[0]], shapes[pick[1]]
    if not a or not b or len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return float("nan")
    m, k, n = a[-2], a[-1], b[-1]
    batch_a, batch_b = a[:-2], b[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a, batch_b = [1] * (width - len(batch_a)) + batch_a, [1] * (width - len(batch_b)) + batch_b
    if any(x != y and 1 not in (x, y) for x, y in zip(batch_a, batch_b)):
        return float("nan")
    return 2.0 * math.prod(max(x, y) for x, y in zip(batch_a, batch_b)) * m * n * k


def input_dtype(types: list, op: str) -> str:
    """The data type of the product's first matrix operand ("" unknown)."""
    at = 1 if op in ("aten::addmm", "aten::baddbmm") else 0
    return INPUT_DTYPES.get(str(types[at]), "") if len(types) > at else ""


def kernel_matmuls(cols: Columns, kernels: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(FLOPs, codes, dtype table with "" first) of every event: for the GPU kernels ``kernels`` (a
    mask) launched under a matrix-product op with shapes, its share of the op's FLOPs and the op's
    input dtype; NaN and "" elsewhere (see the module docstring)."""
    n = cols.ts.size
    flops, codes, table = np.full(n, np.nan), np.zeros(n, np.int32), {"": 0}
    dims_t = cols.tables.get("in_dims")
    if not dims_t or dims_t == [""] or not kernels.any():
        return flops, codes, list(table)
    names = cols.tables["name"]
    is_mm = np.asarray([x in MATMUL_OPS for x in names] + [False], bool)[cols.codes["name"]]
    has_dims = np.asarray([d != "" for d in dims_t] + [False], bool)[cols.codes["in_dims"]]
    idx = np.flatnonzero(kernels)
    op = range_of_launch(cols, is_mm & has_dims, idx)
    found = op >= 0
    idx, op = idx[found], op[found]
    if not idx.size:
        return flops, codes, list(table)
    types_t = cols.tables["in_types"]
    per_op: dict[int, tuple[float, str]] = {}
    parsed: dict[tuple[int, int, int], tuple[float, str]] = {}  # each distinct (op, shapes, types) parsed once
    for o in np.unique(op).tolist():
        key = (int(cols.codes["name"][o]), int(cols.codes["in_dims"][o]), int(cols.codes["in_types"][o]))
        if key not in parsed:
            name = names[key[0]]
            parsed[key] = (matmul_flops(name, _dims(dims_t[key[1]])), input_dtype(_dims(types_t[key[2]]), name))
        per_op[o] = parsed[key]
    op_time = np.bincount(np.searchsorted(np.unique(op), op), weights=cols.dur[idx])
    share = cols.dur[idx] / op_time[np.searchsorted(np.unique(op), op)]
    for k, o, s in zip(idx.tolist(), op.tolist(), share.tolist()):
        f, dt = per_op[o]
        flops[k] = f * s if math.isfinite(s) else float("nan")  # zero-length kernels: no rate
        codes[k] = table.setdefault(dt, len(table))
    return flops, codes, list(table)
