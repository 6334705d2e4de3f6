"""The one tolerance policy (codegen/tolerance.py): from the dtypes a kernel
rounds through, with the margins its docstring states; 0 for the int32 output."""
import math

import numpy as np
import pytest

from opgen.codegen import numerics as nx, random_data as D, reference as R
from opgen.codegen.resolve import load_spec
from opgen.codegen.spec import Activation, Output, Scale, Spec, Weight
from opgen.codegen.tolerance import BENCH_FACTOR, output_error, tolerance
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


def _emulated_kernel(spec, M, N, K, seed):
    """(reference, an output rounded as a kernel rounds: the dequantized
    weight to fp16, the sums exact, the result to the out dtype)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    t = D.random_weight_tensors(spec, N, K, rng)
    w = R.dequantize(spec, t, N, K)
    a, s = D.random_activation(spec, M, K, rng)
    ref = R.reference_matmul_f32(spec, a, t, a_scale=s, w_real=w).astype(np.float64)
    got = R.activation_to_float(spec, a, s).astype(np.float64) @ w.astype(np.float16).astype(np.float64).T
    got = nx.from_storage(nx.to_storage(got.astype(np.float32), spec.out.dtype), spec.out.dtype)
    return ref, np.asarray(got, dtype=np.float64)


@pytest.mark.parametrize("name", ["w4a16_sym_g128", "fp8_e4m3_w8a8", "w4a8_int8"])
def test_output_error_passes_rounding_and_catches_one_wrong_output(name):
    spec = load_spec(name)
    ref, got = _emulated_kernel(spec, 130, 4104, 256, seed=3)
    tol = tolerance(spec)
    assert output_error(spec, got, ref) < tol / 4                   # a kernel's own rounding
    bad = got.copy()
    rms = np.sqrt(np.mean(ref ** 2))
    i = np.unravel_index(np.argmin(np.abs(np.abs(ref) - rms)), ref.shape)
    bad[i] = 0.0                                                    # one typical output lost
    fro = np.linalg.norm(bad - ref) / np.linalg.norm(ref)
    assert fro < tol < output_error(spec, bad, ref)                 # unseen by the norm alone
    bad = got.copy()
    bad[-1, -8:] *= -1                                              # a tail column pair's sign
    assert output_error(spec, bad, ref) > tol


def test_an_int32_output_error_is_any_difference():
    spec = A8["int8_int4_int32"]
    ref = np.arange(12, dtype=np.int64).reshape(3, 4) * (1 << 26)
    assert output_error(spec, ref.copy(), ref) == 0.0
    off = ref.copy()
    off[1, 2] += 1
    assert output_error(spec, off, ref) > tolerance(spec)
