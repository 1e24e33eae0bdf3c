"""The FLOPs and input data type of the work a trace's kernels do, from the CPU op's recorded shapes.

Why: a kernel's time says how long it ran, not how much work it did; achieved TFLOP/s, GEMM
efficiency and step MFU need the work. With ``record_shapes=True`` the profiler writes each CPU
op's ``Input Dims`` and ``Input type``, and the FLOPs of the ops that dominate a model follow from
them (multiply-add = 2 FLOPs; elementwise work is not counted, as in MFU's usual convention):

* matrix products: 2·M·N·K for ``aten::mm``/``aten::addmm`` (the bias add is not counted) and
  fp8's ``aten::_scaled_mm``, 2·B·M·N·K for ``aten::bmm``/``aten::baddbmm``, and for
  ``aten::matmul``/``aten::linear`` the same over the broadcast leading dimensions; matrix-vector
  products (``aten::mv``, ``aten::addmv``) 2·M·N.
* attention (``scaled_dot_product_attention`` and its flash, memory-efficient, cuDNN and fused
  forms; inputs B·H·S·D): forward 4·B·H·Sq·Sk·D (Q·Kᵀ and P·V, 2·B·H·Sq·Sk·D each; with V's own
  head size Dv: 2·B·H·Sq·Sk·(D + Dv)); backward 2.5 × the forward (five products of the same
  size: dV, dP, dQ, dK and the recomputed scores). A causal mask halves both: where the trace
  records the op's ``Concrete Inputs`` (torch writes them with ``record_shapes``; dpcore's own H200
  traces have none), their ``is_causal`` says so (:func:`is_causal`); else the call is counted
  unmasked: an upper bound for a causal model, at most 2×.
* convolution: 2·N·Cout·(output positions)·(Cin/groups)·(kernel positions), which is 2 ×
  (the weight's size) × N × (output positions), from the output's shape; its transposed form the
  same over the input's positions. The backward ops (``aten::convolution_backward``, cuDNN's and
  MIOpen's) carry the output's shape (the gradient's) and count 2 × the forward (input and weight
  gradients). A forward op's inputs do not give its output's size (stride and padding are
  ``Concrete Inputs``, not scanned), so a forward convolution is counted where the same trace has
  its backward (the same input and weight shapes name the output's), and left unknown otherwise.

A kernel belongs to the innermost such op around the runtime call that launched it (same
correlation id, same thread: :func:`dpcore.read.traces.collectives.range_of_launch`); when one
op launched several kernels (split-K and its reduction), its FLOPs are shared among them in
proportion to their durations, so a sum over kernels counts the op once and FLOPs / time is the
op's rate. Only its math kernels share them (:func:`is_math_kernel`: GEMM, convolution and attention
kernels by name, cuBLAS's split-K reduction among them) where it launched any: MIOpen's layout
transposes around a convolution take longer than the convolution itself, and would otherwise read
as covered work and halve the convolution's rate. An op that holds another counted op
(``scaled_dot_product_attention``'s math form runs ``bmm`` ops) gives its own kernels no FLOPs:
the inner ops count the work once. Only these op names are parsed (a few distinct shapes per
trace), so the rest of the trace's shapes cost nothing beyond the scan.
"""
from __future__ import annotations

import ast
import math
import re

import numpy as np

from dpcore.read.traces.bytescan import Columns
from dpcore.read.traces.collectives import range_of_launch

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
              "aten::_scaled_mm", "aten::mv", "aten::addmv")
#: Attention's forward ops -> the index of (query, key, value) in ``Input Dims`` (layout B·H·S·D).
ATTENTION_FWD = {"aten::scaled_dot_product_attention": 0, "aten::_scaled_dot_product_flash_attention": 0,
                 "aten::_scaled_dot_product_efficient_attention": 0,
                 "aten::_scaled_dot_product_cudnn_attention": 0,
                 "aten::_scaled_dot_product_fused_attention_overrideable": 0}
#: Attention's backward ops -> the index of the query (grad_out first, then query, key, value).
ATTENTION_BWD = {"aten::_scaled_dot_product_flash_attention_backward": 1,
                 "aten::_scaled_dot_product_efficient_attention_backward": 1,
                 "aten::_scaled_dot_product_cudnn_attention_backward": 1,
                 "aten::_scaled_dot_product_fused_attention_overrideable_backward": 1}
#: The backward's FLOPs per forward FLOP (module docstring).
ATTENTION_BACKWARD_FACTOR = 2.5
#: Attention ops -> (the position of ``is_causal`` in the op's arguments, how many arguments it
#: has): where the profiler wrote ``Concrete Inputs`` (one entry per argument, scalars as text), a
#: list of that length with "True" there is a causal call. Another length (another torch's
#: signature) or no such entry leaves the call unmasked.
ATTENTION_CAUSAL = {"aten::scaled_dot_product_attention": (5, 8),
                    "aten::_scaled_dot_product_flash_attention": (4, 7),
                    "aten::_scaled_dot_product_efficient_attention": (6, 8),
                    "aten::_scaled_dot_product_cudnn_attention": (6, 9),
                    "aten::_scaled_dot_product_fused_attention_overrideable": (5, 8),
                    "aten::_scaled_dot_product_flash_attention_backward": (11, 15),
                    "aten::_scaled_dot_product_efficient_attention_backward": (11, 13),
                    "aten::_scaled_dot_product_cudnn_attention_backward": (14, 16),
                    "aten::_scaled_dot_product_fused_attention_overrideable_backward": (13, 17)}
#: Forward convolutions: input first, weight second.
CONV_FWD = ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
            "aten::cudnn_convolution", "aten::miopen_convolution", "aten::cudnn_convolution_transpose",
            "aten::miopen_convolution_transpose", "aten::conv_transpose1d", "aten::conv_transpose2d",
            "aten::conv_transpose3d")
#: Backward convolutions -> (grad_output, input, weight) indices in ``Input Dims`` (-1: absent) and
#: how many forward-sized products the op runs.
CONV_BWD = {"aten::convolution_backward": ((0, 1, 2), 2), "aten::cudnn_convolution_backward": ((1, 0, 2), 2),
            "aten::miopen_convolution_backward": ((1, 0, 2), 2),
            "aten::cudnn_convolution_backward_input": ((1, -1, 2), 1),
            "aten::miopen_convolution_backward_input": ((1, -1, 2), 1),
            "aten::cudnn_convolution_backward_weight": ((1, 2, -1), 1),
            "aten::miopen_convolution_backward_weight": ((1, 2, -1), 1)}
#: Kernel classes by name, tried in order (the first match wins; "other" where none matches): the
#: one table of what a kernel does, read here (which kernels take an op's FLOPs) and by the kernel
#: classes of the ``gpu`` command (:func:`dpcore.read.analysis.gpu_flops.kernel_class`). Triton's
#: generated names come first (``triton_poi_fused_..._convolution_...`` is a pointwise kernel fused
#: around a convolution, not the convolution); composable kernel's (CK, AMD) mangled names state
#: their operation (``kernel_grouped_conv_fwd_...``, ``kernel_gemm_xdl_...``, ``fmha_fwd_...``; its
#: grouped convolution's weight gradient is ``kernel_batched_gemm_xdlops_bwd_weight``), and its
#: elementwise, normalization and reduction kernels are no math kernels.
NAME_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("reduction", re.compile(r"^triton_(red|per)_")),
    ("elementwise", re.compile(r"^triton_poi_")),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa", re.I)),
    ("convolution", re.compile(r"conv(?!ert)|fprop|dgrad|wgrad|igemm|winograd|miopen|xdlops_bwd_weight", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|cublas|xmma|nvjet|wgmma|matmul|Cijk_|^bmm_", re.I)),
    ("reduction", re.compile(r"reduce|softmax|norm|triton_red|triton_per|welford|argm|nll_loss|"
                             r"cross_entropy|cumsum|scan|GammaBeta", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|triton_poi|pointwise|fill|copy|"
                               r"index|cat_|where|multi_tensor_apply|foreach|rotary|quant", re.I)))
#: The classes of :data:`NAME_CLASSES` that do an op's arithmetic (GEMM, convolution, attention):
#: an op's other kernels (transposes, casts) get none of its FLOPs where it launched one of these,
#: and only these carry a TFLOP/s and an efficiency in ``gpu --kernels``.
MATH_CLASSES = ("gemm", "attention", "convolution")


def name_class(name: str) -> str:
    """The class of a kernel by its name alone (:data:`NAME_CLASSES`), "other" where none matches."""
    return next((cls for cls, pattern in NAME_CLASSES if pattern.search(name)), "other")


def is_math_kernel(name: str) -> bool:
    """Whether a kernel's name says it does an op's arithmetic (:data:`MATH_CLASSES`)."""
    return name_class(name) in MATH_CLASSES


FLOP_OPS = frozenset((*MATMUL_OPS, *ATTENTION_FWD, *ATTENTION_BWD, *CONV_FWD, *CONV_BWD))
#: c10 ScalarType names (``Input type``) -> the dtype names of the peak table.
INPUT_DTYPES = {"c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16",
                "float": "fp32", "Float": "fp32", "double": "fp64", "Double": "fp64",
                "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
                "c10::Float8_e5m2fnuz": "fp8"}


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
    """FLOPs of one matrix (or matrix-vector) product from its op name and ``Input Dims``; NaN when
    the shapes do not describe one (a missing shape, 1-D operands, mismatched inner dimensions)."""
    shapes = [_shape(d) for d in dims]
    if op in ("aten::mv", "aten::addmv"):
        at = 0 if op == "aten::mv" else 1
        mat, vec = (shapes[at], shapes[at + 1]) if len(shapes) > at + 1 else (None, None)
        if mat and vec and len(mat) == 2 and vec == [mat[1]]:
            return 2.0 * mat[0] * mat[1]
        return float("nan")
    pick = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::matmul": (0, 1), "aten::_scaled_mm": (0, 1),
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


def attention_flops(q: list[int] | None, k: list[int] | None, v: list[int] | None = None,
                    causal: bool = False, backward: bool = False) -> float:
    """FLOPs of scaled-dot-product attention on query ``q`` (B·H·Sq·D), key ``k`` (B·H·Sk·D) and
    value ``v`` (B·H·Sk·Dv, Dv = D where absent): forward 2·B·H·Sq·Sk·(D + Dv), i.e. 4·B·H·Sq·Sk·D;
    halved where ``causal`` (the masked half of the scores is skipped); the backward 2.5 × the
    forward. NaN where the shapes are not 4-D with matching batch, heads and head size."""
    if not q or not k or len(q) != 4 or len(k) != 4 or q[:2] != k[:2] or q[3] != k[3]:
        return float("nan")
    dv = v[3] if v and len(v) == 4 and v[:3] == k[:3] else q[3]
    fwd = 2.0 * q[0] * q[1] * q[2] * k[2] * (q[3] + dv) / (2 if causal else 1)
    return fwd * (ATTENTION_BACKWARD_FACTOR if backward else 1.0)


def conv_flops(x: list[int] | None, w: list[int] | None, y: list[int] | None) -> float:
    """FLOPs of one convolution from its input ``x`` (N·C·spatial, may be None), weight ``w``
    (Cout·Cin/groups·kernel) and output ``y`` (may be None): 2 × w's size × N × the positions of the
    tensor whose channels are w's first dimension (the output; the input of a transposed
    convolution). NaN where neither gives them."""
    if not w or len(w) < 3:
        return float("nan")
    side = next((t for t in (y, x) if t and len(t) == len(w) and t[1] == w[0]), None)
    if side is None:
        return float("nan")
    return 2.0 * math.prod(w) * side[0] * math.prod(side[2:])


def is_causal(op: str, concrete: list) -> bool | None:
    """Whether an attention call was causal, from its ``Concrete Inputs`` (:data:`ATTENTION_CAUSAL`);
    None where they do not say (not written, another signature)."""
    at = ATTENTION_CAUSAL.get(op)
    if at is None or len(concrete) != at[1] or concrete[at[0]] not in ("True", "False"):
        return None
    return concrete[at[0]] == "True"


def op_flops(op: str, dims: list, conv_out: dict[tuple, list[int]] | None = None,
             concrete: list | None = None) -> float:
    """FLOPs of one op with recorded shapes (module docstring); NaN where unknown. ``conv_out``:
    {(input, weight) shapes: output shape} learnt from the trace's backward convolutions;
    ``concrete``: the op's ``Concrete Inputs`` (an attention call's causal mask halves it)."""
    if op in MATMUL_OPS:
        return matmul_flops(op, dims)
    shapes = [_shape(d) for d in dims]
    at = ATTENTION_FWD.get(op, ATTENTION_BWD.get(op))
    if at is not None:
        if len(shapes) < at + 2:
            return float("nan")
        return attention_flops(shapes[at], shapes[at + 1], shapes[at + 2] if len(shapes) > at + 2 else None,
                               causal=bool(is_causal(op, concrete or [])), backward=op in ATTENTION_BWD)
    if op in CONV_BWD:
        (iy, ix, iw), times = CONV_BWD[op]
        y, x, w = (shapes[i] if 0 <= i < len(shapes) else None for i in (iy, ix, iw))
        return times * conv_flops(x, w, y)  # a weight-gradient op names no weight: unknown
    if op in CONV_FWD and len(shapes) >= 2 and shapes[0] and shapes[1]:
        y = (conv_out or {}).get((tuple(shapes[0]), tuple(shapes[1])))
        return conv_flops(shapes[0], shapes[1], y)
    return float("nan")


def input_dtype(types: list, op: str) -> str:
    """The data type of the op's first matrix operand ("" unknown)."""
    at = {"aten::addmm": 1, "aten::baddbmm": 1, "aten::addmv": 1}.get(op, ATTENTION_BWD.get(op, 0))
    if op in CONV_BWD:
        at = CONV_BWD[op][0][0]
    return INPUT_DTYPES.get(str(types[at]), "") if len(types) > at else ""


def _conv_outputs(names: list, dims_t: list, name_c: np.ndarray, dims_c: np.ndarray) -> dict[tuple, list[int]]:
    """{(input shape, weight shape): output shape} of the trace's backward convolutions that name
    all three (what a forward convolution's output is, its stride and padding not being scanned)."""
    out: dict[tuple, list[int]] = {}
    bwd = [i for i, n in enumerate(names) if n in CONV_BWD and CONV_BWD[n][0][1] >= 0 and CONV_BWD[n][0][2] >= 0]
    if not bwd:
        return out
    sel = np.isin(name_c, bwd)
    for nc, dc in set(zip(name_c[sel].tolist(), dims_c[sel].tolist())):
        if dc < 0:
            continue
        (iy, ix, iw), _ = CONV_BWD[names[nc]]
        shapes = [_shape(d) for d in _dims(dims_t[dc])]
        if len(shapes) > max(iy, ix, iw):
            y, x, w = shapes[iy], shapes[ix], shapes[iw]
            if y and x and w:
                out[(tuple(x), tuple(w))] = y
    return out


def _holders(cols: Columns, ops: np.ndarray, is_op: np.ndarray) -> set[int]:
    """The ops (indices ``ops``) that hold another op of ``is_op`` on their thread: their inner ops
    count the work."""
    ntid = len(cols.tables["tid"]) + 1
    thread = cols.codes["pid"].astype(np.int64) * ntid + cols.codes["tid"]
    every = np.flatnonzero(is_op & (cols.stream < 0))
    order = np.lexsort((cols.ts[every], thread[every]))
    every = every[order]
    th, ts, end = thread[every], cols.ts[every], cols.ts[every] + cols.dur[every]
    out = set()
    for o in ops.tolist():
        lo = np.searchsorted(th, thread[o], "left")
        hi = np.searchsorted(th, thread[o], "right")
        a = lo + np.searchsorted(ts[lo:hi], cols.ts[o], "left")
        b = lo + np.searchsorted(ts[lo:hi], cols.ts[o] + cols.dur[o], "right")
        inner = (end[a:b] <= cols.ts[o] + cols.dur[o]) & (every[a:b] != o) & \
                ~((ts[a:b] == cols.ts[o]) & (end[a:b] == cols.ts[o] + cols.dur[o]) & (every[a:b] < o))
        if inner.any():
            out.add(o)
    return out


def kernel_matmuls(cols: Columns, kernels: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(FLOPs, codes, dtype table with "" first) of every event: for the GPU kernels ``kernels`` (a
    mask) launched under an op with FLOPs and shapes (:data:`FLOP_OPS`), its share of the op's
    FLOPs and the op's input dtype; NaN and "" elsewhere (see the module docstring)."""
    n = cols.ts.size
    flops, codes, table = np.full(n, np.nan), np.zeros(n, np.int32), {"": 0}
    dims_t = cols.tables.get("in_dims")
    if not dims_t or dims_t == [""] or not kernels.any():
        return flops, codes, list(table)
    names = cols.tables["name"]
    is_op = np.asarray([x in FLOP_OPS for x in names] + [False], bool)[cols.codes["name"]]
    has_dims = np.asarray([d != "" for d in dims_t] + [False], bool)[cols.codes["in_dims"]]
    idx = np.flatnonzero(kernels)
    op = range_of_launch(cols, is_op & has_dims, idx)
    found = op >= 0
    idx, op = idx[found], op[found]
    if not idx.size:
        return flops, codes, list(table)
    math_k = np.asarray([is_math_kernel(x) for x in names] + [False], bool)[cols.codes["name"][idx]]
    has_math = np.zeros(cols.ts.size, bool)
    has_math[op[math_k]] = True
    sharing = math_k | ~has_math[op]  # an op's math kernels, or all of its kernels where it launched none
    types_t = cols.tables["in_types"]
    conv_out = _conv_outputs(names, dims_t, cols.codes["name"], cols.codes["in_dims"])
    holders = _holders(cols, np.unique(op), is_op & has_dims)
    per_op: dict[int, tuple[float, str]] = {}
    concrete_t = cols.tables.get("in_concrete") or [""]
    concrete_c = cols.codes["in_concrete"] if "in_concrete" in cols.codes else np.zeros(n, np.int64)
    parsed: dict[tuple[int, int, int, int], tuple[float, str]] = {}  # each distinct (op, shapes, types) once
    for o in np.unique(op).tolist():
        key = (int(cols.codes["name"][o]), int(cols.codes["in_dims"][o]), int(cols.codes["in_types"][o]),
               int(concrete_c[o]) if names[int(cols.codes["name"][o])] in ATTENTION_CAUSAL else -1)
        if key not in parsed:
            name = names[key[0]]
            concrete = _dims(concrete_t[key[3]]) if key[3] >= 0 else []
            parsed[key] = (op_flops(name, _dims(dims_t[key[1]]), conv_out, concrete),
                           input_dtype(_dims(types_t[key[2]]), name))
        f, dt = parsed[key]
        per_op[o] = (float("nan") if o in holders else f, dt)
    slot = np.searchsorted(np.unique(op), op)
    op_time = np.bincount(slot, weights=np.where(sharing, cols.dur[idx], 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(sharing, cols.dur[idx] / op_time[slot], np.nan)
    for k, o, s in zip(idx.tolist(), op.tolist(), share.tolist()):
        f, dt = per_op[o]
        flops[k] = f * s if math.isfinite(s) else float("nan")  # zero-length kernels: no rate
        codes[k] = table.setdefault(dt, len(table))
    return flops, codes, list(table)
