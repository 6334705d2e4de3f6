"""Stored weights (codegen/storage.py): codes <-> packed containers and
storage elements, both ways, for every weight format; and the shipped
checkpoint specs store what the checkpoints do: the reference packs each
real checkpoint format byte-for-byte (opgen/checkpoints.py then converts a
checkpoint's tensors into that storage: tests/package/test_checkpoints.py).

Each checkpoint format below is re-implemented *independently* from its
published convention (the loops in AutoGPTQ / AutoAWQ / bitsandbytes / the
OCP MX spec / BitNet), without calling the reference's packer, and compared
with what `storage.encode_codes` / `encode_zeros` produce for the Spec the
shipped YAML describes. Dequantization is checked against each format's own
formula.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen import reference as R
from opgen.codegen.quantize_weight import quantize
from opgen.codegen.random_data import random_codes
from opgen.codegen.reference import code_values
from opgen.codegen.spec import (WEIGHT_CODES, Pack, Scale, Weight, Zero, scale_shape,
                                weight_storage_shape)
from opgen.codegen.storage import decode_storage, decode_zeros, encode_codes, encode_zeros
from weight_strategies import SETTINGS, storage_dtype, weights


@settings(**SETTINGS)
@given(weights(), st.integers(0, 2**32 - 1))
def test_encode_decode_round_trip(wnk, seed):
    w, N, K = wnk
    rng = np.random.default_rng(seed)
    codes = random_codes(w, N, K, rng)
    qw = encode_codes(w, codes)
    assert qw.shape == weight_storage_shape(w, N, K)
    assert qw.dtype == storage_dtype(w)
    assert np.array_equal(decode_storage(w, qw), codes)
    # and storage -> codes -> storage is the identity too
    assert np.array_equal(encode_codes(w, decode_storage(w, qw)).view(np.uint8),
                          qw.view(np.uint8))


def test_pack_order_semantics():
    """Field i (field 0 = LSBs) of word j holds element j*P + order[i]."""
    w = Weight("uint4", "nt", Pack("uint8", "k", (1, 0)))
    codes = np.array([[0x1, 0x2, 0x3, 0x4]])
    assert encode_codes(w, codes).tolist() == [[0x12, 0x34]]
    w = Weight("uint2", "nn", Pack("int32", "n", (3, 2, 1, 0) + tuple(range(4, 16))))
    codes = np.zeros((16, 1), np.int64)
    codes[0, 0] = 3                                   # element 0 -> field 3 (bits 6..7)
    codes[15, 0] = 2                                  # element 15 -> field 15 (bits 30..31)
    qw = encode_codes(w, codes)
    assert qw.shape == (1, 1) and qw.dtype == np.int32
    assert int(qw.view(np.uint32)[0, 0]) == (3 << 6) | (2 << 30)


def test_unpacked_int_storage_holds_values():
    w = Weight("int8", "nn")
    codes = np.array([[0x80, 0xFF, 0x01]])            # raw fields: -128, -1, 1
    qw = encode_codes(w, codes)
    assert qw.dtype == np.int8 and qw[:, 0].tolist() == [-128, -1, 1]
    assert code_values(w, codes).tolist() == [[-128, -1, 1]]
    # signed values are accepted and masked to the same fields
    assert np.array_equal(encode_codes(w, np.array([[-128, -1, 1]])), qw)


@pytest.mark.gpu
@settings(**dict(SETTINGS, max_examples=min(SETTINGS["max_examples"], 60)))
@given(weights(), st.integers(0, 2**32 - 1))
def test_cupy_encodes_numpys_bytes(wnk, seed):
    """encode_codes and encode_zeros (the direction quantizing takes) on CuPy
    arrays store numpy's bytes, in CuPy arrays."""
    import cupy as cp
    w, N, K = wnk
    rng = np.random.default_rng(seed)
    codes = random_codes(w, N, K, rng)
    want, got = encode_codes(w, codes), encode_codes(w, cp.asarray(codes))
    assert isinstance(got, cp.ndarray) and got.dtype == want.dtype and got.shape == want.shape
    assert got.get().tobytes() == want.tobytes()
    if w.zero.kind == "int":
        zc = WEIGHT_CODES[w.zero.dtype]
        stored = rng.integers(zc.lo, zc.hi + 1, size=scale_shape(w.scale, N, K))
        want, got = encode_zeros(w, stored), encode_zeros(w, cp.asarray(stored))
        assert isinstance(got, cp.ndarray) and got.dtype == want.dtype and got.shape == want.shape
        assert got.get().tobytes() == want.tobytes()


# --- real checkpoint formats, packed independently ----------------------------------

N, K = 24, 256
SEQ8 = tuple(range(8))
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)

GPTQ_V1 = Weight("uint4", "nn", Pack("int32", "k", SEQ8), Scale("float16", "group", 128, "kn"),
                 Zero("int", "uint4", Pack("int32", "n", SEQ8), offset=1))
GPTQ_V2 = Weight("uint4", "nn", Pack("int32", "k", SEQ8), Scale("float16", "group", 128, "kn"),
                 Zero("int", "uint4", Pack("int32", "n", SEQ8), offset=0))
AWQ = Weight("uint4", "nn", Pack("int32", "n", AWQ_ORDER), Scale("float16", "group", 128, "kn"),
             Zero("int", "uint4", Pack("int32", "n", AWQ_ORDER), offset=0))
NF4 = Weight("nf4", "nt", Pack("uint8", "k", (1, 0)), Scale("float32", "group", 64, "nk"))
MXFP4 = Weight("fp4_e2m1", "nt", Pack("uint8", "k", (0, 1)), Scale("e8m0", "group", 32, "nk"))
BITNET = Weight("ternary", "nt", Pack("uint8", "k", (0, 1, 2, 3)), Scale("float32", "tensor"))

SHIPPED = {"gptq_v1_w4a16_g128": GPTQ_V1, "gptq_v2_w4a16_g128": GPTQ_V2,
           "awq_w4a16_g128": AWQ, "bnb_nf4": NF4, "mxfp4": MXFP4, "bitnet_b158": BITNET}

# published NF4 code values (bitsandbytes `get_4bit_type("nf4")`)
NF4_VALUES = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)


def _rng(tag: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(tag.encode()))   # stable across runs


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_specs_match_shipped_yaml(name):
    """The Specs used here are the ones the shipped YAML files describe."""
    resolve = pytest.importorskip("opgen.codegen.resolve")
    paths = resolve.shipped_specs()
    if name not in paths:
        pytest.skip(f"{name}.yaml not shipped")
    assert resolve.load_spec(paths[name]).b == SHIPPED[name]


# --- GPTQ ------------------------------------------------------------------------------


def gptq_pack_qweight(intweight_kn: np.ndarray) -> np.ndarray:
    """AutoGPTQ QuantLinear.pack: qweight [K/8, N], row i holds rows 8i..8i+7
    of intweight [K, N], row 8i+j in bits 4j..4j+3."""
    iw = intweight_kn.astype(np.uint32)
    qweight = np.zeros((iw.shape[0] // 8, iw.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + 8):
            qweight[row] |= iw[j] << (4 * (j - i))
        i += 8
        row += 1
    return qweight.view(np.int32)


def gptq_pack_qzeros(zeros_gn: np.ndarray) -> np.ndarray:
    """AutoGPTQ: qzeros [K/G, N/8], column c holds zero columns 8c..8c+7."""
    z = zeros_gn.astype(np.uint32)
    qzeros = np.zeros((z.shape[0], z.shape[1] // 8), dtype=np.uint32)
    i = col = 0
    while col < qzeros.shape[1]:
        for j in range(i, i + 8):
            qzeros[:, col] |= z[:, j] << (4 * (j - i))
        i += 8
        col += 1
    return qzeros.view(np.int32)


def gptq_dequant(qweight, qzeros, scales, G: int, v1: bool) -> np.ndarray:
    """W[n, k] = (q[k, n] - z[k // G, n]) * s[k // G, n]; v1 stores z - 1."""
    u = qweight.view(np.uint32)
    q = np.stack([(u >> (4 * j)) & 0xF for j in range(8)], axis=1).reshape(-1, u.shape[1])
    uz = qzeros.view(np.uint32)
    z = np.stack([(uz >> (4 * j)) & 0xF for j in range(8)], axis=2).reshape(uz.shape[0], -1)
    z = z.astype(np.float32) + (1 if v1 else 0)
    g = np.arange(q.shape[0]) // G
    return ((q.astype(np.float32) - z[g]) * scales.astype(np.float32)[g]).T


@pytest.mark.parametrize("v1", [True, False])
def test_gptq(v1):
    spec = GPTQ_V1 if v1 else GPTQ_V2
    rng = _rng(f"gptq{v1}")
    q_kn = rng.integers(0, 16, size=(K, N))
    z = rng.integers(1 if v1 else 0, 17 if v1 else 16, size=(K // 128, N))   # true zero points
    stored_z = z - 1 if v1 else z
    scales = (rng.uniform(0.5, 1.5, size=(K // 128, N)) / 64).astype(np.float16)

    qweight = encode_codes(spec, q_kn.T)
    qzeros = encode_zeros(spec, stored_z)
    assert qweight.dtype == np.int32 and qweight.shape == (K // 8, N)
    assert qzeros.dtype == np.int32 and qzeros.shape == (K // 128, N // 8)
    assert qweight.tobytes() == gptq_pack_qweight(q_kn).tobytes()
    assert qzeros.tobytes() == gptq_pack_qzeros(stored_z).tobytes()
    assert np.array_equal(decode_zeros(spec, qzeros), stored_z)

    tensors = {"qweight": qweight, "scales": scales, "zeros": qzeros}
    want = gptq_dequant(qweight, qzeros, scales, 128, v1)
    assert np.array_equal(R.dequantize(spec, tensors, N, K), want)

    # and the reference's own quantizer writes checkpoints GPTQ loaders read
    w = rng.standard_normal((N, K)).astype(np.float32)
    t = quantize(spec, w)
    dq = gptq_dequant(t["qweight"], t["zeros"], t["scales"], 128, v1)
    assert np.array_equal(dq, R.dequantize(spec, t, N, K))
    s = np.repeat(t["scales"].astype(np.float32), 128, axis=0).T
    assert np.all(np.abs(dq - w) <= s * 0.5001)


# --- AWQ --------------------------------------------------------------------------------


def awq_pack(intweight_kn: np.ndarray) -> np.ndarray:
    """AutoAWQ WQLinear_GEMM.from_linear: [K, N] -> [K, N/8]; bit field i of
    column c holds column 8c + order_map[i]."""
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    iw = intweight_kn.astype(np.uint32)
    out = np.zeros((iw.shape[0], iw.shape[1] // 8), dtype=np.uint32)
    for col in range(iw.shape[1] // 8):
        for i in range(8):
            out[:, col] |= iw[:, col * 8 + order_map[i]] << (i * 4)
    return out.view(np.int32)


def awq_unpack(packed: np.ndarray) -> np.ndarray:
    """AutoAWQ unpack_awq + reverse_awq_order: [R, C/8] -> [R, C]."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    fields = (packed.view(np.uint32)[:, :, None] >> shifts[None, None, :]) & 0xF
    reverse_order = [0, 4, 1, 5, 2, 6, 3, 7]
    return fields[:, :, reverse_order].reshape(packed.shape[0], -1)


def test_awq():
    rng = _rng("awq")
    q_kn = rng.integers(0, 16, size=(K, N))
    z = rng.integers(0, 16, size=(K // 128, N))
    scales = (rng.uniform(0.5, 1.5, size=(K // 128, N)) / 64).astype(np.float16)

    qweight = encode_codes(AWQ, q_kn.T)
    qzeros = encode_zeros(AWQ, z)
    assert qweight.dtype == np.int32 and qweight.shape == (K, N // 8)
    assert qzeros.shape == (K // 128, N // 8)
    assert qweight.tobytes() == awq_pack(q_kn).tobytes()
    assert qzeros.tobytes() == awq_pack(z).tobytes()
    assert np.array_equal(awq_unpack(qweight), q_kn)

    g = np.arange(K) // 128
    want = ((awq_unpack(qweight).astype(np.float32) - awq_unpack(qzeros)[g])
            * scales.astype(np.float32)[g]).T
    tensors = {"qweight": qweight, "scales": scales, "zeros": qzeros}
    assert np.array_equal(R.dequantize(AWQ, tensors, N, K), want)


# --- bitsandbytes NF4 ---------------------------------------------------------------------


def bnb_pack_nf4(codes_flat: np.ndarray) -> np.ndarray:
    """bitsandbytes quantize_4bit: two codes per byte, even index high nibble."""
    c = codes_flat.astype(np.uint8)
    return (c[0::2] << 4) | c[1::2]


def bnb_dequant_nf4(packed: np.ndarray, absmax: np.ndarray, blocksize: int = 64) -> np.ndarray:
    flat = np.empty(packed.size * 2, dtype=np.uint8)
    flat[0::2] = packed >> 4
    flat[1::2] = packed & 0xF
    return NF4_VALUES[flat] * np.repeat(absmax.astype(np.float32), blocksize)


def test_bnb_nf4():
    rng = _rng("nf4")
    codes = rng.integers(0, 16, size=(N, K))
    absmax = rng.uniform(0.1, 2.0, size=N * K // 64).astype(np.float32)   # [N*K/64] flat

    qweight = encode_codes(NF4, codes)
    assert qweight.dtype == np.uint8 and qweight.shape == (N, K // 2)
    assert qweight.tobytes() == bnb_pack_nf4(codes.reshape(-1)).tobytes()

    scales = absmax.reshape(N, K // 64)                 # the same bytes, as [N, K/64]
    want = bnb_dequant_nf4(qweight.reshape(-1), absmax).reshape(N, K)
    assert np.array_equal(R.dequantize(NF4, {"qweight": qweight, "scales": scales}, N, K), want)

    # quantize: absmax per block of 64 and nearest NF4 value
    w = rng.standard_normal((N, K)).astype(np.float32)
    t = quantize(NF4, w)
    blocks = w.reshape(-1, 64)
    assert np.array_equal(t["scales"].reshape(-1), np.abs(blocks).max(axis=1))
    nearest = np.abs(blocks[:, :, None] / np.abs(blocks).max(axis=1)[:, None, None]
                     - NF4_VALUES[None, None, :]).argmin(axis=-1)
    got = bnb_dequant_nf4(t["qweight"].reshape(-1), t["scales"].reshape(-1)).reshape(-1, 64)
    assert np.allclose(got, NF4_VALUES[nearest] * np.abs(blocks).max(axis=1)[:, None])


# --- OCP MXFP4 ---------------------------------------------------------------------------


def e2m1_value(code: np.ndarray) -> np.ndarray:
    """OCP FP4 E2M1: bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa."""
    sign = np.where(code & 8, -1.0, 1.0)
    e = (code >> 1) & 3
    m = code & 1
    mag = np.where(e == 0, 0.5 * m, (1 + 0.5 * m) * 2.0 ** (e - 1))
    return (sign * mag).astype(np.float32)


def mxfp4_pack(codes_nk: np.ndarray) -> np.ndarray:
    """Two e2m1 codes per byte along K, element 2i in the low nibble."""
    c = codes_nk.astype(np.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)


def test_mxfp4():
    rng = _rng("mxfp4")
    codes = rng.integers(0, 16, size=(N, K))
    e8m0 = rng.integers(120, 135, size=(N, K // 32)).astype(np.uint8)

    qweight = encode_codes(MXFP4, codes)
    assert qweight.dtype == np.uint8 and qweight.shape == (N, K // 2)
    assert qweight.tobytes() == mxfp4_pack(codes).tobytes()

    scale = np.repeat(2.0 ** (e8m0.astype(np.float64) - 127), 32, axis=1)
    want = (e2m1_value(codes) * scale).astype(np.float32)
    assert np.array_equal(R.dequantize(MXFP4, {"qweight": qweight, "scales": e8m0}, N, K), want)

    # quantize: the scale is the smallest power of two >= absmax / 6
    w = rng.standard_normal((N, K)).astype(np.float32)
    t = quantize(MXFP4, w)
    amax = np.abs(w.reshape(N, K // 32, 32)).max(axis=-1)
    s = 2.0 ** (t["scales"].astype(np.float64) - 127)
    assert np.all(s >= amax / 6) and np.all(s / 2 < amax / 6)


# --- BitNet b1.58 ---------------------------------------------------------------------------


def bitnet_pack(ternary_nk: np.ndarray) -> np.ndarray:
    """Codes t + 1 (0, 1, 2) in 2-bit fields, four per byte along K, field i
    (bits 2i..2i+1) holding element 4j + i."""
    c = (ternary_nk + 1).astype(np.uint8)
    out = np.zeros((c.shape[0], c.shape[1] // 4), dtype=np.uint8)
    for i in range(4):
        out |= c[:, i::4] << (2 * i)
    return out


def test_bitnet():
    rng = _rng("bitnet")
    t = rng.integers(-1, 2, size=(N, K))
    scale = np.array([0.0371], np.float32)

    qweight = encode_codes(BITNET, t + 1)
    assert qweight.dtype == np.uint8 and qweight.shape == (N, K // 4)
    assert qweight.tobytes() == bitnet_pack(t).tobytes()
    assert np.array_equal(R.dequantize(BITNET, {"qweight": qweight, "scales": scale}, N, K),
                          t.astype(np.float32) * scale[0])

    # quantize: absmean scale, round-and-clip
    w = rng.standard_normal((N, K)).astype(np.float32)
    tq = quantize(BITNET, w)
    s = np.float32(np.abs(w.astype(np.float64)).mean())
    assert tq["scales"].tolist() == [s]
    assert tq["qweight"].tobytes() == bitnet_pack(np.clip(np.rint(w / s), -1, 1).astype(np.int64)).tobytes()
