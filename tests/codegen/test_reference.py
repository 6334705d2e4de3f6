"""The reference semantics (codegen/reference.py): the matmul against a
direct computation, the int32-accumulate path, bias and activations,
activation quantization; 8-bit activations with sub-byte weights and the
int32 output (tests/a8_examples.py) against int64 numpy written here.
Weight formats come from weight_strategies.py."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen import numerics as nx
from opgen.codegen.quantize_weight import quantize
from opgen.codegen.random_data import random_activation, random_weight_tensors
from opgen.codegen.reference import (activation_to_float, code_values, dequantize,
                                     quantize_activation, reference_matmul,
                                     reference_matmul_f32, zeros_nk)
from opgen.codegen.spec import (WEIGHT_CODES, Activation, Epilogue, Output, Pack, Scale,
                                Spec, Weight, Zero)
from opgen.codegen.resolve import load_spec
from opgen.codegen.storage import decode_storage
from weight_strategies import SETTINGS, weights
from a8_examples import A8_PATHS


# --- the matmul -------------------------------------------------------------------------


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


ACTS = {"none": lambda x: x, "relu": lambda x: np.maximum(x, 0),
        "silu": lambda x: x / (1 + np.exp(-x)), "gelu": _gelu}


@settings(**SETTINGS)
@given(weights(), st.sampled_from(("float16", "bfloat16", "int8", "float8_e4m3")),
       st.sampled_from(("float16", "bfloat16", "float32")), st.booleans(),
       st.sampled_from(tuple(ACTS)), st.integers(0, 2**32 - 1))
def test_reference_matmul(wnk, adt, odt, bias_on, act, seed):
    w, N, K = wnk
    rng = np.random.default_rng(seed)
    spec = Spec("t", "matmul", Activation(adt, "row" if adt in ("int8", "float8_e4m3") else None),
                w, Output(odt), epilogue=Epilogue(bias_on, act))
    M = 5
    a, a_scale = random_activation(spec, M, K, rng)
    t = random_weight_tensors(w, N, K, rng)
    bias = nx.to_storage(rng.standard_normal(N), odt) if bias_on else None

    a_real = activation_to_float(spec, a, a_scale).astype(np.float64)
    want = a_real @ dequantize(w, t, N, K).astype(np.float64).T
    if bias_on:
        want = want + nx.from_storage(bias, odt)
    with np.errstate(over="ignore"):
        want = ACTS[act](want)
    got = reference_matmul_f32(spec, a, t, a_scale, bias)
    assert got.dtype == np.float32 and got.shape == (M, N)
    # (+1e-37: values below float32's normal range round to 0 or subnormals)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max() + 1e-37)
    out = reference_matmul(spec, a, t, a_scale, bias)
    assert out.dtype == nx.FLOAT_STORAGE_DTYPES[odt]
    assert np.array_equal(out.view(np.uint8), nx.to_storage(got, odt).view(np.uint8))


def test_activation_dtypes():
    spec = Spec("t", "matmul", Activation("int8", "row"), Weight("int8"), Output())
    a = np.array([[1, -2], [127, -127]], np.int8)
    sc = np.array([0.5, 2.0], np.float32)
    assert activation_to_float(spec, a, sc).tolist() == [[0.5, -1.0], [254.0, -254.0]]
    spec = Spec("t", "matmul", Activation("bfloat16"), Weight("bfloat16"), Output())
    assert activation_to_float(spec, np.array([[0x3F80, 0xC000]], np.uint16)).tolist() == [[1.0, -2.0]]


@pytest.mark.parametrize("wdt,zero,gran", [
    ("int8", Zero(), "channel"), ("int4", Zero(), "group"), ("uint4", Zero("const", value=8), "group"),
    ("uint4", Zero("int", "uint4", Pack("int32", "n", tuple(range(8))), offset=1), "group"),
    ("ternary", Zero(), "tensor")])
def test_int32_accumulate_matches_float_path(wdt, zero, gran):
    bits = WEIGHT_CODES[wdt].bits
    pack = Pack("uint8", "k", tuple(range(8 // bits))) if bits < 8 else None
    w = Weight(wdt, "nt", pack, Scale("float32", gran, 32 if gran == "group" else None, "nk"), zero)
    int_spec = Spec("t", "matmul", Activation("int8", "row"), w, Output("float32"), accumulate="int32")
    f_spec = Spec("t", "matmul", Activation("int8", "row"), w, Output("float32"))
    rng = np.random.default_rng(7)
    N, K = 16, 128
    a, a_scale = random_activation(int_spec, 4, K, rng)
    t = random_weight_tensors(w, N, K, rng)
    got = reference_matmul_f32(int_spec, a, t, a_scale)
    want = reference_matmul_f32(f_spec, a, t, a_scale)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)
    if gran == "channel":       # exact integer sums, then * s_w[n] * a_scale[m]
        qz = (code_values(w, decode_storage(w, t["qweight"])) - zeros_nk(w, t, N, K))
        acc = a.astype(np.int64) @ qz.astype(np.int64).T
        exact = acc * t["scales"].astype(np.float64)[None, :] * a_scale.astype(np.float64)[:, None]
        assert np.array_equal(got, exact.astype(np.float32))


def test_bias_required_when_declared():
    w = Weight("float16")
    spec = Spec("t", "matmul", Activation("float16"), w, Output(), epilogue=Epilogue(True))
    a = np.ones((2, 8), np.float16)
    t = {"qweight": np.ones((4, 8), np.float16)}
    with pytest.raises(ValueError):
        reference_matmul(spec, a, t)
    out = reference_matmul(spec, a, t, bias=np.arange(4, dtype=np.float16))
    assert out.tolist() == [[8, 9, 10, 11]] * 2
    # a bfloat16 bias as bits (np.uint16) or as real float values: same result
    bf = Spec("t", "matmul", Activation("float16"), w, Output("bfloat16"), epilogue=Epilogue(True))
    vals = np.array([0.5, -1.25, 3.0, 0.0], np.float32)
    by_bits = reference_matmul(bf, a, t, bias=nx.f32_to_bf16_bits(vals))
    assert by_bits.dtype == np.uint16
    assert np.array_equal(by_bits, reference_matmul(bf, a, t, bias=vals))
    assert nx.bf16_bits_to_f32(by_bits[0]).tolist() == [8.5, 6.75, 11.0, 8.0]


# --- activation quantization ----------------------------------------------------------------


def test_quantize_activation_int8_per_row():
    spec = Spec("q", "quantize", Activation("float16"), None, Output("int8"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 96)).astype(np.float16)
    x[3] = 0                                          # a row of zeros: scale 1
    codes, scale = quantize_activation(spec, x)
    assert codes.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (6,)
    xf = x.astype(np.float32)
    amax = np.abs(xf).max(axis=1)
    want_scale = np.where(amax > 0, amax / np.float32(127), 1).astype(np.float32)
    assert np.array_equal(scale, want_scale)
    assert np.array_equal(codes, np.clip(np.rint(xf / want_scale[:, None]), -127, 127).astype(np.int8))
    assert np.all(np.abs(codes).max(axis=1)[amax > 0] == 127)
    assert np.all(codes[3] == 0)
    # round half to even
    half = Spec("q", "quantize", Activation("float16"), None, Output("int8"))
    c, s = quantize_activation(half, np.array([[127.0, 0.5, 1.5, 2.5, -0.5]], np.float32))
    assert s.tolist() == [1.0] and c.tolist() == [[127, 0, 2, 2, 0]]


def test_quantize_activation_fp8_and_bf16_input():
    spec = Spec("q", "quantize", Activation("bfloat16"), None, Output("float8_e4m3"))
    x = np.array([[1.0, -2.0, 0.5], [448.0, 896.0, -0.0]], np.float32)
    codes, scale = quantize_activation(spec, nx.f32_to_bf16_bits(x))
    assert codes.dtype == np.uint8
    assert scale.tolist() == [np.float32(2.0) / np.float32(448), 2.0]
    assert nx.fp8_e4m3_to_f32(codes[1]).tolist() == [224.0, 448.0, 0.0]
    real = nx.fp8_e4m3_to_f32(codes) * scale[:, None]
    assert np.allclose(real, x, rtol=2**-4)
    # matmul specs quantize to their activation dtype
    mm = Spec("m", "matmul", Activation("float8_e4m3", "row"), Weight("float8_e4m3"), Output())
    a, s = random_activation(mm, 3, 32, np.random.default_rng(0))
    assert a.dtype == np.uint8 and s.shape == (3,)
    assert np.all(np.abs(nx.fp8_e4m3_to_f32(a)).max(axis=1) == 448)


# --- 8-bit activations with sub-byte weights (issue 29), against int64 numpy ------------------

A8 = {n: load_spec(p) for n, p in A8_PATHS.items()}


def _pack(x: np.ndarray, bits: int, order) -> np.ndarray:
    """[R, C] codes -> [R, C/P] int32 words (P = 32 / bits): field i of each
    word holds element order[i] of its run of P (docs/spec.md)."""
    P = 32 // bits
    u = (x.astype(np.int64) & ((1 << bits) - 1)).reshape(x.shape[0], -1, P)[..., list(order)]
    return (u << (bits * np.arange(P))).sum(axis=-1).astype(np.uint32).view(np.int32)


def _unpack(w: np.ndarray, bits: int, order) -> np.ndarray:
    """The inverse of _pack: [R, C/P] int32 words -> [R, C] codes >= 0."""
    P = 32 // bits
    fields = (w.astype(np.int64)[..., None] >> (bits * np.arange(P))) & ((1 << bits) - 1)
    out = np.empty_like(fields)
    out[..., list(order)] = fields
    return out.reshape(w.shape[0], -1)


def _pack_nibbles(x: np.ndarray, spec=None) -> np.ndarray:
    """4-bit codes packed as spec's weight (None: the natural order 0..7)."""
    return _pack(x, 4, spec.b.pack.order if spec else range(8))


@pytest.mark.parametrize("M,N,K", [(3, 24, 96), (1, 8, 32), (7, 40, 160), (5, 16, 4096)])
def test_int32_output_is_the_exact_int64_sum(M, N, K):
    """The guide's A int8 x B int4 -> int32, bit-exact at odd shapes: the int4
    codes unpacked here by hand, the products summed in int64."""
    spec = A8["int8_int4_int32"]
    rng = np.random.default_rng(M * N + K)
    q = rng.integers(-8, 8, size=(N, K))
    a = rng.integers(-128, 128, size=(M, K)).astype(np.int8)
    a[0] = -128                                   # the extremes: every product +-1024 or 896
    q[0] = -8
    t = {"qweight": _pack_nibbles(q, spec)}
    want = a.astype(np.int64) @ q.T
    got = reference_matmul(spec, a, t)
    assert got.dtype == np.int32 and got.shape == (M, N)
    assert np.array_equal(got.astype(np.int64), want)
    assert np.array_equal(reference_matmul_f32(spec, a, t), want.astype(np.float32))
    assert got[0, 0] == 1024 * K
    with pytest.raises(ValueError, match="no a_scale"):
        reference_matmul(spec, a, t, a_scale=np.ones(M, np.float32))


def test_int32_output_beyond_int32_is_an_error_not_a_wrap():
    """-128 x -8 over K = 2^21 sums to 2^31: no int32 holds it."""
    spec = A8["int8_int4_int32"]
    K = 1 << 21
    a = np.full((1, K), -128, np.int8)
    t = {"qweight": _pack_nibbles(np.full((1, K), -8), spec)}
    with pytest.raises(ValueError, match="int32 output overflows"):
        reference_matmul(spec, a, t)
    a[0, :32] = 0                                  # 2^31 - 32768: fits, exactly
    assert reference_matmul(spec, a, t).tolist() == [[2**31 - 32768]]


def test_int32_output_below_int32_is_an_error_not_a_wrap():
    """127 x -8 over K = 2^21 + 2^18 sums to -1016 K < -2^31; over 2113664
    of them (the rest zero), to -2^31 + 1024, which fits."""
    spec = A8["int8_int4_int32"]
    K = (1 << 21) + (1 << 18)
    a = np.full((1, K), 127, np.int8)
    t = {"qweight": _pack_nibbles(np.full((1, K), -8), spec)}
    with pytest.raises(ValueError, match="int32 output overflows"):
        reference_matmul(spec, a, t)
    a[0, 2113664:] = 0
    assert reference_matmul(spec, a, t).tolist() == [[-2**31 + 1024]]


@pytest.mark.parametrize("M,N,K", [(3, 24, 384), (2, 16, 128)])
def test_group_scales_apply_per_group_to_exact_partial_sums(M, N, K):
    """w4a8_int8_g128: per group g the int64 sum of a * (q - z), times the
    fp16 scale s[g, n], summed over groups, times a_scale[m] (float64)."""
    spec = A8["w4a8_int8_g128"]
    rng = np.random.default_rng(K)
    G = K // 128
    q = rng.integers(0, 16, size=(N, K))
    z = rng.integers(0, 16, size=(G, N))
    s = (rng.uniform(0.5, 1.5, size=(G, N)) / 64).astype(np.float16)
    t = {"qweight": _pack_nibbles(q, spec), "scales": s, "zeros": _pack_nibbles(z)}
    a, a_scale = random_activation(spec, M, K, rng)
    acc = np.zeros((M, N))
    for g in range(G):
        ks = slice(128 * g, 128 * (g + 1))
        part = a[:, ks].astype(np.int64) @ (q[:, ks] - z[g][:, None]).T
        acc += part * s[g].astype(np.float64)[None, :]
    want = (acc * a_scale.astype(np.float64)[:, None]).astype(np.float32)
    assert np.array_equal(reference_matmul_f32(spec, a, t, a_scale), want)
    assert np.array_equal(reference_matmul(spec, a, t, a_scale), want.astype(np.float16))
    # the same real number as dequantizing first: only float rounding apart
    f = reference_matmul_f32(replace(spec, accumulate="float32"), a, t, a_scale)
    assert np.allclose(f, want, rtol=1e-5, atol=1e-6)


def test_bitnet_a8_is_absmean_ternary_times_absmax_int8():
    """BitNet b1.58 W1.58A8: ternary weights quantized with one absmean scale,
    activations per-token absmax int8; the product is the int64 sum of the
    codes times s * a_scale[m]."""
    spec = A8["bitnet_b158_a8"]
    rng = np.random.default_rng(3)
    M, N, K = 4, 24, 160
    w_real = rng.standard_normal((N, K)).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    t = quantize(spec, w_real)
    s = np.float32(np.abs(w_real.astype(np.float64)).mean())
    assert t["scales"].tolist() == [s]
    codes = _unpack(t["qweight"], 2, spec.b.pack.order)
    tern = codes.astype(np.int64) - 1
    assert np.array_equal(tern, np.clip(np.rint(w_real / s), -1, 1))
    a, a_scale = quantize_activation(spec, x)
    assert a.dtype == np.int8 and np.array_equal(a_scale, np.abs(x).max(axis=1) / np.float32(127))
    want = ((a.astype(np.int64) @ tern.T) * np.float64(s)
            * a_scale.astype(np.float64)[:, None]).astype(np.float32)
    assert np.array_equal(reference_matmul_f32(spec, a, t, a_scale), want)
    # and it approximates the float product (ternary weights are coarse)
    real = x @ w_real.T
    assert np.corrcoef(real.ravel(), want.ravel())[0, 1] > 0.7


def test_fp8_activations_with_4_bit_weights():
    """w4a8_fp8: the e4m3 codes' values times q - 8 summed exactly per group
    (float64 holds every such sum), times the bf16 scale, times a_scale."""
    spec = A8["w4a8_fp8"]
    rng = np.random.default_rng(5)
    M, N, K = 3, 24, 256
    q = rng.integers(0, 16, size=(N, K))
    s = nx.f32_to_bf16_bits(rng.uniform(0.5, 1.5, size=(N, K // 128)).astype(np.float32) / 64)
    t = {"qweight": _pack_nibbles(q, spec), "scales": s}
    a, a_scale = random_activation(spec, M, K, rng)
    av = nx.fp8_e4m3_to_f32(a).astype(np.float64)
    sv = nx.bf16_bits_to_f32(s).astype(np.float64)
    acc = np.zeros((M, N))
    for g in range(K // 128):
        ks = slice(128 * g, 128 * (g + 1))
        acc += (av[:, ks] @ (q[:, ks] - 8).T.astype(np.float64)) * sv[:, g][None, :]
    want = (acc * a_scale.astype(np.float64)[:, None]).astype(np.float32)
    assert np.array_equal(reference_matmul_f32(spec, a, t, a_scale), want)
    real = activation_to_float(spec, a, a_scale).astype(np.float64) @ \
        dequantize(spec, t, N, K).astype(np.float64).T
    assert np.allclose(want, real, rtol=1e-5, atol=1e-6)


# --- CuPy: the same dequantization on the GPU ---------------------------------------------------


@pytest.mark.gpu
@settings(**dict(SETTINGS, max_examples=min(SETTINGS["max_examples"], 60)))
@given(weights(), st.integers(0, 2**32 - 1))
def test_cupy_dequantizes_like_numpy(wnk, seed):
    """CuPy tensors in, a CuPy [N, K] out, bit for bit numpy's (the e2e
    bench's dequantized-fp16 model is made this way on the GPU)."""
    import cupy as cp
    w, N, K = wnk
    t = random_weight_tensors(w, N, K, np.random.default_rng(seed))
    got = dequantize(w, {k: cp.asarray(v) for k, v in t.items()}, N, K)
    assert isinstance(got, cp.ndarray)
    want = dequantize(w, t, N, K)
    assert np.array_equal(cp.asnumpy(got).view(np.uint32), want.view(np.uint32))
