"""How a quantized weight is stored: its raw codes packed into containers
(or one storage element each), its scales and zero points in their stored
layouts, both ways.  What the codes mean is reference.py's.

Conventions used throughout
---------------------------
* The logical weight W is [N, K].
* A *raw code* is the unsigned bit field a weight element occupies:
  0 .. 2**bits - 1 (int4 -1 is raw 15, ternary -1 is raw 0, fp8 is its bit
  pattern, float16/bfloat16 their 16-bit patterns). `encode_codes` also accepts
  signed values for int dtypes and masks them to their two's complement field.
* Storage dtypes: packed words are np.uint8 / np.int32 (the int32 holds the
  uint32 bit pattern). Unpacked elements: float16 -> np.float16, bfloat16 ->
  np.uint16 bits, fp8 -> np.uint8 bits, signed int codes -> np.int8 holding
  the value, every other code -> np.uint8 holding the raw code.
* Scale / zero arrays are handled in a *logical* form [R, G]: R = N (or 1 for
  a tensor scale), G = number of K groups (1 for channel and tensor scales).
  `to_layout` / `from_layout` convert to the stored shapes of
  `spec.scale_shape` / `spec.zero_shape`.
* Both directions run on numpy or CuPy arrays alike (numerics.array_module):
  quantize_weight on the GPU stores the same bytes, and reference.dequantize
  on the GPU reads them back to the same values.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import numpy as np

from . import numerics as nx
from .spec import (CONTAINER_BITS, WEIGHT_CODES, Pack, Scale, Spec, Weight,
                   n_groups, weight_code)

__all__ = [
    "QuantizedWeight", "SpecLike", "weight_of", "sign_extend", "encode_codes",
    "decode_storage", "encode_zeros", "decode_zeros", "checked_n_groups", "blocks",
    "to_layout", "from_layout", "expand",
]

SpecLike = Union[Spec, Weight]


class QuantizedWeight(dict):
    """The stored tensors of one quantized weight, keyed "qweight", "scales"
    (absent when the spec has no scale) and "zeros" (present only for zero
    kinds float and int). Every value is a numpy array in the exact storage
    dtype and shape the kernels read."""


def weight_of(spec: SpecLike) -> Weight:
    """The weight of a matmul spec (a Weight as it is)."""
    if isinstance(spec, Weight):
        return spec
    if spec.b is None:
        raise ValueError(f"spec {spec.name!r} (op {spec.op}) has no weight")
    return spec.b


def sign_extend(raw: np.ndarray, bits: int) -> np.ndarray:
    """Sign-extend a two's complement field of `bits` bits."""
    raw = nx.array_module(raw).asarray(raw, dtype=np.int64)
    return raw - ((raw >> (bits - 1)) & 1) * (1 << bits)


# --- packing -------------------------------------------------------------------------


def _order(pack: Pack, P: int) -> Tuple[int, ...]:
    order = tuple(pack.order) if pack.order else tuple(range(P))
    if sorted(order) != list(range(P)):
        raise ValueError(f"pack order {order} is not a permutation of 0..{P - 1}")
    return order


def _pack(fields: np.ndarray, axis: int, bits: int, pack: Pack) -> np.ndarray:
    """Pack raw fields along `axis`: word j holds elements j*P .. j*P + P - 1,
    bit field i (field 0 = least significant) holding element j*P + order[i]
    (pack.planes: element order[i] * W + j of the W words' P planes)."""
    P = CONTAINER_BITS[pack.container] // bits
    order = _order(pack, P)
    xp = nx.array_module(fields)
    f = xp.moveaxis(xp.asarray(fields), axis, -1)
    if f.shape[-1] % P:
        raise ValueError(f"packed axis of length {f.shape[-1]} is not a multiple of P={P}")
    # uint32 arithmetic (containers are at most 32 bits): two's complement
    # fields keep their low `bits` bits under the mask.
    f = f.astype(np.uint32) & np.uint32((1 << bits) - 1)
    if pack.planes:
        f = xp.moveaxis(f.reshape(*f.shape[:-1], P, -1), -2, -1)     # [..., W, P] of planes
    else:
        f = f.reshape(*f.shape[:-1], -1, P)
    word = xp.zeros(f.shape[:-1], dtype=np.uint32)
    for i, src in enumerate(order):
        word |= f[..., src] << np.uint32(bits * i)
    word = xp.ascontiguousarray(xp.moveaxis(word, -1, axis))
    if pack.container == "uint8":
        return word.astype(np.uint8)
    return word.view(np.int32)


def _unpack(words: np.ndarray, axis: int, bits: int, pack: Pack) -> np.ndarray:
    """Inverse of `_pack`: raw fields (int64), the packed axis P times longer."""
    P = CONTAINER_BITS[pack.container] // bits
    order = _order(pack, P)
    xp = nx.array_module(words)
    words = xp.asarray(words)
    u = words.view(np.uint32) if words.dtype == np.int32 else words
    u = xp.moveaxis(u.astype(np.uint64), axis, -1)
    out = xp.empty(u.shape + (P,), dtype=np.int64)
    for i, dst in enumerate(order):
        out[..., dst] = ((u >> np.uint64(bits * i)) & np.uint64((1 << bits) - 1)).astype(np.int64)
    if pack.planes:
        out = xp.moveaxis(out, -1, -2)                            # [..., P, W]: plane by plane
    out = out.reshape(*u.shape[:-1], -1)
    return xp.moveaxis(out, -1, axis)


def _unpacked_dtype(dtype: str, kind: str):
    if dtype == "float16":
        return np.float16
    if dtype == "bfloat16":
        return np.uint16
    return np.int8 if kind == "int" else np.uint8


def _fields_to_elements(raw: np.ndarray, dtype: str, kind: str, bits: int) -> np.ndarray:
    """Raw fields -> one storage element each (see module docstring)."""
    raw = nx.array_module(raw).asarray(raw, dtype=np.int64) & np.int64((1 << bits) - 1)
    if dtype == "float16":
        return raw.astype(np.uint16).view(np.float16)
    if kind == "int":
        return sign_extend(raw, bits).astype(np.int8)
    return raw.astype(_unpacked_dtype(dtype, kind))


def _elements_to_fields(elems: np.ndarray, dtype: str, bits: int) -> np.ndarray:
    elems = nx.array_module(elems).asarray(elems)
    if elems.dtype == np.float16:
        elems = elems.view(np.uint16)
    return elems.astype(np.int64) & np.int64((1 << bits) - 1)


def _weight_pack_axis(w: Weight) -> int:
    """Axis of the stored (layout-ordered) array along which codes are packed."""
    k_axis = 1 if w.layout == "nt" else 0
    return k_axis if w.pack.axis == "k" else 1 - k_axis


def encode_codes(spec: SpecLike, codes_nk: np.ndarray) -> np.ndarray:
    """Raw codes [N, K] -> the stored qweight (layout, packing, storage dtype)."""
    w = weight_of(spec)
    code = weight_code(w)
    xp = nx.array_module(codes_nk)
    codes = xp.asarray(codes_nk)
    stored = codes if w.layout == "nt" else codes.T
    if w.pack is None:
        out = _fields_to_elements(stored, w.dtype, code.kind, code.bits)
    else:
        out = _pack(stored, _weight_pack_axis(w), code.bits, w.pack)
    return xp.ascontiguousarray(out)


def decode_storage(spec: SpecLike, qweight: np.ndarray) -> np.ndarray:
    """The stored qweight -> raw codes [N, K] (int64); inverse of encode_codes."""
    w = weight_of(spec)
    code = weight_code(w)
    if w.pack is None:
        stored = _elements_to_fields(qweight, w.dtype, code.bits)
    else:
        stored = _unpack(qweight, _weight_pack_axis(w), code.bits, w.pack)
    return nx.array_module(stored).ascontiguousarray(stored if w.layout == "nt" else stored.T)


# --- scale / zero layouts ----------------------------------------------------------------


def checked_n_groups(s: Optional[Scale], K: int) -> int:
    """G, the scale groups along K (1 without a scale); a group that does not
    divide K is an error."""
    if s is None:
        return 1
    if s.granularity == "group" and K % s.group:
        raise ValueError(f"group {s.group} does not divide K={K}")
    return n_groups(s, K)


def blocks(w: Weight, x: np.ndarray) -> np.ndarray:
    """[N, K] -> [R, G, L]: the elements sharing each scale along the last axis."""
    N, K = x.shape
    s = w.scale
    if s is None or s.granularity == "tensor":
        return x.reshape(1, 1, N * K)
    g = checked_n_groups(s, K)
    return x.reshape(N, g, K // g)


def to_layout(s: Optional[Scale], logical: np.ndarray) -> np.ndarray:
    """Logical [R, G] -> the stored scale-shaped array."""
    if s is None or s.granularity == "tensor":
        return logical.reshape(1)
    if s.granularity == "channel":
        return logical[:, 0]
    return nx.array_module(logical).ascontiguousarray(logical.T if s.layout == "kn" else logical)


def from_layout(s: Optional[Scale], stored: np.ndarray, N: int, K: int) -> np.ndarray:
    """Stored scale-shaped array -> logical [R, G]."""
    stored = nx.array_module(stored).asarray(stored)
    if s is None or s.granularity == "tensor":
        return stored.reshape(1, 1)
    if s.granularity == "channel":
        return stored.reshape(N, 1)
    return stored.T if s.layout == "kn" else stored


def expand(logical: np.ndarray, N: int, K: int) -> np.ndarray:
    """Logical [R, G] -> per element [N, K]."""
    R, G = logical.shape
    xp = nx.array_module(logical)
    return xp.broadcast_to(xp.repeat(logical, K // G, axis=1), (N, K))


def _zero_pack_axis(w: Weight) -> int:
    """Axis of the stored zero array along which zero codes are packed."""
    s = w.scale
    if s.granularity != "group":
        return 0
    g_axis, n_axis = (0, 1) if s.layout == "kn" else (1, 0)
    return n_axis if w.zero.pack.axis == "n" else g_axis


def _decode_int_zeros(w: Weight, stored: np.ndarray) -> np.ndarray:
    """Stored int zero array -> the stored integer values (same shape as the scales)."""
    z = w.zero
    zc = WEIGHT_CODES[z.dtype]
    if z.pack is None:
        return nx.array_module(stored).asarray(stored).astype(np.int64)
    raw = _unpack(stored, _zero_pack_axis(w), zc.bits, z.pack)
    return sign_extend(raw, zc.bits) if zc.kind == "int" else raw


def encode_zeros(spec: SpecLike, stored_values: np.ndarray) -> np.ndarray:
    """Int zero points as stored integers (z - offset), laid out like the
    scales (shape `scale_shape`) -> the stored zeros array (packed per
    zero.pack, or one np.uint8 / np.int8 per element)."""
    w = weight_of(spec)
    if w.zero.kind != "int":
        raise ValueError("encode_zeros is for zero kind int")
    zc = WEIGHT_CODES[w.zero.dtype]
    xp = nx.array_module(stored_values)
    arr = xp.asarray(stored_values, dtype=np.int64)
    if w.zero.pack is None:
        return arr.astype(np.int8 if zc.kind == "int" else np.uint8)
    return xp.ascontiguousarray(_pack(arr, _zero_pack_axis(w), zc.bits, w.zero.pack))


def decode_zeros(spec: SpecLike, zeros: np.ndarray) -> np.ndarray:
    """Inverse of encode_zeros: the stored integers (z - offset, int64),
    laid out like the scales."""
    w = weight_of(spec)
    if w.zero.kind != "int":
        raise ValueError("decode_zeros is for zero kind int")
    return _decode_int_zeros(w, zeros)
