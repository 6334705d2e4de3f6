"""The spec model (codegen/spec.py): the stored shapes (stored_shapes), what
the reference draws, for every shipped matmul spec and the 8-bit-activation
specs (tests/a8_examples.py); the float types' exact integers and
largest values (the validator's bounds); the activation and output vocabulary."""

import numpy as np
import pytest

from opgen.codegen.random_data import random_weight_tensors
from opgen.codegen import spec as S
from opgen.codegen.spec import stored_shapes
from opgen.codegen.resolve import load_spec, shipped_specs

PATHS = shipped_specs()
MATMUL = sorted(n for n, p in PATHS.items() if load_spec(p).op == "matmul")


@pytest.mark.parametrize("name", MATMUL)
def test_stored_shapes_are_what_the_reference_draws(name):
    s = load_spec(PATHS[name])
    N, K = 256, 512
    w = random_weight_tensors(s, N, K, np.random.default_rng(0))
    assert stored_shapes(s, N, K) == {k: v.shape for k, v in w.items()}


def test_stored_shapes_in_symbols():
    gptq = load_spec(shipped_specs()["gptq_v2_w4a16_g128"])
    N, K = 4096, 8192
    assert stored_shapes(gptq, N, K) == {"qweight": (K // 8, N), "scales": (K // 128, N),
                                         "zeros": (K // 128, N // 8)}


def _bf16(x: float) -> float:
    """x rounded to bfloat16 (the top 16 bits of a float32, ties to even)."""
    b = int(np.array(x, np.float32).view(np.uint32))
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return float(np.array(b, np.uint32).view(np.float32))


def test_exact_ints_and_finite_max_are_the_types():
    """The bounds the validator holds zero points and codebooks to
    (validate.kernel_problems) are the types' own."""
    E16, Eb = S.EXACT_INTS["float16"], S.EXACT_INTS["bfloat16"]
    assert all(float(np.float16(x)) == x for x in range(-E16, E16 + 1))
    assert float(np.float16(E16 + 1)) != E16 + 1
    assert all(_bf16(x) == x for x in range(-Eb, Eb + 1)) and _bf16(Eb + 1) != Eb + 1
    assert S.FINITE_MAX["float16"] == float(np.finfo(np.float16).max)
    assert S.FINITE_MAX["bfloat16"] == (2 - 2 ** -7) * 2.0 ** 127
    assert set(S.EXACT_INTS) == set(S.FINITE_MAX) == {"float16", "bfloat16"}


def test_activation_and_output_vocabulary():
    """8-bit activation codes are activations; int32 (the raw accumulator) is
    an output of its own, apart from those every matmul takes."""
    assert set(S.A8_DTYPES) == {"int8", "float8_e4m3"} and set(S.A8_DTYPES) <= set(S.ACT_DTYPES)
    assert S.INT_OUT_DTYPES == ("int32",) and not set(S.INT_OUT_DTYPES) & set(S.OUT_DTYPES)
