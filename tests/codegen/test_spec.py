"""The spec model's stored shapes (codegen/spec.py stored_shapes): what the
reference draws, for every shipped matmul spec."""
import numpy as np
import pytest

from opgen.codegen.random_data import random_weight_tensors
from opgen.codegen.spec import stored_shapes
from opgen.codegen.resolve import load_spec, shipped_specs

MATMUL = [n for n, p in shipped_specs().items() if load_spec(p).op == "matmul"]


@pytest.mark.parametrize("name", MATMUL)
def test_stored_shapes_are_what_the_reference_draws(name):
    s = load_spec(shipped_specs()[name])
    N, K = 256, 512
    w = random_weight_tensors(s, N, K, np.random.default_rng(0))
    assert stored_shapes(s, N, K) == {k: v.shape for k, v in w.items()}


def test_stored_shapes_in_symbols():
    gptq = load_spec(shipped_specs()["gptq_v2_w4a16_g128"])
    N, K = 4096, 8192
    assert stored_shapes(gptq, N, K) == {"qweight": (K // 8, N), "scales": (K // 128, N),
                                         "zeros": (K // 128, N // 8)}
