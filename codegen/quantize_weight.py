"""Quantizing a real weight into exactly a spec's storage format
(`quantize`): deterministic, round-to-nearest, the rules in its docstring.
Activations are quantized by reference.quantize_activation.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from . import numerics as nx
from .reference import code_range, zero_logical
from .spec import WEIGHT_CODES, Weight, weight_code
from .storage import (QuantizedWeight, SpecLike, blocks, encode_codes, encode_zeros,
                      expand, to_layout, weight_of)

__all__ = ["quantize", "values_to_raw", "store_scale"]


def values_to_raw(w: Weight, t: np.ndarray) -> np.ndarray:
    """Target code values -> raw codes of the nearest representable value
    (clipped to the code range; ties: even for int and float codes, the smaller
    table value for table codes)."""
    code = weight_code(w)
    t = np.asarray(t, dtype=np.float32)
    if code.kind in ("uint", "int", "ternary"):
        v = np.clip(np.rint(t), code.lo, code.hi).astype(np.int64)
        if code.kind == "ternary":
            return v + 1
        return v & ((1 << code.bits) - 1)
    if code.kind == "table":
        table = np.asarray(code.table, dtype=np.float64)
        idx = np.argsort(table, kind="stable")
        sv = table[idx]
        mids = (sv[:-1] + sv[1:]) / 2
        # number of midpoints strictly below t = position of the nearest value
        return idx[np.searchsorted(mids, t.astype(np.float64), side="left")].astype(np.int64)
    if w.dtype == "float16":
        return nx.f32_to_f16_bits(t).astype(np.int64)
    return nx.to_storage(t, w.dtype).astype(np.int64)   # bfloat16 / fp8, RNE


def _fit_scale_fixed_zero(w: Weight, blk: np.ndarray, z: float) -> np.ndarray:
    """Scale per block when the zero point is a fixed number (const or none).

    The representable range is u/s in [L, H]. With L < 0 < H the scale is
    symmetric, absmax / min(H, -L), so both +absmax and -absmax fit (int4:
    absmax / 7, uint4 with z = 8: absmax / 7, nf4: absmax / 1, fp8 e4m3:
    absmax / 448). With one side empty (e.g. uint codes and no zero: L = 0)
    only that sign is fitted and the other clips to 0.
    """
    lo, hi = code_range(w)
    if w.formula == "(q - z) * s":
        u, L, H = blk, lo - z, hi - z           # q = u/s + z
    else:
        u, L, H = blk + z, lo, hi               # q = (u)/s with u = w + z
    if L < 0 < H:
        return np.abs(u).max(axis=-1) / min(H, -L)
    if H > 0:
        return np.maximum(u, 0).max(axis=-1) / H
    return np.maximum(-u, 0).max(axis=-1) / -L


def store_scale(w: Weight, s_ideal: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Ideal logical scales -> (stored array, effective logical float32 scales).
    A degenerate (0, non-finite) scale - a block of zeros - becomes 1; others
    are held inside the scale dtype's positive finite range."""
    dt = w.scale.dtype
    s_ideal = np.where(np.isfinite(s_ideal) & (s_ideal > 0), s_ideal, 1.0)
    s_ideal = np.clip(s_ideal, nx.min_positive(dt), nx.max_finite(dt))
    stored_logical = nx.to_storage(s_ideal, dt)            # elementwise rounding
    return to_layout(w.scale, stored_logical), nx.from_storage(stored_logical, dt)


def _int_zero_codes(w: Weight, z_ideal: np.ndarray, up: bool = False) -> np.ndarray:
    """Ideal zero points -> stored int zero codes: rounded (to nearest, or up),
    minus the offset, clipped to the zero dtype's range."""
    zc = WEIGHT_CODES[w.zero.dtype]
    z = np.ceil(z_ideal) if up else np.rint(z_ideal)
    return np.clip(z - w.zero.offset, zc.lo, zc.hi).astype(np.int64)


def quantize(spec: SpecLike, w_real: np.ndarray) -> QuantizedWeight:
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
    * ternary with no zero (BitNet b1.58): s = mean|w|, q = clip(round(w/s), -1, 1).
    * float16 / bfloat16 weights: a plain cast (a scale, if any, is 1).
    * e8m0 scales round the ideal scale *up* to a power of two so no element
      overflows the code range (MXFP4: smallest power of two >= absmax / 6).
    Then q = nearest code to w/s + z ("(q - z) * s") or (w + z)/s ("q * s - z").
    A block of zeros gets scale 1.
    """
    w = weight_of(spec)
    x = np.asarray(w_real, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("quantize expects a 2-D [N, K] weight")
    N, K = x.shape
    out = {}
    s_eff = np.ones((1, 1), np.float32)
    if w.scale is not None:
        blk = blocks(w, x).astype(np.float64)                  # [R, G, L]
        # block range with 0 forced in, so that 0 stays (nearly) representable
        mn = np.minimum(blk.min(axis=-1), 0.0)
        mx = np.maximum(blk.max(axis=-1), 0.0)
        s_ideal, stored_z = _ideal_scale(w, blk, mn, mx)
        out["scales"], s_eff = store_scale(w, s_ideal)
        if w.zero.kind in ("int", "float"):
            out["zeros"] = _fitted_zeros(w, s_eff, mn, stored_z)

    s_el = expand(s_eff, N, K).astype(np.float32)
    z_el = expand(zero_logical(w, out, N, K), N, K).astype(np.float32)
    if w.formula == "(q - z) * s":
        target = x / s_el + z_el
    else:
        target = (x + z_el) / s_el
    qweight = encode_codes(w, values_to_raw(w, target))
    return QuantizedWeight(qweight=qweight, **out)


def _ideal_scale(w: Weight, blk, mn, mx):
    """-> (ideal logical scale [R, G], stored int zeros or None). See quantize."""
    lo, hi = code_range(w)
    z_kind = w.zero.kind
    if w.dtype in ("float16", "bfloat16"):
        return np.ones(blk.shape[:2]), None
    if weight_code(w).kind == "ternary" and z_kind == "none":
        return np.abs(blk).mean(axis=-1), None
    if z_kind in ("none", "const"):
        return _fit_scale_fixed_zero(w, blk, float(w.zero.value if z_kind == "const" else 0)), None
    s = (mx - mn) / (hi - lo)
    if z_kind == "int" and w.formula == "q * s - z":
        # z is an unscaled integer here, so rounding it would move the window
        # by up to 1/2 in real units: fix z first (rounding up for uint codes,
        # whose window cannot go below 0), then widen s so that
        # [min, max] + z fits [lo*s, hi*s]
        stored_z = _int_zero_codes(w, lo * s - mn, up=lo >= 0)
        z = (stored_z + w.zero.offset).astype(np.float64)
        s = np.maximum((mx + z) / hi if hi > 0 else 0.0, (mn + z) / lo if lo < 0 else 0.0)
        return s, stored_z
    return s, None


def _fitted_zeros(w: Weight, s_eff: np.ndarray, mn: np.ndarray, stored_z) -> np.ndarray:
    """Stored zeros (kinds int / float) putting the block minimum at code lo,
    computed from the *stored* scale."""
    lo, _ = code_range(w)
    s64 = s_eff.astype(np.float64)
    if w.formula == "(q - z) * s":
        z_ideal = lo - mn / s64                 # lo = min/s + z
    else:
        z_ideal = lo * s64 - mn                 # lo*s = min + z
    if w.zero.kind == "float":
        return nx.to_storage(to_layout(w.scale, z_ideal), w.zero.dtype)
    if stored_z is None:
        stored_z = _int_zero_codes(w, z_ideal)
    return encode_zeros(w, to_layout(w.scale, stored_z))
