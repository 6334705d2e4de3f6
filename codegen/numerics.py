"""Bit-exact conversions between float32 and the narrow number formats.

Pure and vectorized; every conversion runs on numpy arrays and, the same
operations, on CuPy arrays (`array_module`), so that quantizing on the GPU
gives the reference's bytes. Every narrow format has a *storage* numpy dtype
(the bits as the GPU reads them) and a conversion to/from float32:

    float16      np.float16                 (IEEE binary16)
    bfloat16     np.uint16  bit pattern     (top half of a float32)
    float32      np.float32
    float8_e4m3  np.uint8   bit pattern     (OCP "E4M3FN": bias 7, no inf, S.1111.111 = NaN, max 448)
    float8_e5m2  np.uint8   bit pattern     (bias 15, IEEE-like: inf and NaN, max 57344)
    e8m0         np.uint8   biased exponent (OCP MX scale: 2**(e - 127), 255 = NaN)

Narrowing conversions round to nearest, ties to even (RNE). fp8 narrowing
saturates out-of-range values and infinities to the largest finite value, like
CUDA's `__NV_SATFINITE` / PTX `cvt.satfinite` (pass `saturate=False` for the
overflow-to-NaN/inf behaviour). NaN stays NaN.
"""
from __future__ import annotations

import numpy as np

__all__ = [
    "array_module", "FP8_E4M3_TABLE", "FP8_E5M2_TABLE", "FP8_E4M3_MAX", "FP8_E5M2_MAX",
    "FLOAT_STORAGE_DTYPES",
    "f32_to_bf16_bits", "bf16_bits_to_f32",
    "f32_to_f16", "f16_to_f32", "f32_to_f16_bits", "f16_bits_to_f32",
    "f32_to_fp8_e4m3", "fp8_e4m3_to_f32", "f32_to_fp8_e5m2", "fp8_e5m2_to_f32",
    "e8m0_to_f32", "f32_to_e8m0_ceil",
    "to_storage", "from_storage", "max_finite", "min_positive",
]


def array_module(x):
    """cupy for a CuPy array (imported only then), numpy for anything else.
    The code written against it uses typed constants where a Python scalar
    could promote differently in the two, and no Python loop over elements."""
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


# --- bfloat16 ------------------------------------------------------------------


def f32_to_bf16_bits(x) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (np.uint16), round to nearest even.

    Adding 0x7fff plus the lowest kept bit and truncating is RNE on the 16
    dropped bits; a carry out of the mantissa correctly bumps the exponent (and
    overflows to inf). NaNs are kept quiet NaNs with their sign.
    """
    xp = array_module(x)
    x = xp.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    c = np.uint64
    rounded = ((u + c(0x7FFF) + ((u >> c(16)) & c(1))) >> c(16)).astype(np.uint16)
    nan = ((u >> c(16)) & c(0x8000) | c(0x7FC0)).astype(np.uint16)
    return xp.where(xp.isnan(x), nan, rounded).astype(np.uint16)


def bf16_bits_to_f32(bits) -> np.ndarray:
    """bfloat16 bit patterns -> float32 (exact)."""
    xp = array_module(bits)
    b = xp.asarray(bits).astype(np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


# --- float16 -------------------------------------------------------------------


def f32_to_f16(x) -> np.ndarray:
    """float32 -> np.float16 (numpy's and CuPy's casts are round-to-nearest-even;
    beyond 65520 they overflow to inf, like CUDA's __float2half_rn). NaNs keep
    their sign and top payload bits as numpy's cast does (CUDA's writes 0x7FFF
    for every NaN, measured on the H200)."""
    xp = array_module(x)
    x = xp.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16)
    isnan = xp.isnan(x)
    if not isnan.any():                      # (the usual case: no bit work)
        return h
    u = x.view(np.uint32)
    c = np.uint32
    sig = (u & c(0x7FFFFF)) >> c(13)
    nan = ((u >> c(16)) & c(0x8000)) | c(0x7C00) | xp.where(sig == c(0), c(1), sig)
    return xp.where(isnan, nan.astype(np.uint16).view(np.float16), h)


def f16_to_f32(x) -> np.ndarray:
    """np.float16 -> float32 (exact; NaNs keep sign and payload, as numpy's
    cast does)."""
    xp = array_module(x)
    h = xp.asarray(x, dtype=np.float16)
    isnan = xp.isnan(h)
    if not isnan.any():
        return h.astype(np.float32)
    u = h.view(np.uint16).astype(np.uint32)
    c = np.uint32
    nan = ((u & c(0x8000)) << c(16)) | c(0x7F800000) | ((u & c(0x3FF)) << c(13))
    return xp.where(isnan, nan.view(np.float32), h.astype(np.float32))


def f32_to_f16_bits(x) -> np.ndarray:
    return f32_to_f16(x).view(np.uint16)


def f16_bits_to_f32(bits) -> np.ndarray:
    return array_module(bits).asarray(bits).astype(np.uint16).view(np.float16).astype(np.float32)


# --- fp8 -------------------------------------------------------------------------


def _fp8_table(ebits: int, mbits: int, ieee_specials: bool) -> np.ndarray:
    """Value of each of the 256 codes of a sign/ebits/mbits format, float32."""
    bias = (1 << (ebits - 1)) - 1
    c = np.arange(256, dtype=np.int64)
    sign = np.where(c >> 7, -1.0, 1.0)
    e = (c >> mbits) & ((1 << ebits) - 1)
    m = c & ((1 << mbits) - 1)
    # subnormals (e == 0) have no implicit 1 and the exponent of e == 1
    mag = np.where(e == 0,
                   np.ldexp(m.astype(np.float64), 1 - bias - mbits),
                   np.ldexp((m + (1 << mbits)).astype(np.float64), e - bias - mbits))
    val = sign * mag
    top = (1 << ebits) - 1
    if ieee_specials:                       # e5m2: all-ones exponent is inf / NaN
        val = np.where((e == top) & (m == 0), sign * np.inf, val)
        val = np.where((e == top) & (m != 0), np.nan, val)
    else:                                   # e4m3fn: only S.1111.111 is NaN
        val = np.where((e == top) & (m == (1 << mbits) - 1), np.nan, val)
    return val.astype(np.float32)


FP8_E4M3_TABLE = _fp8_table(4, 3, ieee_specials=False)
FP8_E5M2_TABLE = _fp8_table(5, 2, ieee_specials=True)
FP8_E4M3_MAX = 448.0
FP8_E5M2_MAX = 57344.0

# (mantissa bits, minimum normal exponent, max finite, NaN code, +inf code or None)
_FP8_FORMATS = {
    "float8_e4m3": (3, -6, FP8_E4M3_MAX, 0x7F, None, FP8_E4M3_TABLE),
    "float8_e5m2": (2, -14, FP8_E5M2_MAX, 0x7F, 0x7C, FP8_E5M2_TABLE),
}


def _f32_to_fp8(x, fmt: str, saturate: bool) -> np.ndarray:
    mbits, emin, vmax, nan_code, inf_code, table = _FP8_FORMATS[fmt]
    xp = array_module(x)
    x = xp.asarray(x, dtype=np.float32).astype(np.float64)
    a = xp.abs(x)
    # The grid spacing near |x| is 2**(e - mbits) with e = floor(log2|x|)
    # (held at emin for subnormals). |x| / spacing is exact in float64, so
    # rint (ties to even) on it is RNE on the fp8 mantissa.
    _, E = xp.frexp(a)
    e = xp.where(a > 0, xp.maximum(E - 1, emin), emin)     # frexp(0) is 0 * 2**0
    quantum = xp.ldexp(xp.ones_like(a), e - mbits)         # float64, whatever e's int type
    with np.errstate(invalid="ignore"):
        n = xp.rint(a / quantum)            # |x| rounded is n * quantum
    finite = xp.isfinite(n) & (n * quantum <= vmax)
    # The positive codes count through the grid: n, plus 2**mbits for each
    # binade above emin's (n = 2**(mbits+1), rounded up, is the next binade's
    # first code).
    n = xp.where(finite, n, 0.0).astype(np.int64)
    mag_code = ((e - emin).astype(np.int64) << np.int64(mbits)) + n
    if saturate:
        over = int(np.searchsorted(table[:128], vmax))      # the largest finite value's code
    else:
        over = inf_code if inf_code is not None else nan_code
    mag_code = xp.where(finite, mag_code, over)
    code = mag_code | (xp.signbit(x).astype(np.int64) << np.int64(7))
    code = xp.where(xp.isnan(x), nan_code, code)
    return code.astype(np.uint8)


def f32_to_fp8_e4m3(x, saturate: bool = True) -> np.ndarray:
    """float32 -> OCP E4M3FN bits (np.uint8), RNE, saturating to +-448 by default."""
    return _f32_to_fp8(x, "float8_e4m3", saturate)


def f32_to_fp8_e5m2(x, saturate: bool = True) -> np.ndarray:
    """float32 -> E5M2 bits (np.uint8), RNE, saturating to +-57344 by default."""
    return _f32_to_fp8(x, "float8_e5m2", saturate)


def _lookup(table: np.ndarray, bits) -> np.ndarray:
    xp = array_module(bits)
    return xp.take(xp.asarray(table), xp.asarray(bits).astype(np.uint8))


def fp8_e4m3_to_f32(bits) -> np.ndarray:
    return _lookup(FP8_E4M3_TABLE, bits)


def fp8_e5m2_to_f32(bits) -> np.ndarray:
    return _lookup(FP8_E5M2_TABLE, bits)


# --- e8m0 ------------------------------------------------------------------------


def e8m0_to_f32(e) -> np.ndarray:
    """OCP MX scale: code e -> 2**(e - 127) (float32), 255 -> NaN.

    Built from the bits: code 0 is 2**-127, a float32 subnormal, and CuPy's
    kernels flush subnormal results to zero (they compile with -ftz=true)."""
    xp = array_module(e)
    e = xp.asarray(e).astype(np.uint32)
    bits = xp.where(e == 0, np.uint32(1 << 22), e << np.uint32(23))
    return xp.where(e == 255, np.uint32(0x7FC00000), bits).astype(np.uint32).view(np.float32)


def f32_to_e8m0_ceil(x) -> np.ndarray:
    """The e8m0 code of the smallest power of two >= x (x as float32; np.uint8).

    Rounding up means a block scaled by it never overflows the element format.
    Clamped to the finite range [2**-127, 2**127]; x <= 0 gives code 0, NaN 255.
    Read from the bits, not through float arithmetic: CuPy flushes float32
    subnormals (x < 2**-126) to zero, numpy does not.
    """
    xp = array_module(x)
    bits = xp.asarray(x, dtype=np.float32).view(np.uint32)
    E, mant = (bits >> np.uint32(23)) & np.uint32(0xFF), bits & np.uint32(0x7FFFFF)
    code = E + (mant != 0)                           # 1.m * 2**(E - 127): up unless m = 0
    code = xp.where(E == 0, mant > (1 << 22), code)  # subnormal: 2**-126 above 2**-127, else 2**-127
    code = xp.minimum(code, 254)
    code = xp.where((bits >> np.uint32(31) == 1) | ((bits & np.uint32(0x7FFFFFFF)) == 0), 0, code)  # x <= 0
    code = xp.where((E == 255) & (mant != 0), 255, code)
    return code.astype(np.uint8)


# --- by name -----------------------------------------------------------------------

# numpy dtype in which each named format is stored
FLOAT_STORAGE_DTYPES = {
    "float16": np.float16, "bfloat16": np.uint16, "float32": np.float32,
    "float8_e4m3": np.uint8, "float8_e5m2": np.uint8, "e8m0": np.uint8,
}

_MAX_FINITE = {
    "float16": 65504.0, "bfloat16": float(bf16_bits_to_f32(np.uint16(0x7F7F))),
    "float32": float(np.finfo(np.float32).max),
    "float8_e4m3": FP8_E4M3_MAX, "float8_e5m2": FP8_E5M2_MAX, "e8m0": 2.0 ** 127,
}


_MIN_POSITIVE = {
    "float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149,
    "float8_e4m3": 2.0**-9, "float8_e5m2": 2.0**-16, "e8m0": 2.0**-127,
}


def max_finite(dtype: str) -> float:
    """Largest finite value of the named format."""
    return _MAX_FINITE[dtype]


def min_positive(dtype: str) -> float:
    """Smallest positive (subnormal) value of the named format."""
    return _MIN_POSITIVE[dtype]


def to_storage(x, dtype: str) -> np.ndarray:
    """Real values -> storage array of the named format (RNE; e8m0 rounds up)."""
    x = array_module(x).asarray(x, dtype=np.float32)
    if dtype == "float16":
        return f32_to_f16(x)
    if dtype == "bfloat16":
        return f32_to_bf16_bits(x)
    if dtype == "float32":
        return x.copy()
    if dtype == "float8_e4m3":
        return f32_to_fp8_e4m3(x)
    if dtype == "float8_e5m2":
        return f32_to_fp8_e5m2(x)
    if dtype == "e8m0":
        return f32_to_e8m0_ceil(x)
    raise ValueError(f"not a float storage format: {dtype!r}")


def from_storage(arr, dtype: str) -> np.ndarray:
    """Storage array of the named format -> float32 values (exact)."""
    if dtype == "float16":
        return f16_to_f32(arr)
    if dtype == "bfloat16":
        return bf16_bits_to_f32(arr)
    if dtype == "float32":
        return array_module(arr).asarray(arr, dtype=np.float32)
    if dtype == "float8_e4m3":
        return fp8_e4m3_to_f32(arr)
    if dtype == "float8_e5m2":
        return fp8_e5m2_to_f32(arr)
    if dtype == "e8m0":
        return e8m0_to_f32(arr)
    raise ValueError(f"not a float storage format: {dtype!r}")
