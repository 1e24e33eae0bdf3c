"""One table of kernel classes by name serves both the FLOPs attribution (which kernels of an op
take its FLOPs, dpcore.read.traces.matmuls) and the ``gpu --kernels`` classes
(dpcore.read.analysis.gpu_flops.kernel_class): checked on the kernel names of the MI300X traces
in ../shared/traces (composable kernel's, MIOpen's, rocBLAS's and Triton's), where the two once
disagreed."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dpcore.read.analysis import gpu_flops
from dpcore.read.analysis.gpu_flops import RATED_CLASSES, kernel_class
from dpcore.read.analysis.gpu_kernels import kernel_classes
from dpcore.read.traces import matmuls
from dpcore.read.traces.reader import read_trace

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
MI300X = [SHARED / "tracelens_mi300_resnet_ddp_1r" / "resnet_act_checkpoint.json.gz",
          SHARED / "tl_mi300x_xdit_sd35_1r" / "rank0.json.gz"]
needs_shared = pytest.mark.skipif(not all(p.is_file() for p in MI300X),
                                  reason="../shared/traces/ (the MI300X traces) is not beside the checkout")


def _kernel_names(path: Path) -> set[str]:
    with gzip.open(path, "rt") as f:
        return {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"}


def test_one_definition() -> None:
    """gpu_flops holds no table of its own: its classes and its rated classes are matmuls'."""
    assert not hasattr(gpu_flops, "_CLASS_RE")
    assert RATED_CLASSES is matmuls.MATH_CLASSES
    assert not hasattr(matmuls, "MATH_KERNEL")


@needs_shared
@pytest.mark.parametrize("path", MI300X, ids=lambda p: p.parent.name)
def test_math_kernels_are_the_math_classes_on_mi300x_names(path: Path) -> None:
    """Every kernel name of the trace: a math kernel for the FLOPs exactly where its class is
    rated. (Before: every ``_ZN2ck`` name was a math kernel whatever it did, and Triton's
    ``triton_poi_fused__scaled_dot_product_flash_attention_*`` was one for the FLOPs but an
    elementwise kernel in the classes.)"""
    names = _kernel_names(path)
    assert any(n.startswith("_ZN2ck") for n in names)  # the CK kernels this test is about
    for n in names:
        assert matmuls.is_math_kernel(n) == (kernel_class(n, "compute") in RATED_CLASSES), n


@pytest.mark.parametrize("name,cls", [
    # composable kernel (CK), from the MI300X traces
    ("_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_28GridwiseGemm",
     "convolution"),
    ("_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47GridwiseGemm_bk0mk1_bk0nk1",
     "convolution"),  # grouped convolution's weight gradient (launched by aten::convolution_backward)
    # CK kernels that do no op's arithmetic (made names in CK's spelling)
    ("_ZN2ck21kernel_elementwise_1dINS_5TupleIJPKDF16_EEENS1_IJPS2_EEENS_16tensor_operation", "elementwise"),
    ("_ZN2ck16tensor_operation6device24kernel_tensor_rearrangeINS_23GridwiseTensorRearrange", "other"),
    ("triton_poi_fused__scaled_dot_product_flash_attention_cat_transpose_view_10", "elementwise"),
    ("triton_red_fused__unsafe_view_add_clone_convolution_native_layer_norm_slice_transpose_view_4", "reduction"),
    ("attn_fwd", "attention"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x96x128_MI16x16x1_SN_LDSB1", "gemm"),
    ("igemm_wrw_gtcx3_nhwc_bf16_bx0_ex1_bt64x32x32_wt16x16x16_ws1x1_wr2x1", "convolution"),
])
def test_class_and_math_of_amd_names(name: str, cls: str) -> None:
    assert kernel_class(name, "compute") == cls
    assert matmuls.is_math_kernel(name) == (cls in ("gemm", "attention", "convolution"))


@needs_shared
def test_ck_weight_gradients_count_as_convolutions_on_the_resnet_trace() -> None:
    """The resnet trace's 44 CK ``kernel_batched_gemm_xdlops_bwd_weight`` kernels are its
    convolutions' weight gradients: the gemm rows hold only rocBLAS's Cijk_ kernels."""
    names = _kernel_names(MI300X[0])
    with gzip.open(MI300X[0], "rt") as f:
        kernels = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    cijk = sum(n.startswith("Cijk_") for n in kernels)
    bwd_weight = sum("xdlops_bwd_weight" in n for n in kernels)
    assert (cijk, bwd_weight) == (40, 44)
    assert any("xdlops_bwd_weight" in n for n in names)
    df = kernel_classes(read_trace(MI300X[0]), "AMD Instinct MI300X")
    gemm = df[df["kernel_class"] == "gemm"]
    assert int(gemm["calls"].sum()) == cijk
    conv = df[df["kernel_class"] == "convolution"]
    assert int(conv["calls"].sum()) == 285  # 241 MIOpen igemm and CK grouped-conv kernels + the 44
