"""Random valid inputs (codegen/random_data.py): codes over the whole code
range, weight tensors in the exact storage, of a sensible magnitude; the
inputs of the 8-bit-activation specs (tests/a8_examples.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen import numerics as nx
from opgen.codegen.random_data import random_activation, random_codes, random_weight_tensors
from opgen.codegen.reference import (code_values, dequantize, n_raw_codes, reference_matmul,
                                     reference_matmul_f32, zeros_nk)
from opgen.codegen.resolve import load_spec
from opgen.codegen.spec import scale_shape, stored_shapes, weight_storage_shape, zero_shape
from opgen.codegen.storage import decode_storage
from opgen.codegen.validate import decode_ints
from a8_examples import A8_PATHS
from weight_strategies import FLOAT16_DTYPES, SETTINGS, storage_dtype, weights


@settings(**SETTINGS)
@given(weights())
def test_random_codes_cover_the_code_range(wnk):
    w, _, _ = wnk
    rng = np.random.default_rng(1)
    codes = random_codes(w, 64, 1024, rng)
    vals = code_values(w, codes)
    assert np.isfinite(vals).all()
    if w.dtype in FLOAT16_DTYPES:
        return
    n_valid = int(np.isfinite(code_values(w, np.arange(n_raw_codes(w)))).sum())
    assert len(np.unique(codes)) == n_valid


@settings(**SETTINGS)
@given(weights(), st.integers(0, 2**32 - 1))
def test_random_weight_tensors(wnk, seed):
    w, N, K = wnk
    t = random_weight_tensors(w, N, K, np.random.default_rng(seed))
    assert t["qweight"].shape == weight_storage_shape(w, N, K)
    assert t["qweight"].dtype == storage_dtype(w)
    if w.scale:
        assert t["scales"].shape == scale_shape(w.scale, N, K)
        sv = nx.from_storage(t["scales"], w.scale.dtype)
        assert np.all(sv > 0) and np.all(np.isfinite(sv))
    else:
        assert "scales" not in t
    if w.zero.kind in ("int", "float"):
        assert t["zeros"].shape == zero_shape(w, N, K)
    dq = dequantize(w, t, N, K)
    assert np.all(np.isfinite(dq)) and np.any(dq != 0)
    # sensible magnitude when the scale sets it (not so for "q * s - z" with
    # an integer z, which is unscaled): N(0,1) activations give O(1) outputs
    if w.scale is not None and not (w.formula == "q * s - z" and w.zero.kind in ("const", "int")):
        assert np.abs(dq).max() * math.sqrt(K) < 100


# --- the 8-bit-activation examples (issue 29) -------------------------------------------------

A8 = {n: load_spec(p) for n, p in A8_PATHS.items()}


@pytest.mark.parametrize("name", sorted(A8))
def test_random_inputs_of_the_a8_examples(name):
    """Weights in their storage with every q - z an integer the 8-bit decode
    holds, int8 / e4m3 activation codes with a per-row scale (none for the
    int32 output), and a finite reference product of them."""
    spec = A8[name]
    rng = np.random.default_rng(2)
    M, N, K = 3, 24, 256
    t = random_weight_tensors(spec, N, K, rng)
    assert {k: v.shape for k, v in t.items()} == stored_shapes(spec, N, K)
    qz = code_values(spec.b, decode_storage(spec.b, t["qweight"])) - zeros_nk(spec, t, N, K)
    lo, hi = decode_ints(spec)
    assert np.all((lo <= qz) & (qz <= hi))
    a, a_scale = random_activation(spec, M, K, rng)
    assert a.dtype == (np.int8 if spec.a.dtype == "int8" else np.uint8) and a.shape == (M, K)
    assert (a_scale is None) == (spec.a.scale is None)
    out = reference_matmul(spec, a, t, a_scale)
    if spec.out.dtype == "int32":
        assert out.dtype == np.int32 and np.any(out != 0)
    else:
        ref = reference_matmul_f32(spec, a, t, a_scale)
        assert np.all(np.isfinite(ref)) and 0.05 < np.abs(ref).mean() < 20    # O(1) outputs
