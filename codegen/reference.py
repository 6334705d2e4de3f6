"""The reference semantics of a spec: numpy, slow, exact, and the oracle for
every GPU kernel test.

Conventions used throughout
---------------------------
* The logical weight W is [N, K]; a matmul computes out[M, N] = a[M, K] @ W^T.
* A *raw code* is the unsigned bit field a weight element occupies:
  0 .. 2**bits - 1 (int4 -1 is raw 15, ternary -1 is raw 0, fp8 is its bit
  pattern, float16/bfloat16 their 16-bit patterns). `encode_codes` also accepts
  signed values for int dtypes and masks them to their two's complement field.
* Storage dtypes: packed words are np.uint8 / np.int32 (the int32 holds the
  uint32 bit pattern). Unpacked elements: float16 -> np.float16, bfloat16 ->
  np.uint16 bits, fp8 -> np.uint8 bits, signed int codes -> np.int8 holding
  the value, every other code -> np.uint8 holding the raw code.
* Scale / zero arrays are handled internally in a *logical* form [R, G]:
  R = N (or 1 for a tensor scale), G = number of K groups (1 for channel and
  tensor scales). `_to_layout` / `_from_layout` convert to the stored shapes
  of `spec.scale_shape` / `spec.zero_shape`.
* Dequantization runs in float32: "(q - z) * s" or "q * s - z".
* The matmul itself runs in float64 (int32-accumulate specs: exact integer
  sums per group, then scales), then bias, then the activation, then one
  rounding to float32 (`reference_matmul_f32`) and one to the out dtype
  (`reference_matmul`).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import numpy as np

from . import numerics as nx
from .spec import (CONTAINER_BITS, WEIGHT_CODES, Pack, Scale, Spec, Weight,
                   codes_per_container, n_groups, scale_shape, weight_code,
                   weight_storage_shape, zero_shape)

__all__ = [
    "QuantizedWeight", "code_values", "code_range", "encode_codes", "decode_storage",
    "encode_zeros", "decode_zeros",
    "random_codes", "random_weight_tensors", "quantize", "dequantize",
    "scales_nk", "zeros_nk", "quantize_activation", "activation_to_float",
    "random_activation", "random_bias", "reference_matmul", "reference_matmul_f32",
    "float_or_bf16_bits", "apply_activation",
]

SpecLike = Union[Spec, Weight]


class QuantizedWeight(dict):
    """The stored tensors of one quantized weight, keyed "qweight", "scales"
    (absent when the spec has no scale) and "zeros" (present only for zero
    kinds float and int). Every value is a numpy array in the exact storage
    dtype and shape the kernels read."""


def _weight(spec: SpecLike) -> Weight:
    if isinstance(spec, Weight):
        return spec
    if spec.b is None:
        raise ValueError(f"spec {spec.name!r} (op {spec.op}) has no weight")
    return spec.b


# --- code values -------------------------------------------------------------------


def _signed(raw: np.ndarray, bits: int) -> np.ndarray:
    """Sign-extend a two's complement field of `bits` bits."""
    raw = np.asarray(raw, dtype=np.int64)
    return raw - ((raw >> (bits - 1)) & 1) * (1 << bits)


def code_values(spec: SpecLike, raw: np.ndarray) -> np.ndarray:
    """The number each raw code stands for (float32, exact)."""
    w = _weight(spec)
    code = weight_code(w)
    raw = np.asarray(raw, dtype=np.int64)
    if code.kind == "uint":
        return raw.astype(np.float32)
    if code.kind == "int":
        return _signed(raw, code.bits).astype(np.float32)
    if code.kind == "ternary":
        return (raw - 1).astype(np.float32)     # raw 3 is not a valid ternary code
    if code.kind == "table":
        return np.asarray(code.table, dtype=np.float32)[raw]
    if w.dtype == "float16":
        return nx.f16_bits_to_f32(raw)
    return nx.from_storage(raw, w.dtype)        # bfloat16 bits, fp8 bits


def code_range(spec: SpecLike) -> Tuple[float, float]:
    """Smallest and largest value a code can stand for."""
    w = _weight(spec)
    code = weight_code(w)
    if code.kind in ("uint", "int", "ternary"):
        return float(code.lo), float(code.hi)
    if code.kind == "table":
        return float(min(code.table)), float(max(code.table))
    m = nx.max_finite(w.dtype)
    return -m, m


def _n_raw_codes(w: Weight) -> int:
    """How many raw codes are valid (random codes draw from 0 .. this - 1)."""
    code = weight_code(w)
    if code.kind == "ternary":
        return 3
    if code.kind == "table":
        return len(code.table)
    return 1 << code.bits


# --- packing -------------------------------------------------------------------------


def _order(pack: Pack, P: int) -> Tuple[int, ...]:
    order = tuple(pack.order) if pack.order else tuple(range(P))
    if sorted(order) != list(range(P)):
        raise ValueError(f"pack order {order} is not a permutation of 0..{P - 1}")
    return order


def _pack(fields: np.ndarray, axis: int, bits: int, pack: Pack) -> np.ndarray:
    """Pack raw fields along `axis`: word j holds elements j*P .. j*P + P - 1,
    bit field i (field 0 = least significant) holding element j*P + order[i]."""
    P = CONTAINER_BITS[pack.container] // bits
    order = _order(pack, P)
    f = np.moveaxis(np.asarray(fields), axis, -1)
    if f.shape[-1] % P:
        raise ValueError(f"packed axis of length {f.shape[-1]} is not a multiple of P={P}")
    # uint32 arithmetic (containers are at most 32 bits): two's complement
    # fields keep their low `bits` bits under the mask.
    f = (f.astype(np.uint32) & np.uint32((1 << bits) - 1)).reshape(*f.shape[:-1], -1, P)
    word = np.zeros(f.shape[:-1], dtype=np.uint32)
    for i, src in enumerate(order):
        word |= f[..., src] << np.uint32(bits * i)
    word = np.ascontiguousarray(np.moveaxis(word, -1, axis))
    if pack.container == "uint8":
        return word.astype(np.uint8)
    return word.view(np.int32)


def _unpack(words: np.ndarray, axis: int, bits: int, pack: Pack) -> np.ndarray:
    """Inverse of `_pack`: raw fields (int64), the packed axis P times longer."""
    P = CONTAINER_BITS[pack.container] // bits
    order = _order(pack, P)
    words = np.asarray(words)
    u = words.view(np.uint32) if words.dtype == np.int32 else words
    u = np.moveaxis(u.astype(np.uint64), axis, -1)
    out = np.empty(u.shape + (P,), dtype=np.int64)
    for i, dst in enumerate(order):
        out[..., dst] = ((u >> np.uint64(bits * i)) & np.uint64((1 << bits) - 1)).astype(np.int64)
    out = out.reshape(*u.shape[:-1], -1)
    return np.moveaxis(out, -1, axis)


def _unpacked_dtype(dtype: str, kind: str):
    if dtype == "float16":
        return np.float16
    if dtype == "bfloat16":
        return np.uint16
    return np.int8 if kind == "int" else np.uint8


def _fields_to_elements(raw: np.ndarray, dtype: str, kind: str, bits: int) -> np.ndarray:
    """Raw fields -> one storage element each (see module docstring)."""
    raw = np.asarray(raw, dtype=np.int64) & ((1 << bits) - 1)
    if dtype == "float16":
        return raw.astype(np.uint16).view(np.float16)
    if kind == "int":
        return _signed(raw, bits).astype(np.int8)
    return raw.astype(_unpacked_dtype(dtype, kind))


def _elements_to_fields(elems: np.ndarray, dtype: str, bits: int) -> np.ndarray:
    elems = np.asarray(elems)
    if elems.dtype == np.float16:
        elems = elems.view(np.uint16)
    return elems.astype(np.int64) & ((1 << bits) - 1)


def _weight_pack_axis(w: Weight) -> int:
    """Axis of the stored (layout-ordered) array along which codes are packed."""
    k_axis = 1 if w.layout == "nt" else 0
    return k_axis if w.pack.axis == "k" else 1 - k_axis


def encode_codes(spec: SpecLike, codes_nk: np.ndarray) -> np.ndarray:
    """Raw codes [N, K] -> the stored qweight (layout, packing, storage dtype)."""
    w = _weight(spec)
    code = weight_code(w)
    codes = np.asarray(codes_nk)
    stored = codes if w.layout == "nt" else codes.T
    if w.pack is None:
        out = _fields_to_elements(stored, w.dtype, code.kind, code.bits)
    else:
        out = _pack(stored, _weight_pack_axis(w), code.bits, w.pack)
    return np.ascontiguousarray(out)


def decode_storage(spec: SpecLike, qweight: np.ndarray) -> np.ndarray:
    """The stored qweight -> raw codes [N, K] (int64); inverse of encode_codes."""
    w = _weight(spec)
    code = weight_code(w)
    if w.pack is None:
        stored = _elements_to_fields(qweight, w.dtype, code.bits)
    else:
        stored = _unpack(qweight, _weight_pack_axis(w), code.bits, w.pack)
    return np.ascontiguousarray(stored if w.layout == "nt" else stored.T)


# --- scale / zero layouts ----------------------------------------------------------------


def _ngroups(s: Optional[Scale], K: int) -> int:
    if s is None:
        return 1
    if s.granularity == "group" and K % s.group:
        raise ValueError(f"group {s.group} does not divide K={K}")
    return n_groups(s, K)


def _blocks(w: Weight, x: np.ndarray) -> np.ndarray:
    """[N, K] -> [R, G, L]: the elements sharing each scale along the last axis."""
    N, K = x.shape
    s = w.scale
    if s is None or s.granularity == "tensor":
        return x.reshape(1, 1, N * K)
    g = _ngroups(s, K)
    return x.reshape(N, g, K // g)


def _to_layout(s: Optional[Scale], logical: np.ndarray) -> np.ndarray:
    """Logical [R, G] -> the stored scale-shaped array."""
    if s is None or s.granularity == "tensor":
        return logical.reshape(1)
    if s.granularity == "channel":
        return logical[:, 0]
    return np.ascontiguousarray(logical.T if s.layout == "kn" else logical)


def _from_layout(s: Optional[Scale], stored: np.ndarray, N: int, K: int) -> np.ndarray:
    """Stored scale-shaped array -> logical [R, G]."""
    stored = np.asarray(stored)
    if s is None or s.granularity == "tensor":
        return stored.reshape(1, 1)
    if s.granularity == "channel":
        return stored.reshape(N, 1)
    return stored.T if s.layout == "kn" else stored


def _expand(logical: np.ndarray, N: int, K: int) -> np.ndarray:
    """Logical [R, G] -> per element [N, K]."""
    R, G = logical.shape
    return np.broadcast_to(np.repeat(logical, K // G, axis=1), (N, K))


def _zero_pack_axis(w: Weight) -> int:
    """Axis of the stored zero array along which zero codes are packed."""
    s = w.scale
    if s.granularity != "group":
        return 0
    g_axis, n_axis = (0, 1) if s.layout == "kn" else (1, 0)
    return n_axis if w.zero.pack.axis == "n" else g_axis


def _encode_int_zeros(w: Weight, stored_logical: np.ndarray) -> np.ndarray:
    """Integer stored zero codes, logical [R, G] -> stored array."""
    return encode_zeros(w, _to_layout(w.scale, stored_logical))


def _decode_int_zeros(w: Weight, stored: np.ndarray) -> np.ndarray:
    """Stored int zero array -> the stored integer values (same shape as the scales)."""
    z = w.zero
    zc = WEIGHT_CODES[z.dtype]
    if z.pack is None:
        return np.asarray(stored).astype(np.int64)
    raw = _unpack(stored, _zero_pack_axis(w), zc.bits, z.pack)
    return _signed(raw, zc.bits) if zc.kind == "int" else raw


def encode_zeros(spec: SpecLike, stored_values: np.ndarray) -> np.ndarray:
    """Int zero points as stored integers (z - offset), laid out like the
    scales (shape `scale_shape`) -> the stored zeros array (packed per
    zero.pack, or one np.uint8 / np.int8 per element)."""
    w = _weight(spec)
    if w.zero.kind != "int":
        raise ValueError("encode_zeros is for zero kind int")
    zc = WEIGHT_CODES[w.zero.dtype]
    arr = np.asarray(stored_values, dtype=np.int64)
    if w.zero.pack is None:
        return arr.astype(np.int8 if zc.kind == "int" else np.uint8)
    return np.ascontiguousarray(_pack(arr, _zero_pack_axis(w), zc.bits, w.zero.pack))


def decode_zeros(spec: SpecLike, zeros: np.ndarray) -> np.ndarray:
    """Inverse of encode_zeros: the stored integers (z - offset, int64),
    laid out like the scales."""
    w = _weight(spec)
    if w.zero.kind != "int":
        raise ValueError("decode_zeros is for zero kind int")
    return _decode_int_zeros(w, zeros)


def _scale_logical(w: Weight, tensors: dict, N: int, K: int) -> np.ndarray:
    if w.scale is None:
        return np.ones((1, 1), np.float32)
    stored = np.asarray(tensors["scales"])
    want = scale_shape(w.scale, N, K)
    if stored.shape != want:
        raise ValueError(f"scales have shape {stored.shape}, expected {want}")
    return _from_layout(w.scale, nx.from_storage(stored, w.scale.dtype), N, K)


def _zero_logical(w: Weight, tensors: dict, N: int, K: int) -> np.ndarray:
    z = w.zero
    if z.kind == "none":
        return np.zeros((1, 1), np.float32)
    if z.kind == "const":
        return np.full((1, 1), z.value, np.float32)
    stored = np.asarray(tensors["zeros"])
    want = zero_shape(w, N, K)
    if stored.shape != want:
        raise ValueError(f"zeros have shape {stored.shape}, expected {want}")
    if z.kind == "float":
        vals = nx.from_storage(stored, z.dtype)
    else:
        vals = (_decode_int_zeros(w, stored) + z.offset).astype(np.float32)
    return _from_layout(w.scale, vals, N, K)


def scales_nk(spec: SpecLike, tensors: dict, N: int, K: int) -> np.ndarray:
    """The scale applying to each weight element, float32 [N, K] (1 without a scale)."""
    return np.array(_expand(_scale_logical(_weight(spec), tensors, N, K), N, K))


def zeros_nk(spec: SpecLike, tensors: dict, N: int, K: int) -> np.ndarray:
    """The zero point z applying to each weight element, float32 [N, K]
    (int zeros already include the offset)."""
    return np.array(_expand(_zero_logical(_weight(spec), tensors, N, K), N, K))


# --- dequantize --------------------------------------------------------------------------


def _apply_formula(formula: str, q, s, z) -> np.ndarray:
    q, s, z = (np.asarray(v, dtype=np.float32) for v in (q, s, z))
    if formula == "(q - z) * s":
        return (q - z) * s
    if formula == "q * s - z":
        return q * s - z
    raise ValueError(f"unknown formula {formula!r}")


def dequantize(spec: SpecLike, tensors: dict, N: int, K: int) -> np.ndarray:
    """Stored tensors -> the real weight W, float32 [N, K]."""
    w = _weight(spec)
    qweight = np.asarray(tensors["qweight"])
    want = weight_storage_shape(w, N, K)
    if qweight.shape != want:
        raise ValueError(f"qweight has shape {qweight.shape}, expected {want}")
    q = code_values(w, decode_storage(w, qweight))
    return _apply_formula(w.formula, q, scales_nk(w, tensors, N, K), zeros_nk(w, tensors, N, K))


# --- quantize ----------------------------------------------------------------------------


def _values_to_raw(w: Weight, t: np.ndarray) -> np.ndarray:
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


def _store_scale(w: Weight, s_ideal: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Ideal logical scales -> (stored array, effective logical float32 scales).
    A degenerate (0, non-finite) scale - a block of zeros - becomes 1; others
    are held inside the scale dtype's positive finite range."""
    dt = w.scale.dtype
    s_ideal = np.where(np.isfinite(s_ideal) & (s_ideal > 0), s_ideal, 1.0)
    s_ideal = np.clip(s_ideal, nx.min_positive(dt), nx.max_finite(dt))
    stored_logical = nx.to_storage(s_ideal, dt)            # elementwise rounding
    return _to_layout(w.scale, stored_logical), nx.from_storage(stored_logical, dt)


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
    w = _weight(spec)
    x = np.asarray(w_real, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("quantize expects a 2-D [N, K] weight")
    N, K = x.shape
    out = {}
    s_eff = np.ones((1, 1), np.float32)
    if w.scale is not None:
        blk = _blocks(w, x).astype(np.float64)                  # [R, G, L]
        # block range with 0 forced in, so that 0 stays (nearly) representable
        mn = np.minimum(blk.min(axis=-1), 0.0)
        mx = np.maximum(blk.max(axis=-1), 0.0)
        s_ideal, stored_z = _ideal_scale(w, blk, mn, mx)
        out["scales"], s_eff = _store_scale(w, s_ideal)
        if w.zero.kind in ("int", "float"):
            out["zeros"] = _fitted_zeros(w, s_eff, mn, stored_z)

    s_el = _expand(s_eff, N, K).astype(np.float32)
    z_el = _expand(_zero_logical(w, out, N, K), N, K).astype(np.float32)
    if w.formula == "(q - z) * s":
        target = x / s_el + z_el
    else:
        target = (x + z_el) / s_el
    qweight = encode_codes(w, _values_to_raw(w, target))
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
        return nx.to_storage(_to_layout(w.scale, z_ideal), w.zero.dtype)
    if stored_z is None:
        stored_z = _int_zero_codes(w, z_ideal)
    return _encode_int_zeros(w, stored_z)


# --- random tensors ---------------------------------------------------------------------


def random_codes(spec: SpecLike, N: int, K: int, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random valid raw codes [N, K] (int64) over the whole code
    range: every int/uint/table code, ternary 0..2, fp8 every *finite* bit
    pattern. float16 / bfloat16 weights get the bits of N(0, 1/K) values
    instead (their full range would overflow any output)."""
    w = _weight(spec)
    code = weight_code(w)
    if code.kind == "float":
        if w.dtype in ("float16", "bfloat16"):
            vals = rng.standard_normal((N, K)).astype(np.float32) / np.float32(math.sqrt(K))
            return _values_to_raw(w, vals)
        finite = np.flatnonzero(np.isfinite(nx.from_storage(np.arange(256), w.dtype)))
        return rng.choice(finite, size=(N, K)).astype(np.int64)
    n = _n_raw_codes(w)
    # drawn as bytes when they fit (several times faster at LLM sizes)
    return rng.integers(0, n, size=(N, K), dtype=np.uint8 if n <= 256 else np.int64).astype(np.int64)


def _random_zero(w: Weight, s_eff: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random stored zeros (kinds float and int) for logical scales s_eff [R, G]."""
    z = w.zero
    lo, hi = code_range(w)
    if z.kind == "int":
        # stored codes whose zero point (stored + offset) lies in the code
        # range, as real zero points do (or the storable ones nearest to it)
        zc = WEIGHT_CODES[z.dtype]
        s_lo, s_hi = sorted(int(np.clip(v - z.offset, zc.lo, zc.hi))
                            for v in (math.ceil(lo), math.floor(hi)))
        stored = rng.integers(s_lo, s_hi + 1, size=s_eff.shape, dtype=np.int64)
        return _encode_int_zeros(w, stored)
    z_codes = rng.uniform(lo, hi, size=s_eff.shape)            # in code units
    z_real = z_codes if w.formula == "(q - z) * s" else z_codes * s_eff
    return nx.to_storage(_to_layout(w.scale, z_real), z.dtype)


def random_weight_tensors(spec: SpecLike, N: int, K: int,
                          rng: np.random.Generator) -> QuantizedWeight:
    """Random valid stored tensors: random codes, positive scales around
    1 / (max|code value| * sqrt(K)) (times U(0.5, 1.5); e8m0: the nearest power
    of two times 2**{-1,0,1}) so that out = a @ W^T stays O(1) for N(0,1)
    activations, and random zeros anywhere in the code range (int: stored
    codes whose zero point stored + offset is a code value). Never
    dequantizes to all zeros."""
    w = _weight(spec)
    _ngroups(w.scale, K)
    for _ in range(100):
        out = QuantizedWeight()
        out["qweight"] = encode_codes(w, random_codes(w, N, K, rng))
        if w.scale is not None:
            lo, hi = code_range(w)
            unit = 1.0 / (max(abs(lo), abs(hi), 1.0) * math.sqrt(K))
            rows = 1 if w.scale.granularity == "tensor" else N
            shape = (rows, _ngroups(w.scale, K))
            if w.scale.dtype == "e8m0":
                e = round(math.log2(unit)) + rng.integers(-1, 2, size=shape)
                s_ideal = np.ldexp(1.0, e)
            elif w.dtype in ("float16", "bfloat16"):
                s_ideal = rng.uniform(0.5, 1.5, size=shape)
            else:
                s_ideal = unit * rng.uniform(0.5, 1.5, size=shape)
            out["scales"], s_eff = _store_scale(w, s_ideal)
            if w.zero.kind in ("int", "float"):
                out["zeros"] = _random_zero(w, s_eff, rng)
        if np.any(dequantize(w, out, N, K) != 0):
            return out
    raise RuntimeError("could not draw a non-zero random weight")  # pragma: no cover


# --- activations -----------------------------------------------------------------------


def float_or_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values of an array that is either real values (any float
    dtype) or bfloat16 bit patterns (np.uint16): the numpy dtype says which."""
    x = np.asarray(x)
    if x.dtype == np.uint16:
        return nx.bf16_bits_to_f32(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"expected float values or bfloat16 bits (uint16), got {x.dtype}")
    return x.astype(np.float32)


def _quant_target(spec: Spec) -> str:
    return spec.out.dtype if spec.op == "quantize" else spec.a.dtype


def quantize_activation(spec: Spec, a: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric quantization of an activation [M, K].

    The target format is spec.a.dtype for matmul specs and spec.out.dtype for
    op "quantize" specs; the input is real values (float16/float32) or
    bfloat16 bits (np.uint16).
      int8:        a_scale = absmax / 127, codes = clip(rint(a / a_scale), -127, 127)
                   (np.int8; rint ties to even, -128 never produced)
      float8_e4m3: a_scale = absmax / 448, codes = e4m3(a / a_scale) RNE
                   saturating (np.uint8 bits)
    Both scale and division are float32 (a / a_scale, not a * (1 / a_scale)).
    A row of zeros gets a_scale = 1.0 (its codes are 0 either way, and 1 keeps
    kernels free of 0/0). Returns (codes, a_scale float32 [M]).
    """
    target = _quant_target(spec)
    x = float_or_bf16_bits(a)
    amax = np.abs(x).max(axis=-1)
    if target == "int8":
        qmax = np.float32(127.0)
    elif target == "float8_e4m3":
        qmax = np.float32(nx.FP8_E4M3_MAX)
    else:
        raise ValueError(f"cannot quantize activations to {target!r}")
    scale = (amax / qmax).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    t = x / scale[:, None]
    if target == "int8":
        codes = np.clip(np.rint(t), -127, 127).astype(np.int8)
    else:
        codes = nx.f32_to_fp8_e4m3(t)
    return codes, scale


def activation_to_float(spec: Spec, a: np.ndarray, a_scale: Optional[np.ndarray] = None) -> np.ndarray:
    """A stored activation (spec.a.dtype) -> real values float32 [M, K];
    int8 / fp8 codes are multiplied by the per-row a_scale (in float32).
    float16 / bfloat16 activations may also be given as real float values."""
    dt = spec.a.dtype
    a = np.asarray(a)
    if dt in ("float16", "bfloat16"):
        return float_or_bf16_bits(a)
    vals = a.astype(np.float32) if dt == "int8" else nx.fp8_e4m3_to_f32(a)
    if a_scale is None:
        if spec.a.scale == "row":
            raise ValueError(f"spec {spec.name!r}: {dt} activations need a_scale")
        return vals
    return vals * np.asarray(a_scale, dtype=np.float32).reshape(-1, 1)


def random_activation(spec: Spec, M: int, K: int,
                      rng: np.random.Generator) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Random activation in spec.a.dtype's storage: N(0, 1) values, cast
    (float16 / bfloat16 bits) or quantized per row with quantize_activation
    (int8 / float8_e4m3, returning their a_scale). For op "quantize" specs this
    is the float input. Returns (a, a_scale or None)."""
    x = rng.standard_normal((M, K)).astype(np.float32)
    dt = spec.a.dtype
    if dt == "float16":
        return x.astype(np.float16), None
    if dt == "bfloat16":
        return nx.f32_to_bf16_bits(x), None
    if spec.op == "quantize":
        raise ValueError(f"op quantize input dtype {dt!r} must be float16 or bfloat16")
    codes, scale = quantize_activation(spec, x)
    return codes, (scale if spec.a.scale == "row" else None)


def random_bias(spec: Spec, N: int, rng: np.random.Generator) -> np.ndarray:
    """Random bias[N] in the storage the kernels take for spec.out.dtype
    (float16, float32, bfloat16 as uint16 bits), with values k/8 in [-2, 2]
    that every output dtype holds exactly."""
    return nx.to_storage(rng.integers(-16, 17, size=N).astype(np.float32) / 8, spec.out.dtype)


# --- the matmul --------------------------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def apply_activation(name: str, x: np.ndarray) -> np.ndarray:
    if name == "none":
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "silu":
        with np.errstate(over="ignore"):
            return x / (1.0 + np.exp(-x))
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    raise ValueError(f"unknown activation {name!r}")


def _int_matmul(spec: Spec, a: np.ndarray, a_scale, tensors: dict, N: int, K: int) -> np.ndarray:
    """int32-accumulate path: exact integer sums of a_codes * (q - z) per
    scale group, then * s[n, g], summed over groups, then * a_scale[m]."""
    w = spec.b
    code = weight_code(w)
    if spec.a.dtype != "int8" or code.kind not in ("uint", "int", "ternary"):
        raise ValueError(f"spec {spec.name!r}: int32 accumulation needs int8 activations "
                         f"and integer weight codes")
    if w.formula != "(q - z) * s" or w.zero.kind == "float":
        raise ValueError(f"spec {spec.name!r}: int32 accumulation needs formula "
                         f"'(q - z) * s' with an integer zero point")
    q = code_values(w, decode_storage(w, tensors["qweight"])).astype(np.int64)
    z = zeros_nk(w, tensors, N, K).astype(np.int64)
    qz = q - z                                           # [N, K] integers
    s = _scale_logical(w, tensors, N, K).astype(np.float64)   # [R, G]
    G = s.shape[1]
    L = K // G
    ai = np.asarray(a).astype(np.int64)
    # Integer products summed in float64 (BLAS, fast) are exact while every
    # partial sum stays below 2**53; check the worst case rather than assume.
    bound = int(np.abs(ai).max(initial=0)) * int(np.abs(qz).max(initial=0)) * L
    if bound >= 2**53:
        raise ValueError("int32-accumulate reference: group too long for exact float64 sums")
    af, qf = ai.astype(np.float64), qz.astype(np.float64)
    acc = np.zeros((ai.shape[0], N), np.float64)
    for g in range(G):
        part = af[:, g * L:(g + 1) * L] @ qf[:, g * L:(g + 1) * L].T    # exact integers
        acc += part * s[:, g][None, :]
    if a_scale is not None:
        acc *= np.asarray(a_scale, dtype=np.float32).astype(np.float64)[:, None]
    elif spec.a.scale == "row":
        raise ValueError(f"spec {spec.name!r}: int8 activations need a_scale")
    return acc


def reference_matmul_f32(spec: Spec, a: np.ndarray, tensors: dict,
                         a_scale: Optional[np.ndarray] = None,
                         bias: Optional[np.ndarray] = None,
                         w_real: Optional[np.ndarray] = None) -> np.ndarray:
    """act(a_real @ W^T + bias) computed in float64, rounded once to float32.

    a: stored activation [M, K] (see activation_to_float); tensors: stored
    weight tensors; bias: [N], required iff spec.epilogue.bias, in the out
    dtype's storage (float16 / bfloat16 bits as np.uint16 / float32) - or any
    float array of real values (the numpy dtype tells bits from values).
    w_real: dequantize(spec, tensors, N, K) when the caller already has it
    (it takes seconds at LLM sizes; tests reuse one weight for many checks).
    """
    if spec.op != "matmul":
        raise ValueError(f"spec {spec.name!r} is op {spec.op}, not a matmul")
    w = spec.b
    a = np.asarray(a)
    M, K = a.shape
    N = _infer_n(w, tensors["qweight"], K)
    if spec.accumulate == "int32":
        acc = _int_matmul(spec, a, a_scale, tensors, N, K)
    else:
        a_real = activation_to_float(spec, a, a_scale).astype(np.float64)
        W = dequantize(w, tensors, N, K) if w_real is None else w_real
        acc = a_real @ np.asarray(W, dtype=np.float64).T
    if spec.epilogue.bias:
        if bias is None:
            raise ValueError(f"spec {spec.name!r} has a bias: pass bias=")
        acc = acc + float_or_bf16_bits(bias).reshape(N).astype(np.float64)
    elif bias is not None:
        raise ValueError(f"spec {spec.name!r} has no bias in its epilogue")
    return apply_activation(spec.epilogue.activation, acc).astype(np.float32)


def reference_matmul(spec: Spec, a: np.ndarray, tensors: dict,
                     a_scale: Optional[np.ndarray] = None,
                     bias: Optional[np.ndarray] = None) -> np.ndarray:
    """reference_matmul_f32 cast (RNE) to the out dtype's storage: np.float16,
    bfloat16 bits as np.uint16, or np.float32."""
    return nx.to_storage(reference_matmul_f32(spec, a, tensors, a_scale, bias), spec.out.dtype)


def _infer_n(w: Weight, qweight: np.ndarray, K: int) -> int:
    """N from the stored qweight's shape (layout and packing known)."""
    rows, cols = np.asarray(qweight).shape
    stored_n = rows if w.layout == "nt" else cols
    if w.pack is not None and w.pack.axis == "n":
        stored_n *= codes_per_container(w)
    return stored_n
