"""The one tolerance policy (codegen/tolerance.py): from the dtypes a kernel
rounds through, with the margins its docstring states; 0 for the int32 output."""
import math

from opgen.codegen.resolve import load_spec
from opgen.codegen.spec import Activation, Output, Scale, Spec, Weight
from opgen.codegen.tolerance import BENCH_FACTOR, tolerance
from a8_examples import A8_PATHS

SPEC = Spec(name="w4a16_fake", op="matmul", a=Activation("float16"),
            b=Weight("uint4", scale=Scale("float16", "group", 128)), out=Output("float16"))


def test_tolerance():
    assert math.isclose(tolerance(SPEC), 2e-3, rel_tol=0.05)
    bf16 = Spec(name="x", op="matmul", a=Activation("bfloat16"), b=None, out=Output("bfloat16"))
    f32 = Spec(name="x", op="matmul", a=Activation("float16"), b=None, out=Output("float32"))
    assert 1e-2 <= tolerance(bf16) <= 2e-2
    assert 5e-4 <= tolerance(f32) <= 1.1e-3
    assert tolerance(f32) < tolerance(SPEC) < tolerance(bf16)


def test_int8_activations_allow_fp16_rounding_and_the_bench_only_clear_faults():
    i8 = Spec(name="x", op="matmul", a=Activation("int8", scale="row"), b=None,
              out=Output("float16"))
    assert tolerance(i8) == tolerance(SPEC)
    # fp8 codes are read exactly too: bf16 out is the larger rounding (8.8e-3)
    f8 = Spec(name="x", op="matmul", a=Activation("float8_e4m3", scale="row"), b=None,
              out=Output("bfloat16"))
    assert 8e-3 < tolerance(f8) < 1e-2
    assert BENCH_FACTOR > 1


A8 = {n: load_spec(p) for n, p in A8_PATHS.items()}


def test_an_int32_output_is_exact():
    assert tolerance(A8["int8_int4_int32"]) == 0.0


def test_sub_byte_weights_with_8_bit_activations_as_their_w8a8_twins():
    """Exact products of codes and q - z, float32 scaling of group sums: the
    same allowance as W8A8 of the same activation and output dtypes."""
    w8a8, fp8 = load_spec("w8a8_int8"), load_spec("fp8_e4m3_w8a8")
    for name in ("w4a8_int8", "w4a8_int8_g128", "bitnet_b158_a8"):
        assert tolerance(A8[name]) == tolerance(w8a8) > 0
    assert tolerance(A8["w4a8_fp8"]) == tolerance(fp8) > 0
