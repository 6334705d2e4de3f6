"""Quantizing a real weight into exactly a spec's storage format
(`quantize`): deterministic, round-to-nearest, the rules in its docstring.
Activations are quantized by reference.quantize_activation.

The same code quantizes numpy arrays (the reference) and CuPy arrays (on the
GPU, on the current stream): only operations whose results are exact or
correctly rounded in both (min / max, IEEE float32 and float64 arithmetic,
rint, the conversions of numerics.py) and one fixed summation order
(`_pairwise_sum`), so the two give the same bytes.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from . import numerics as nx
from .reference import code_range
from .spec import WEIGHT_CODES, Weight, codes_per_container, weight_code
from .storage import (QuantizedWeight, SpecLike, blocks, encode_codes, encode_zeros,
                      to_layout, weight_of)

__all__ = ["quantize", "values_to_raw", "store_scale"]


def values_to_raw(w: Weight, t: np.ndarray) -> np.ndarray:
    """Target code values -> raw codes (int64) of the nearest representable
    value (clipped to the code range; ties: even for int and float codes, the
    smaller table value for table codes). numpy or CuPy, as t."""
    code = weight_code(w)
    xp = nx.array_module(t)
    t = xp.asarray(t, dtype=np.float32)
    if code.kind in ("uint", "int", "ternary"):
        v = xp.clip(xp.rint(t), np.float32(code.lo), np.float32(code.hi)).astype(np.int64)
        if code.kind == "ternary":
            return v + np.int64(1)
        return v & np.int64((1 << code.bits) - 1)
    if code.kind == "table":
        table = np.asarray(code.table, dtype=np.float64)
        idx = np.argsort(table, kind="stable")
        sv = table[idx]
        below = _float32_below((sv[:-1] + sv[1:]) / 2)
        # the number of midpoints strictly below t (NaN: all of them) is the
        # position of the nearest value; for a float32 t, mid < t exactly
        # when below(mid) < t
        if len(below) <= 16:            # 4-bit tables: a pass per midpoint beats a search
            at_or_above = xp.zeros(t.shape, dtype=np.uint8)
            for b in below:
                at_or_above += t <= b
            pos = xp.subtract(np.uint8(len(below)), at_or_above)
        else:
            pos = xp.searchsorted(xp.asarray(below), t, side="left")
        return xp.take(xp.asarray(idx.astype(np.int64)), pos)
    if w.dtype == "float16":
        return nx.f32_to_f16_bits(t).astype(np.int64)
    return nx.to_storage(t, w.dtype).astype(np.int64)   # bfloat16 / fp8, RNE


def _float32_below(v: np.ndarray) -> np.ndarray:
    """The largest float32 <= each float64 value."""
    with np.errstate(over="ignore"):
        f = v.astype(np.float32)
    return np.where(f > v, np.nextafter(f, np.float32(-np.inf)), f)


def _fit_scale_fixed_zero(w: Weight, bmin, bmax, z: float):
    """Scale per block when the zero point is a fixed number (const or none),
    from the block's float64 min and max.

    The representable range is u/s in [L, H]. With L < 0 < H the scale is
    symmetric, absmax / min(H, -L), so both +absmax and -absmax fit (int4:
    absmax / 7, uint4 with z = 8: absmax / 7, nf4: absmax / 1, fp8 e4m3:
    absmax / 448). With one side empty (e.g. uint codes and no zero: L = 0)
    only that sign is fitted and the other clips to 0.
    """
    xp = nx.array_module(bmin)
    lo, hi = code_range(w)
    if w.formula == "(q - z) * s":
        umin, umax, L, H = bmin, bmax, lo - z, hi - z      # q = u/s + z
    else:
        # q = u/s with u = w + z; rounding is monotonic, so the extremes of
        # w + z are those of w, plus z
        umin, umax, L, H = bmin + z, bmax + z, lo, hi
    if L < 0 < H:
        return xp.maximum(xp.abs(umin), xp.abs(umax)) / min(H, -L)
    if H > 0:
        return xp.maximum(umax, 0.0) / H
    return xp.maximum(-umin, 0.0) / -L


def _pairwise_sum(a):
    """Sum over the last axis, float64, in one fixed order (neighbours
    pairwise, then their sums, ...): the same bits from numpy and CuPy,
    whose own reductions add in different orders."""
    xp = nx.array_module(a)
    while a.shape[-1] > 1:
        n = a.shape[-1]
        pairs = a[..., 0:n - 1:2] + a[..., 1::2]
        a = xp.concatenate([pairs, a[..., n - 1:]], axis=-1) if n % 2 else pairs
    return a[..., 0]


def store_scale(w: Weight, s_ideal: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Ideal logical scales -> (stored array, effective logical float32 scales).
    A degenerate (0, non-finite) scale - a block of zeros - becomes 1; others
    are held inside the scale dtype's positive finite range."""
    xp = nx.array_module(s_ideal)
    dt = w.scale.dtype
    s_ideal = xp.where(xp.isfinite(s_ideal) & (s_ideal > 0), s_ideal, 1.0)
    s_ideal = xp.clip(s_ideal, nx.min_positive(dt), nx.max_finite(dt))
    stored_logical = nx.to_storage(s_ideal, dt)            # elementwise rounding
    return to_layout(w.scale, stored_logical), nx.from_storage(stored_logical, dt)


def _int_zero_codes(w: Weight, z_ideal: np.ndarray, up: bool = False) -> np.ndarray:
    """Ideal zero points -> stored int zero codes: rounded (to nearest, or up),
    minus the offset, clipped to the zero dtype's range."""
    xp = nx.array_module(z_ideal)
    zc = WEIGHT_CODES[w.zero.dtype]
    z = xp.ceil(z_ideal) if up else xp.rint(z_ideal)
    return xp.clip(z - w.zero.offset, zc.lo, zc.hi).astype(np.int64)


def quantize(spec: SpecLike, w_real) -> QuantizedWeight:
    """Quantize a real weight [N, K] into exactly the spec's storage format.

    Deterministic, round-to-nearest everywhere. Per block of elements sharing a
    scale (group / channel / tensor):

    * zero kind int or float: asymmetric min/max over the block with 0 forced
      into the range, s = (max - min) / (hi - lo) over the code value range;
      "(q - z) * s": z = lo - min/s, "q * s - z": z = lo*s - min. Int zeros are
      rounded and clipped to the zero dtype (stored = z - offset); float zeros
      are stored in their dtype. z is computed from the *stored* scale, except
      for "q * s - z" with int zeros, where the unscaled integer z is fixed
      first (rounded up for uint codes) and s widened to fit around it.
    * zero kind none / const: the fixed-zero rule of `_fit_scale_fixed_zero`
      (symmetric absmax; uint codes with no zero: max / hi; nf4 / fp4 /
      codebook: absmax / max|table| for symmetric tables; fp8: absmax -> max
      finite; int8 per channel: absmax / 127).
    * ternary with no zero (BitNet b1.58): s = mean|w| (float64, summed in
      `_pairwise_sum`'s order), q = clip(round(w/s), -1, 1).
    * float16 / bfloat16 weights: a plain cast (a scale, if any, is 1).
    * e8m0 scales round the ideal scale *up* to a power of two so no element
      overflows the code range (MXFP4: smallest power of two >= absmax / 6).
    Then q = nearest code to w/s + z ("(q - z) * s") or (w + z)/s ("q * s - z"),
    in float32 with the stored scale and zero point.
    A block of zeros gets scale 1.

    w_real: a numpy array (or anything numpy takes) -> numpy arrays, the
    reference; a CuPy array -> CuPy arrays of the same bytes, computed on the
    current stream.
    """
    w = weight_of(spec)
    xp = nx.array_module(w_real)
    x = xp.asarray(w_real, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("quantize expects a 2-D [N, K] weight")
    out = {}
    blk = blocks(w, x)                                      # [R, G, L]
    s_eff = xp.ones((1, 1), np.float32)
    z_eff = _fixed_zero(w, xp)
    if w.scale is not None:
        # float32 extremes are exact in float64: what the float64 block gives
        bmin = blk.min(axis=-1).astype(np.float64)
        bmax = blk.max(axis=-1).astype(np.float64)
        # block range with 0 forced in, so that 0 stays (nearly) representable
        mn, mx = xp.minimum(bmin, 0.0), xp.maximum(bmax, 0.0)
        s_ideal, stored_z = _ideal_scale(w, blk, bmin, bmax, mn, mx)
        out["scales"], s_eff = store_scale(w, s_ideal)
        if w.zero.kind in ("int", "float"):
            out["zeros"], z_eff = _fitted_zeros(w, s_eff, mn, stored_z)
    return QuantizedWeight(qweight=_qweight(w, x, s_eff, z_eff), **out)


# numpy encodes the codes in bands of rows of about this many elements: the
# band's temporaries stay in cache and their memory is reused, where
# whole-weight ones are fresh memory each time (a 14336 x 4096 weight: 0.4 s
# against 1.5 s on a 2-core machine). CuPy takes the weight at once.
_BAND_ELEMENTS = 1 << 18


def _band_rows(w: Weight, N: int, K: int) -> int:
    """Rows per band: a multiple of the codes a word packs along n (all of
    N where packed planes spread a word over the whole axis)."""
    P = codes_per_container(w) if w.pack is not None and w.pack.axis == "n" else 1
    if N % P or (P > 1 and w.pack.planes):
        return N
    return max(P, _BAND_ELEMENTS // K // P * P)


def _qweight(w: Weight, x, s_eff, z_eff):
    """The stored codes: each element's nearest code to w/s + z ("(q - z) *
    s") or (w + z)/s, in float32 with the stored scale and zero point (logical
    [R, G]). + z also where z is 0: it turns -0.0 into +0.0, as it always has."""
    xp = nx.array_module(x)
    N, K = x.shape
    rows = _band_rows(w, N, K) if xp is np else N
    parts = []
    for r in range(0, N, rows):
        # [R, G, 1] against the band's [R, G, L] (R: the band's rows, or 1)
        band = lambda a: (a[r:r + rows] if a.shape[0] == N else a)[..., None]   # noqa: E731
        blk, s_b, z_b = blocks(w, x[r:r + rows]), band(s_eff), band(z_eff)
        if w.formula == "(q - z) * s":
            t = blk / s_b
            t += z_b
        else:
            t = blk + z_b
            t /= s_b
        parts.append(encode_codes(w, values_to_raw(w, t.reshape(-1, K))))
    n_axis = 0 if w.layout == "nt" else 1                       # of the stored qweight
    return parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=n_axis)


def _fixed_zero(w: Weight, xp):
    """The zero point of kinds none / const as float32 [1, 1] (fitted kinds
    start from 0 until _fitted_zeros replaces it)."""
    z = w.zero.value if w.zero.kind == "const" else 0
    return xp.full((1, 1), z, dtype=np.float32)


def _ideal_scale(w: Weight, blk, bmin, bmax, mn, mx):
    """-> (ideal logical scale [R, G], float64; stored int zeros or None).
    bmin / bmax: the blocks' extremes, mn / mx: with 0 forced in. See quantize."""
    xp = nx.array_module(blk)
    lo, hi = code_range(w)
    z_kind = w.zero.kind
    if w.dtype in ("float16", "bfloat16"):
        return xp.ones(blk.shape[:2], np.float64), None
    if weight_code(w).kind == "ternary" and z_kind == "none":
        return _pairwise_sum(xp.abs(blk).astype(np.float64)) / blk.shape[-1], None
    if z_kind in ("none", "const"):
        return _fit_scale_fixed_zero(w, bmin, bmax, float(w.zero.value if z_kind == "const" else 0)), None
    s = (mx - mn) / (hi - lo)
    if z_kind == "int" and w.formula == "q * s - z":
        # z is an unscaled integer here, so rounding it would move the window
        # by up to 1/2 in real units: fix z first (rounding up for uint codes,
        # whose window cannot go below 0), then widen s so that
        # [min, max] + z fits [lo*s, hi*s]
        stored_z = _int_zero_codes(w, lo * s - mn, up=lo >= 0)
        z = (stored_z + w.zero.offset).astype(np.float64)
        s = xp.maximum((mx + z) / hi if hi > 0 else 0.0, (mn + z) / lo if lo < 0 else 0.0)
        return s, stored_z
    return s, None


def _fitted_zeros(w: Weight, s_eff, mn, stored_z):
    """-> (stored zeros (kinds int / float), the zero points they stand for as
    float32 logical [R, G]), putting the block minimum at code lo, computed
    from the *stored* scale."""
    lo, _ = code_range(w)
    s64 = s_eff.astype(np.float64)
    if w.formula == "(q - z) * s":
        z_ideal = lo - mn / s64                 # lo = min/s + z
    else:
        z_ideal = lo * s64 - mn                 # lo*s = min + z
    if w.zero.kind == "float":
        z_stored = nx.to_storage(z_ideal, w.zero.dtype)          # elementwise rounding
        return to_layout(w.scale, z_stored), nx.from_storage(z_stored, w.zero.dtype)
    if stored_z is None:
        stored_z = _int_zero_codes(w, z_ideal)
    z_eff = (stored_z + w.zero.offset).astype(np.float32)
    return encode_zeros(w, to_layout(w.scale, stored_z)), z_eff
