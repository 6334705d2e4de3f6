"""Weight quantization (codegen/quantize_weight.py): exactly the storage the
spec describes, every element the nearest representable value, the error
within the format's bound, known values of the common formats; the example
specs of 8-bit activations with sub-byte weights (tests/a8_examples.py);
the reference's bytes pinned for every shipped spec; CuPy (marked gpu) gives
numpy's bytes, and quantizes a Llama-3-8B-shaped model in seconds."""
from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen import numerics as nx
from opgen.codegen import quantize_weight as qw
from opgen.codegen.quantize_weight import quantize, values_to_raw
from opgen.codegen.reference import (code_range, code_values, dequantize, n_raw_codes,
                                     scale_logical, scales_nk, zeros_nk)
from opgen.codegen.resolve import as_spec, load_spec, shipped_specs
from opgen.codegen.spec import (WEIGHT_CODES, Pack, Scale, Weight, Zero, scale_shape,
                                stored_shapes, weight_code, weight_storage_shape, zero_shape)
from opgen.codegen.storage import blocks, decode_storage
from opgen.codegen.validate import decode_ints
from weight_strategies import FLOAT16_DTYPES, SETTINGS, storage_dtype, weights
from a8_examples import A8_PATHS

GPU_SETTINGS = dict(SETTINGS, max_examples=min(SETTINGS["max_examples"], 60))


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

A8 = {n: load_spec(p) for n, p in A8_PATHS.items()}


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


# --- the reference's bytes, pinned ---------------------------------------------------------------

# sha256 (first 16 hex digits, `_digest`) of quantize(spec, _pinned_weight(N, K)) for
# each of PINNED_SHAPES, as the numpy reference gave them before it learnt to run on
# CuPy (and in bands): any change to what it stores shows here. (The five shipped
# 8-bit-activation specs: their codes in byte lanes since they ship, the bytes the
# earlier order's gave moved by codegen.transcode.)
PINNED_SHAPES = [(40, 384), (136, 640)]
PINNED = {
    "awq_w4a16_g128": "2e7332306b36d9b2 1df87a892cc115c1",
    "bitnet_b158": "4211851b22bf159a 75a53b6f7bfe20c5",
    "bnb_nf4": "a2686b800042be9f c640d3d861199047",
    "fp16": "9bcfcda7c0fac935 973dd760d93f3ca5",
    "fp8_e4m3_w8a16": "98a0a8dd7f6e1fb0 acaac0593fb4a604",
    "fp8_e4m3_w8a8": "98a0a8dd7f6e1fb0 acaac0593fb4a604",
    "gptq_v1_w4a16_g128": "c4134754f231093e 92194d656c9c7d3a",
    "gptq_v1_w4a16_g128_repacked": "571f51d5c2de6500 0c62452f603107b3",
    "gptq_v2_w4a16_g128": "6c7acef36dd9272b 38ff1f9f327f8a52",
    "gptq_v2_w4a16_g128_repacked": "058a780a7ff895bd 61912a4c6d0d3e96",
    "mxfp4": "c73a0f1bc1240df8 5f93ec49d6dbbf68",
    "w1a16_g128": "ba541ac214992868 386368f33792eb27",
    "w2a16_g128": "2a1bbdafb78d8ec0 b3d87f139955b81d",
    "w4a16_sym_g128": "60b888ac3fcee422 c39c07d3cbd453b4",
    "w8a8_int8": "13545523800cabe6 0e8ee6da12ca3abd",
    "bitnet_b158_a8": "240f73d3d77e2a5b d9458589939801f5",
    "int8_int4_int32": "99e060473f02da74 4a34e8943e530569",
    "w4a8_fp8": "c4ecd11b111a8ae2 b98521a0283107e7",
    "w4a8_int8": "19c6e593b8ba73a3 b650bd583642f77f",
    "w4a8_int8_g128": "02f94c33abe24994 46e862ef79f9d479",
}
WEIGHT_SPECS = {**{n: as_spec(n) for n in shipped_specs() if as_spec(n).b is not None}, **A8}


def _pinned_weight(N: int, K: int) -> np.ndarray:
    """A weight from integer hashing and exact float32 steps only (no RNG, no
    libm: the same on every machine): uniform values in [-2, 2) with
    outliers and small columns, and a zero, a signed-zero, a tie, a tiny, a
    huge, a positive and a negative row."""
    i = np.arange(N * K, dtype=np.uint64)
    h = (i * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)                # 24 bits
    x = ((h.astype(np.float32) / np.float32(1 << 24) - np.float32(0.5)) * np.float32(4)).reshape(N, K)
    x[(h % np.uint64(53) == 0).reshape(N, K)] *= np.float32(9)
    x[:, : K // 8] *= np.float32(1e-3)
    x[0] = 0
    x[1] = np.where(np.arange(K) % 2, np.float32(-0.0), np.float32(0.0))
    x[2] = ((np.arange(K) % 33).astype(np.float32) - np.float32(16)) / np.float32(4)   # ties
    x[3] *= np.float32(2.0 ** -20)
    x[4] *= np.float32(2.0 ** 14)
    x[5] = np.abs(x[5])
    x[6] = -np.abs(x[6])
    return x


def _digest(t) -> str:
    h = hashlib.sha256()
    for k in sorted(t):
        a = np.ascontiguousarray(t[k])
        h.update(f"{k} {a.dtype.str} {a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def test_every_shipped_weight_spec_is_pinned():
    assert sorted(PINNED) == sorted(WEIGHT_SPECS)


@pytest.mark.parametrize("band", [None, 1, 1000])
@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_reference_bytes_are_pinned(name, band, monkeypatch):
    """The bytes of qweight, scales and zeros, also when numpy encodes the
    codes in bands of rows (band: elements; 1 = the fewest rows a band holds)."""
    if band is not None:
        monkeypatch.setattr(qw, "_BAND_ELEMENTS", band)
    got = [_digest(quantize(WEIGHT_SPECS[name], _pinned_weight(N, K))) for N, K in PINNED_SHAPES]
    assert " ".join(got) == PINNED[name]


@settings(**SETTINGS)
@given(weights(), st.integers(0, 2**32 - 1))
def test_bands_change_nothing(wnk, seed):
    """numpy's bands of rows (the fewest rows a band can hold: packed words
    along n stay whole) give the bytes of the whole weight at once."""
    w, N, K = wnk
    x = _test_matrix(w, N, K, np.random.default_rng(seed))
    whole = quantize(w, x)
    saved = qw._BAND_ELEMENTS
    try:
        qw._BAND_ELEMENTS = 1
        banded = quantize(w, x)
    finally:
        qw._BAND_ELEMENTS = saved
    assert _same(banded, whole)


def _same(got, want) -> bool:
    """The same tensors, dtypes, shapes and bytes (numpy or CuPy got)."""
    if set(got) != set(want):
        return False
    for k, v in want.items():
        g = got[k]
        if type(g).__module__.split(".")[0] == "cupy":
            g = g.get()
        if g.dtype != v.dtype or g.shape != v.shape or g.tobytes() != v.tobytes():
            return False
    return True


@pytest.mark.parametrize("w", [
    Weight("nf4", "nt", None, Scale("float32", "channel")),
    Weight("fp4_e2m1", "nt", None, Scale("float32", "channel")),
    # midpoints off the float32 grid; more than 16 values (a search, not a pass per midpoint)
    Weight("codebook", "nt", None, Scale("float32", "channel"), bits=4,
           codebook=(-1.0, 0.1, 0.30000001192092896, 1 / 3, 2.0)),
    Weight("codebook", "nt", None, Scale("float32", "channel"), bits=8,
           codebook=tuple(np.linspace(-3, 5, 40).tolist()))], ids=["nf4", "fp4", "cb4", "cb8"])
def test_table_codes_nearest_at_float32_neighbours_of_the_midpoints(w):
    """A table code is the nearest value, ties to the smaller, decided
    exactly in float64 (float32 thresholds stand for the float64 midpoints):
    checked on the float32 neighbours of every midpoint; +-inf and NaN give
    the end values (NaN the largest)."""
    tab = np.asarray(weight_code(w).table, np.float64)         # as the spec gives them
    sv = np.sort(tab)
    t = [np.float32(m) for m in (sv[:-1] + sv[1:]) / 2]
    for _ in range(3):
        t += [np.nextafter(v, np.float32(d)) for v in t for d in (np.inf, -np.inf)]
    t = np.array(t, np.float32)
    d = np.abs(tab[None, :] - t.astype(np.float64)[:, None])
    nearest = np.where(d == d.min(axis=1, keepdims=True), tab[None, :], np.inf).min(axis=1)
    assert np.array_equal(tab[values_to_raw(w, t)], nearest)
    ends = tab[values_to_raw(w, np.array([np.inf, -np.inf, np.nan], np.float32))]
    assert ends.tolist() == [tab.max(), tab.min(), tab.max()]


# --- CuPy: numpy's bytes, on the GPU ------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PINNED))
def test_cupy_gives_the_reference_bytes(name):
    """CuPy in, CuPy out: the pinned weights and a random one of an odd
    shape, byte for byte numpy's."""
    import cupy as cp
    spec = WEIGHT_SPECS[name]
    xs = [_pinned_weight(N, K) for N, K in PINNED_SHAPES]
    xs.append(_test_matrix(spec.b, 24 * 7, 128 * 3, np.random.default_rng(5)))
    for x in xs:
        got = quantize(spec, cp.asarray(x))
        assert all(isinstance(v, cp.ndarray) for v in got.values())
        assert _same(got, quantize(spec, x))


@pytest.mark.gpu
@settings(**GPU_SETTINGS)
@given(weights(), st.integers(0, 2**32 - 1))
def test_cupy_gives_numpys_bytes_in_every_format(wnk, seed):
    import cupy as cp
    w, N, K = wnk
    x = _test_matrix(w, N, K, np.random.default_rng(seed))
    x[0, : K // 2] = 0                                 # a block of zeros, signed zeros
    x[-1, :: 3] = -0.0
    assert _same(quantize(w, cp.asarray(x)), quantize(w, x))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gptq_v2_w4a16_g128", "bnb_nf4", "bitnet_b158", "fp8_e4m3_w8a16"])
def test_cupy_gives_numpys_bytes_for_non_finite_weights(name):
    """inf and NaN weights (a block holding one gets scale 1): the same bytes too."""
    import cupy as cp
    spec = WEIGHT_SPECS[name]
    x = _pinned_weight(40, 384)
    x[7, 5], x[8, 200], x[9, 1] = np.inf, -np.inf, np.nan
    with np.errstate(all="ignore"):
        want = quantize(spec, x)
    assert _same(quantize(spec, cp.asarray(x)), want)


# Llama-3-8B's linear layers (N, K): q, k, v, o, gate, up, down; 32 decoder layers
LLAMA3_8B_LINEARS = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096),
                     (14336, 4096), (14336, 4096), (4096, 14336)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gptq_v2_w4a16_g128", "awq_w4a16_g128", "bnb_nf4", "mxfp4",
                                  "fp8_e4m3_w8a16", "w8a8_int8", "bitnet_b158"])
def test_cupy_quantizes_a_llama3_8b_shaped_model_in_under_15_s(name, record):
    """32 x 7 linear layers of Llama-3-8B's shapes quantized on the GPU (issue
    target: under 15 s for the model; CuPy's kernels compiled first)."""
    import cupy as cp
    spec = WEIGHT_SPECS[name]
    quantize(spec, cp.asarray(_pinned_weight(40, 384)))            # compile CuPy's kernels
    rng = cp.random.default_rng(0)
    ws = {s: (rng.standard_normal(s, dtype=cp.float32) * 0.02) for s in set(LLAMA3_8B_LINEARS)}
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(32):
        for s in LLAMA3_8B_LINEARS:
            quantize(spec, ws[s])
    cp.cuda.Device().synchronize()
    seconds = time.perf_counter() - t0
    record(test="quantize_llama3_8b_gpu", spec=name, seconds=seconds)
    assert seconds < 15.0
