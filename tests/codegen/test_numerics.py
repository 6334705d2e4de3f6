"""The narrow float conversions (codegen/numerics.py): fp8, bf16, f16 and
e8m0, checked against brute force and known bit patterns."""
from __future__ import annotations

import numpy as np
import pytest

from opgen.codegen import numerics as nx


@pytest.mark.parametrize("fmt", ["float8_e4m3", "float8_e5m2"])
def test_fp8_all_codes_round_trip(fmt):
    codes = np.arange(256, dtype=np.uint8)
    vals = nx.from_storage(codes, fmt)
    back = nx.to_storage(vals, fmt)
    finite = np.isfinite(vals)
    assert np.array_equal(back[finite], codes[finite])
    assert np.isnan(nx.from_storage(back[np.isnan(vals)], fmt)).all()
    if fmt == "float8_e4m3":
        assert np.isnan(vals).sum() == 2 and not np.isinf(vals).any()
        assert np.nanmax(vals) == 448 and vals[0x7E] == 448 and vals[1] == 2.0**-9
    else:
        assert np.isinf(vals).sum() == 2 and np.nanmax(vals[finite]) == 57344
        assert vals[1] == 2.0**-16


@pytest.mark.parametrize("fmt", ["float8_e4m3", "float8_e5m2"])
def test_fp8_encode_is_nearest_even(fmt):
    """Brute force: the nearest finite fp8 value, ties to the even code,
    saturating beyond the largest finite value."""
    rng = np.random.default_rng(0)
    table = nx.from_storage(np.arange(256), fmt).astype(np.float64)
    fin = np.flatnonzero(np.isfinite(table))
    pos = np.sort(table[fin][table[fin] > 0])
    mids = (pos[:-1] + pos[1:]) / 2
    x = np.concatenate([rng.standard_normal(2000) * 10 ** rng.uniform(-4, 5, 2000),
                        mids, -mids, pos, [0.0, -0.0, 1e9, -1e9, pos[0] / 2, pos[0] / 4]])
    x = x.astype(np.float32)
    got = nx.to_storage(x, fmt)
    for xi, g in zip(x.astype(np.float64), got):
        d = np.abs(table[fin] - xi)
        best = fin[d == d.min()]
        if len(best) > 1:                         # a tie (or +-0): the even code
            best = best[best % 2 == 0] if np.any(best % 2 == 0) else best
            if xi == 0:
                best = best[(best >> 7) == int(np.signbit(xi))]
        assert int(g) in best.tolist(), (xi, g, best)
    assert nx.to_storage(np.array([np.nan, np.inf, -np.inf], np.float32), fmt).tolist() == \
        ([0x7F, 0x7E, 0xFE] if fmt == "float8_e4m3" else [0x7F, 0x7B, 0xFB])
    assert nx.f32_to_fp8_e5m2(np.float32(1e6), saturate=False) == 0x7C
    assert nx.f32_to_fp8_e4m3(np.float32(1e6), saturate=False) == 0x7F


def test_bf16_rne():
    f = np.array([1.0, 1.00390625, 1.01171875, 1.0 + 2**-8 + 2**-20, -3.0, 3.4e38, np.inf, np.nan],
                 np.float32)
    bits = nx.f32_to_bf16_bits(f)
    assert bits[:7].tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC040, 0x7F80, 0x7F80]
    assert np.isnan(nx.bf16_bits_to_f32(bits[7]))
    # every bf16 bit pattern survives decode -> encode
    allb = np.arange(1 << 16, dtype=np.uint16)
    vals = nx.bf16_bits_to_f32(allb)
    ok = ~np.isnan(vals)
    assert np.array_equal(nx.f32_to_bf16_bits(vals)[ok], allb[ok])


def test_f16_and_e8m0():
    assert nx.f32_to_f16_bits(np.float32(1.0)) == 0x3C00
    assert nx.f16_bits_to_f32(np.uint16(0xC000)) == -2.0
    e = np.array([0, 1, 126, 127, 128, 254, 255], np.uint8)
    v = nx.e8m0_to_f32(e)
    assert v[:6].tolist() == [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127] and np.isnan(v[6])
    assert nx.f32_to_e8m0_ceil(np.array([1.0, 1.01, 0.75, 0.5, 3.0, 0.0, np.nan], np.float32)).tolist() == \
        [127, 128, 127, 126, 129, 0, 255]
    # float32 subnormals (CuPy's kernels would flush them: the codes come from the bits)
    sub = np.array([2.0**-127, 1.5 * 2.0**-127, 2.0**-140, 2.0**-126, -(2.0**-127)], np.float32)
    assert nx.f32_to_e8m0_ceil(sub).tolist() == [0, 1, 0, 1, 0]


def _float32_sample() -> np.ndarray:
    """Every float32 whose low 16 bits are 0, 1, 0x7FFF, 0x8000 or 0xFFFF (each
    exponent, sign and top mantissa bits, around each rounding tie of the
    narrow formats), +-0, +-inf and NaNs."""
    top = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    bits = np.concatenate([top | np.uint32(low) for low in (0, 1, 0x7FFF, 0x8000, 0xFFFF)])
    return bits.view(np.float32)


@pytest.mark.parametrize("fmt", ["float8_e4m3", "float8_e5m2"])
def test_fp8_encode_is_nearest_even_on_every_exponent(fmt):
    """Vectorized brute force over _float32_sample: the nearest finite value
    (ties: the even code), saturating; NaN -> the NaN code."""
    x = _float32_sample()
    table = nx.from_storage(np.arange(128), fmt).astype(np.float64)
    codes = np.flatnonzero(np.isfinite(table))                    # increasing magnitudes
    mags = table[codes]
    with np.errstate(all="ignore"):
        a = np.abs(x.astype(np.float64))
        hi = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
        lo = hi - 1
        dl, dh = a - mags[lo], mags[hi] - a
        pick = np.where((dh < dl) | ((dh == dl) & (codes[hi] % 2 == 0)), hi, lo)
        want = codes[pick] | (np.signbit(x).astype(np.int64) << 7)
        want = np.where(np.isnan(x), 0x7F, want)
        got = nx.to_storage(x, fmt)
    assert np.array_equal(got, want.astype(np.uint8))


def test_array_module():
    assert nx.array_module(np.zeros(2)) is np and nx.array_module([1.0]) is np
    assert nx.array_module(np.float32(1)) is np


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32", "float8_e4m3", "float8_e5m2", "e8m0"])
def test_cupy_converts_like_numpy(fmt):
    """CuPy arrays in: the same bits out, both ways, on _float32_sample (and
    the fp8 formats' overflow to NaN / inf)."""
    import cupy as cp
    x = _float32_sample()
    with np.errstate(all="ignore"):
        want = nx.to_storage(x, fmt)
        back = nx.from_storage(want, fmt)
    got = nx.to_storage(cp.asarray(x), fmt)
    assert isinstance(got, cp.ndarray) and got.dtype == want.dtype
    assert got.get().tobytes() == want.tobytes()
    assert nx.from_storage(got, fmt).get().tobytes() == back.tobytes()
    if fmt.startswith("float8"):
        conv = nx.f32_to_fp8_e4m3 if fmt == "float8_e4m3" else nx.f32_to_fp8_e5m2
        with np.errstate(all="ignore"):
            want = conv(x, saturate=False)
        assert conv(cp.asarray(x), saturate=False).get().tobytes() == want.tobytes()
