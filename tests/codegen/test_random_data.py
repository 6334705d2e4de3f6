"""Random valid inputs (codegen/random_data.py): codes over the whole code
range, weight tensors in the exact storage, of a sensible magnitude."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen import numerics as nx
from opgen.codegen.random_data import random_codes, random_weight_tensors
from opgen.codegen.reference import code_values, dequantize, n_raw_codes
from opgen.codegen.spec import scale_shape, weight_storage_shape, zero_shape
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
