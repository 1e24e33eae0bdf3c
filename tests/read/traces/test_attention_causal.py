"""A causal attention call counts half the FLOPs of an unmasked one, where the trace says it was
causal: the profiler's ``Concrete Inputs`` (written with record_shapes by recent torch) hold each
call's ``is_causal``. Checked on the MI300X Stable Diffusion 3.5 trace in ../shared/traces, whose
CLIP text encoders run causal attention (88 calls, sequence 77) beside the MMDiT's unmasked
attention (153 calls); a trace without Concrete Inputs (dpcore's own H200 traces) stays unmasked."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dpcore.read.traces.matmuls import attention_flops, op_flops
from dpcore.read.traces.reader import read_trace

SD35 = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "tl_mi300x_xdit_sd35_1r" / "rank0.json.gz"
SDPA = "aten::scaled_dot_product_attention"
FLASH = "aten::_scaled_dot_product_flash_attention"
Q = [[1, 12, 77, 64], [1, 12, 77, 64], [1, 12, 77, 64], [], [], [], [], []]


def test_concrete_inputs_halve_a_causal_call() -> None:
    full = 4.0 * 12 * 77 * 77 * 64
    assert op_flops(SDPA, Q) == pytest.approx(full)  # nothing said: unmasked
    assert op_flops(SDPA, Q, concrete=["", "", "", "", "0.", "True", "0.125", "False"]) == pytest.approx(full / 2)
    assert op_flops(SDPA, Q, concrete=["", "", "", "", "0.", "False", "0.125", "False"]) == pytest.approx(full)
    # another signature (a list of another length): not read, unmasked
    assert op_flops(SDPA, Q, concrete=["", "", "", "", "0.", "True"]) == pytest.approx(full)
    assert op_flops(FLASH, Q[:7], concrete=["", "", "", "0.", "True", "False", "0.125"]) == pytest.approx(full / 2)
    bwd = "aten::_scaled_dot_product_flash_attention_backward"
    dims = [[1, 12, 77, 64]] * 5 + [[]] * 10
    concrete = [""] * 10 + ["0.", "True", "", "", "0.125"]
    assert op_flops(bwd, dims, concrete=concrete) == pytest.approx(2.5 * full / 2)


@pytest.mark.skipif(not SD35.is_file(), reason="../shared/traces/ is not beside the checkout")
def test_the_sd35_trace_counts_its_text_encoders_causal() -> None:
    """The attention kernels' FLOPs are Σ over the trace's flash-attention calls of
    4·B·H·Sq·Sk·D, halved where the call's Concrete Inputs say is_causal (computed here from
    the raw JSON)."""
    with gzip.open(SD35, "rt") as f:
        raw = json.load(f)["traceEvents"]
    want, causal = 0.0, 0
    for e in raw:
        if e.get("name") == FLASH and e.get("cat") == "cpu_op":
            q, k, v = e["args"]["Input Dims"][:3]
            is_causal = e["args"]["Concrete Inputs"][4] == "True"
            causal += is_causal
            want += attention_flops(q, k, v, causal=is_causal)
    assert causal == 88
    ev = read_trace(SD35)
    attn = ev[(ev["stream"] >= 0).to_numpy() & ev["name"].astype(str).eq("attn_fwd").to_numpy()]
    assert len(attn) == 241
    assert float(attn["flops"].sum()) == pytest.approx(want, rel=1e-9)
