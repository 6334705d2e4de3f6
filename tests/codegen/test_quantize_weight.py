"""Weight quantization (codegen/quantize_weight.py): exactly the storage the
spec describes, every element the nearest representable value, the error
within the format's bound, known values of the common formats; the example
specs of 8-bit activations with sub-byte weights (tests/codegen/a8_specs)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen import numerics as nx
from opgen.codegen.quantize_weight import quantize
from opgen.codegen.reference import (code_range, code_values, dequantize, n_raw_codes,
                                     scale_logical, scales_nk, zeros_nk)
from opgen.codegen.resolve import load_spec
from opgen.codegen.spec import (WEIGHT_CODES, Pack, Scale, Weight, Zero, scale_shape,
                                stored_shapes, weight_code, weight_storage_shape, zero_shape)
from opgen.codegen.storage import blocks, decode_storage
from opgen.codegen.validate import decode_ints
from weight_strategies import FLOAT16_DTYPES, SETTINGS, storage_dtype, weights


def _fixed_zero_window(w: Weight):
    """With a fixed zero (none / const), u/s must lie in [L, H]: u = w for
    "(q - z) * s", u = w + z for "q * s - z". None for fitted zeros."""
    if w.zero.kind not in ("none", "const"):
        return None
    lo, hi = code_range(w)
    z = w.zero.value if w.zero.kind == "const" else 0
    return (lo - z, hi - z) if w.formula == "(q - z) * s" else (lo, hi)


def _test_matrix(w: Weight, N: int, K: int, rng) -> np.ndarray:
    """Weights the format can represent without clipping: a one-sided fixed
    zero (uint codes, no zero) gets values of that sign only."""
    x = rng.standard_normal((N, K)).astype(np.float32)
    x[rng.random((N, K)) < 0.02] *= 8                     # some outliers
    win = _fixed_zero_window(w)
    if win is not None:
        if win[0] >= 0:
            x = np.abs(x)
        elif win[1] <= 0:
            x = -np.abs(x)
    return x


def _candidates(w: Weight) -> np.ndarray:
    raws = np.arange(n_raw_codes(w))
    vals = code_values(w, raws)
    return np.unique(vals[np.isfinite(vals)])


def _eps(dtype) -> float:
    return {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "e8m0": 0.0,
            None: 0.0}[dtype]


@settings(**SETTINGS)
@given(weights(), st.integers(0, 2**32 - 1))
def test_quantize_storage_format_and_error(wnk, seed):
    w, N, K = wnk
    rng = np.random.default_rng(seed)
    x = _test_matrix(w, N, K, rng)
    t = quantize(w, x)
    # exactly the storage the spec describes
    assert set(t) == {"qweight"} | ({"scales"} if w.scale else set()) \
        | ({"zeros"} if w.zero.kind in ("int", "float") else set())
    assert t["qweight"].shape == weight_storage_shape(w, N, K)
    assert t["qweight"].dtype == storage_dtype(w)
    if w.scale:
        assert t["scales"].shape == scale_shape(w.scale, N, K)
        assert t["scales"].dtype == nx.FLOAT_STORAGE_DTYPES[w.scale.dtype]
        assert np.all(nx.from_storage(t["scales"], w.scale.dtype) > 0)
    if w.zero.kind in ("int", "float"):
        assert t["zeros"].shape == zero_shape(w, N, K)

    dq = dequantize(w, t, N, K)
    assert dq.dtype == np.float32 and dq.shape == (N, K)
    if w.dtype in FLOAT16_DTYPES:                      # a plain cast
        assert np.array_equal(dq, nx.from_storage(nx.to_storage(x, w.dtype), w.dtype))
        return

    s = scales_nk(w, t, N, K).astype(np.float64)
    z = zeros_nk(w, t, N, K).astype(np.float64)
    err = np.abs(dq.astype(np.float64) - x)

    # 1. every element is the *nearest* representable value given the stored
    #    scale and zero (up to float32 rounding of w/s + z)
    cand = _candidates(w)[None, None, :]
    rep = (cand - z[..., None]) * s[..., None] if w.formula == "(q - z) * s" \
        else cand * s[..., None] - z[..., None]
    best = np.abs(rep - x[..., None]).min(axis=-1)
    span = float(cand.max() - cand.min())
    slack = 1e-5 * s * max(span, 1.0) + 1e-5 * np.abs(z) + 1e-6 * np.abs(x)
    assert np.all(err <= best + slack), float((err - best).max())

    # 2. the quantization error is within the format's bound (without a
    #    scale the range is fixed and clipping is expected)
    code = weight_code(w)
    if w.scale is None:
        return
    if code.kind == "float":                           # fp8: relative rounding
        mbits = {"float8_e4m3": 3, "float8_e5m2": 2}[w.dtype]
        sub = float(cand[cand > 0].min())              # subnormal step
        bound = np.abs(x) * 2.0**-(mbits + 1) * (1 + 1e-4) + s * sub / 2 \
            + np.abs(x) * 2 * _eps(w.scale.dtype)
        assert np.all(err <= bound)
        return
    if code.kind == "ternary" and w.zero.kind == "none":
        # BitNet: s = mean|w| per block, q = clip(round(w / s), -1, 1)
        blk = blocks(w, x.astype(np.float64))
        s_blk = np.abs(blk).mean(axis=-1)
        s_blk = np.where(s_blk > 0, s_blk, 1).astype(np.float32)
        s_want = nx.from_storage(nx.to_storage(s_blk, w.scale.dtype), w.scale.dtype)
        assert np.array_equal(scale_logical(w, t, N, K), s_want)
        return
    if w.zero.kind == "int":
        # a zero dtype too narrow for the zero point clips it: then (1.) is the
        # whole contract ("q * s - z" has z in real units: check for clipping)
        zc = WEIGHT_CODES[w.zero.dtype]
        lo, hi = code_range(w)
        if code.kind == "table" and w.formula == "(q - z) * s":
            return          # rounding z to an integer shifts a table's range: no bound
        if w.formula == "(q - z) * s":
            if not (zc.lo + w.zero.offset <= lo and hi <= zc.hi + w.zero.offset):
                return
        elif np.any(z == zc.lo + w.zero.offset) or np.any(z == zc.hi + w.zero.offset):
            return
    win = _fixed_zero_window(w)
    if win is not None and not (win[0] <= 0 <= win[1]):
        return                                         # 0 itself is out of range
    gap = float(np.diff(cand[0, 0]).max()) if cand.size > 1 else 0.0
    eps = _eps(w.scale.dtype) + _eps(w.zero.dtype if w.zero.kind == "float" else None)
    bound = s * (gap / 2 + 2 * max(span, 1.0) * eps) * (1 + 1e-4) + 1e-6 * np.abs(x)
    assert np.all(err <= bound), float((err / s).max())


def test_quantize_known_values():
    # int4 symmetric per channel: s = absmax / 7, round half to even
    w = Weight("int4", "nt", Pack("uint8", "k", (0, 1)), Scale("float32", "channel"))
    x = np.array([[7.0, -7.0, 2.5, 3.5, -0.5, 0.0, 1.0, 8.0]], np.float32)
    t = quantize(w, x)
    assert t["scales"].tolist() == [pytest.approx(8 / 7)]
    s = 8 / 7
    assert dequantize(w, t, 1, 8)[0].tolist() == pytest.approx(
        [s * round(v / s) for v in x[0]], rel=1e-6)
    # MXFP4: e8m0 scale = smallest power of two >= absmax / 6
    w = Weight("fp4_e2m1", "nt", Pack("uint8", "k", (0, 1)), Scale("e8m0", "group", 32, "nk"))
    x = np.linspace(-5, 5, 32, dtype=np.float32)[None, :]
    t = quantize(w, x)
    assert t["scales"].tolist() == [[127]]          # 5/6 -> 2**0
    x = x * 4
    assert quantize(w, x)["scales"].tolist() == [[127 + 2]]    # 20/6 -> 2**2
    # GPTQ-style asymmetric uint4 with int zeros: 0 maps exactly
    w = Weight("uint4", "nt", Pack("int32", "k", tuple(range(8))), Scale("float32", "channel"),
               Zero("int", "uint8"))
    x = np.array([[-1.0, 0.0, 0.5, 2.0, 1.0, -0.5, 0.25, 0.125]], np.float32)
    t = quantize(w, x)
    assert t["scales"][0] == pytest.approx(3.0 / 15)
    assert t["zeros"].tolist() == [5]                # round(1 / 0.2)
    assert dequantize(w, t, 1, 8)[0, 1] == 0.0


def test_quantize_int8_weight_bminf():
    w = Weight("int8", "nt", None, Scale("float32", "channel"))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    t = quantize(w, x)
    s = np.abs(x).max(axis=1) / 127
    assert np.allclose(t["scales"], s, rtol=1e-7)
    assert np.array_equal(t["qweight"], np.rint(x / t["scales"][:, None]).astype(np.int8))


def test_deterministic():
    w = Weight("nf4", "nt", Pack("uint8", "k", (1, 0)), Scale("float32", "group", 64, "nk"))
    x = np.random.default_rng(0).standard_normal((8, 128)).astype(np.float32)
    a, b = quantize(w, x), quantize(w, x)
    assert all(np.array_equal(a[k], b[k]) for k in a)


# --- the 8-bit-activation examples (issue 29) -------------------------------------------------

A8 = {p.stem: load_spec(p) for p in (Path(__file__).parent / "a8_specs").glob("*.yaml")}


@pytest.mark.parametrize("name", sorted(A8))
def test_quantize_into_the_a8_examples(name):
    """Their exact storage, every q - z an integer the 8-bit decode holds
    (validate.decode_ints), the error within half a step per element."""
    spec = A8[name]
    N, K = 24, 256
    x = np.random.default_rng(0).standard_normal((N, K)).astype(np.float32)
    if spec.b.scale is None:
        x *= 3                                    # unscaled int4: the codes are the values
    t = quantize(spec, x)
    assert {k: v.shape for k, v in t.items()} == stored_shapes(spec, N, K)
    qz = code_values(spec.b, decode_storage(spec.b, t["qweight"])) - zeros_nk(spec, t, N, K)
    lo, hi = decode_ints(spec)
    assert np.all((lo <= qz) & (qz <= hi)) and np.array_equal(qz, np.rint(qz))
    err = np.abs(dequantize(spec, t, N, K) - x)
    s = scales_nk(spec, t, N, K)
    if spec.b.dtype == "ternary":                 # BitNet: clipped at +-s by design
        assert np.all(err[np.abs(x) <= s] <= s[np.abs(x) <= s] / 2 * (1 + 1e-6))
    elif spec.b.scale is None:
        assert np.array_equal(dequantize(spec, t, N, K), np.clip(np.rint(x), -8, 7))
    else:
        assert np.all(err <= s / 2 * (1 + 1e-3) + 1e-6), float((err / s).max())


def test_w4a8_symmetric_scale_is_absmax_over_7():
    """uint4 codes with the const zero 8 hold -8..7: s = absmax / 7 per channel."""
    spec = A8["w4a8_int8"]
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    t = quantize(spec, x)
    assert np.allclose(t["scales"], np.abs(x).max(axis=1) / 7, rtol=1e-7)
