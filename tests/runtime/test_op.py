"""The user-facing ops on the CPU (runtime/op.py): what needs no GPU.  On
the GPU: test_op_gpu.py."""
import pytest

import opgen
from opgen.codegen.resolve import as_spec
from opgen.runtime.device import NoGPUError, has_gpu
from opgen.runtime.op import quantize_spec


def test_load_without_gpu_says_so():
    if has_gpu():
        pytest.skip("a GPU is present")
    with pytest.raises(NoGPUError, match="opgen build"):
        opgen.load("gptq_v2_w4a16_g128", N=1024, K=1024)


def test_the_fused_linear_quantizes_to_the_spec_activation():
    q = quantize_spec(as_spec("w8a8_int8"))
    assert q.op == "quantize" and q.a.dtype == "float16" and q.out.dtype == "int8"
    assert q.name == "quantize_int8_float16"
    assert quantize_spec(as_spec("fp8_e4m3_w8a8"), "bfloat16").name == "quantize_float8_e4m3_bfloat16"
