"""Transcode: one weight's stored tensors from one spec's storage to another's.

Two specs store the same logical weight when they agree on everything that
gives a code, a scale or a zero point its meaning (`meaning`) and differ only
in where those sit (`STORAGE_FIELDS`: the weight's layout and packing, the
scales' layout, the zero points' packing). Between such specs a transcode
only moves bits: nothing is re-quantized, nothing is rounded, so the
reference dequantization of the result equals that of the input exactly.
Everything is derived from the two specs; no format has code of its own.

The same code runs on numpy arrays (CPU tests, checkpoint conversion) and on
CuPy arrays (load time on the GPU, on the current stream): only operations
both have (views, shifts, masks, transposes) are used. It works on the raw
bit fields, one byte each, and on whole words where the packing allows:

* same container and packed axis, other word grid or field order: the words
  are transposed and their fields permuted in place (GPTQ [K/8, N] -> [N, K/8]);
* anything else: fields out of the source words, one transpose, fields into
  the target words (AWQ packed along n -> packed along k).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import numerics
from .errors import UserError
from .lower import DTYPE_BYTES
from .spec import (CONTAINER_BITS, WEIGHT_CODES, Pack, Spec, Weight, codes_per_container,
                   stored_shapes, weight_code)
from .storage import weight_of

__all__ = ["TranscodeError", "STORAGE_FIELDS", "meaning", "mismatches", "check_compatible",
           "steps", "transcode", "array_module"]

# The fields of a weight that only say where things are stored.
STORAGE_FIELDS = ("layout", "pack", "scale.layout", "zero.pack")


class TranscodeError(UserError):
    """Two specs that do not store the same logical weight, or tensors that
    are not the source spec's."""


def meaning(w: Weight) -> Weight:
    """w with its storage fields cleared: two weights with equal meanings
    dequantize the same codes, scales and zero points to the same values."""
    m = dataclasses.replace(w, layout="nt", pack=None)
    if m.scale is not None:
        m = dataclasses.replace(m, scale=dataclasses.replace(m.scale, layout="kn"))
    return dataclasses.replace(m, zero=dataclasses.replace(m.zero, pack=None))


def mismatches(src: Weight, dst: Weight) -> List[str]:
    """'field: src vs dst' for each field of meaning the two weights differ in."""
    a, b = dataclasses.asdict(meaning(src)), dataclasses.asdict(meaning(dst))
    out: List[str] = []

    def walk(x, y, path):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in x:
                walk(x[k], y.get(k), f"{path}.{k}" if path else k)
        elif x != y:
            out.append(f"b.{path}: {x!r} vs {y!r}")
    walk(a, b, "")
    return out


def check_compatible(src, dst) -> None:
    """TranscodeError unless src and dst (Specs or Weights) store the same
    logical weight."""
    ws, wd = weight_of(src), weight_of(dst)
    bad = mismatches(ws, wd)
    if bad:
        raise TranscodeError(
            f"cannot transcode {_label(src)} to {_label(dst)}: they differ in " + "; ".join(bad)
            + " (a transcode moves codes, scales and zero points; it never changes what they mean)")


def _label(x) -> str:
    return f"spec {x.name}" if isinstance(x, Spec) else "the weight"


# --- what happens to each tensor -----------------------------------------------------------

def _order(p: Optional[Pack], P: int) -> Tuple[int, ...]:
    return tuple(p.order) if p is not None and p.order else tuple(range(P))


def steps(src, dst) -> Dict[str, str]:
    """What a transcode does to each stored tensor, in words (plan.json):
    'kept', 'transposed', 'fields reordered', 'transposed, fields reordered'
    or 'repacked'."""
    check_compatible(src, dst)
    ws, wd = weight_of(src), weight_of(dst)
    moved = _scale_transposed(ws, wd) if ws.scale is not None else False
    out = {"qweight": _describe(_weight_packed(ws), _weight_packed(wd)) if ws.pack
           else ("transposed" if ws.layout != wd.layout else "kept")}
    if ws.scale is not None:
        out["scales"] = "transposed" if moved else "kept"
    if ws.zero.kind == "float" or (ws.zero.kind == "int" and ws.zero.pack is None):
        out["zeros"] = out["scales"]
    elif ws.zero.kind == "int":
        out["zeros"] = _describe(_zero_packed(ws), _zero_packed(wd))
    return out


def _word_moves(src: "Packed", dst: "Packed") -> Optional[Tuple[bool, bool]]:
    """(transpose the word grid, permute the fields) when dst's words are
    src's words moved (one container, one packed axis); None otherwise."""
    if src.axis != dst.axis or src.container != dst.container or src.planes != dst.planes:
        return None
    return src.rows != dst.rows, src.order != dst.order


def _describe(src: "Packed", dst: "Packed") -> str:
    moves = _word_moves(src, dst)
    if moves is None:
        return "repacked"
    return ", ".join(s for s, on in zip(("transposed", "fields reordered"), moves) if on) or "kept"


def _scale_transposed(ws: Weight, wd: Weight) -> bool:
    return ws.scale.granularity == "group" and ws.scale.layout != wd.scale.layout


# --- array module -------------------------------------------------------------------------

def array_module(x):
    """numerics.array_module of an array transcode takes: numpy or CuPy
    (anything else is refused, not read as a numpy array)."""
    if not isinstance(x, np.ndarray) and type(x).__module__.split(".")[0] != "cupy":
        raise TranscodeError(f"transcode takes numpy or CuPy arrays, not {type(x).__name__}")
    return numerics.array_module(x)


def _u(x, xp):
    """Unsigned view of a stored word array (int32 words may come as uint32)."""
    if x.dtype == xp.int32:
        return x.view(xp.uint32)
    if x.dtype == xp.int8:
        return x.view(xp.uint8)
    if x.dtype == xp.float16:
        return x.view(xp.uint16)
    return x


# --- packed arrays -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Packed:
    """A 2-D array of words: stored dim 0 walks logical axis `rows`, dim 1
    the other; each word holds `P` codes of `bits` bits along logical axis
    `axis`, element order[i] of its run in field i (planes: element j of
    plane order[i], spec.Pack's)."""
    rows: str
    axis: str
    container: str
    order: Tuple[int, ...]
    bits: int
    planes: bool = False

    @property
    def P(self) -> int:
        return len(self.order)


def _weight_packed(w: Weight) -> Packed:
    P = codes_per_container(w)
    return Packed("n" if w.layout == "nt" else "k", w.pack.axis, w.pack.container,
                  _order(w.pack, P), weight_code(w).bits, w.pack.planes)


def _zero_packed(w: Weight) -> Packed:
    """Zero points sit like the scales: [K/G, N] (kn) or [N, K/G] (nk); a
    channel scale's are [N], taken as one row [1, N] here."""
    z, s = w.zero, w.scale
    bits = WEIGHT_CODES[z.dtype].bits
    rows = "k" if s.granularity != "group" or s.layout == "kn" else "n"
    axis = z.pack.axis if s.granularity == "group" else "n"
    return Packed(rows, axis, z.pack.container, _order(z.pack, CONTAINER_BITS[z.pack.container] // bits),
                  bits, z.pack.planes)


def _wide(xp, container: str):
    return xp.uint32 if container == "int32" else xp.uint8


def _stored(xp, u, container: str):
    """Words computed in some unsigned type -> the container's storage dtype."""
    u = xp.ascontiguousarray(u.astype(_wide(xp, container), copy=False))
    return u.view(xp.int32) if container == "int32" else u


def _move(xp, x, src: Packed, dst: Packed):
    """x stored as src -> the same codes stored as dst (words of dst.container)."""
    u = _u(x, xp)
    moves = _word_moves(src, dst)
    if moves is not None:
        transpose, reorder = moves
        permute = None
        if reorder:
            permute = lambda b: _permute_fields(xp, b, src.bits, src.order, dst.order)   # noqa: E731
        return _stored(xp, _banded(xp, u, transpose, permute), dst.container)
    if src.axis != dst.axis and not (src.planes or dst.planes):
        return _stored(xp, _cross(xp, u, src, dst), dst.container)
    # Another container on the same axis (a byte-packed format to int32
    # words), or planes: through one byte per field.
    fields = _unpack(xp, u, 1 if src.rows != src.axis else 0, src)
    if src.rows != dst.rows:
        fields = _transpose(xp, fields)
    return _pack(xp, xp.ascontiguousarray(fields), 1 if dst.rows != dst.axis else 0, dst)


def _unpack(xp, u, axis: int, p: Packed):
    """Words -> their raw fields, one uint8 each, `axis` P times longer:
    element j*P + order[i] is field i of word j, or with planes element
    order[i] * W + j (storage.py's convention)."""
    P, bits = p.P, p.bits
    c = u.dtype.type                  # typed constants: no promotion in numpy or CuPy
    mask = c((1 << bits) - 1)
    R, C = u.shape
    if axis == 1:
        out = xp.empty((R, P, C) if p.planes else (R, C, P), dtype=xp.uint8)
        for i, e in enumerate(p.order):
            if p.planes:
                out[:, e, :] = (u >> c(bits * i)) & mask
            else:
                out[:, :, e] = (u >> c(bits * i)) & mask
        return out.reshape(R, C * P)
    out = xp.empty((P, R, C) if p.planes else (R, P, C), dtype=xp.uint8)
    for i, e in enumerate(p.order):
        if p.planes:
            out[e] = (u >> c(bits * i)) & mask
        else:
            out[:, e] = (u >> c(bits * i)) & mask
    return out.reshape(R * P, C)


def _pack(xp, fields, axis: int, p: Packed):
    """Inverse of _unpack: raw uint8 fields -> words of p.container."""
    P, bits = p.P, p.bits
    wide = _wide(xp, p.container)
    R, C = fields.shape
    if axis == 1:
        if p.planes:
            f = fields.reshape(R, P, C // P)
            pick = lambda e: f[:, e, :]        # noqa: E731
        else:
            f = fields.reshape(R, C // P, P)
            pick = lambda e: f[:, :, e]        # noqa: E731
    else:
        if p.planes:
            f = fields.reshape(P, R // P, C)
            pick = lambda e: f[e]              # noqa: E731
        else:
            f = fields.reshape(R // P, P, C)
            pick = lambda e: f[:, e]           # noqa: E731
    word = None
    for i, e in enumerate(p.order):
        part = pick(e).astype(wide) << wide(bits * i)
        word = part if word is None else word | part
    return _stored(xp, word, p.container)


def _permute_fields(xp, u, bits: int, src: Tuple[int, ...], dst: Tuple[int, ...]):
    """Words with their fields moved from order src to dst (whole words:
    one shift, mask and or per field, in place)."""
    c = u.dtype.type
    field_of = {e: f for f, e in enumerate(src)}
    out, tmp = xp.zeros_like(u), xp.empty_like(u)
    for f, e in enumerate(dst):
        s = bits * (field_of[e] - f)
        if s >= 0:
            xp.right_shift(u, c(s), out=tmp)
        else:
            xp.left_shift(u, c(-s), out=tmp)
        xp.bitwise_and(tmp, c(((1 << bits) - 1) << (bits * f)), out=tmp)
        xp.bitwise_or(out, tmp, out=out)
    return out


def _cross(xp, u, src: Packed, dst: Packed):
    """Words packed along one logical axis S -> words packed along the other,
    T, without a byte per field: each block of src.P x dst.P codes is one
    word-wise shift, mask and or per code, on arrays of a P-th of the words.
    The work runs in the wider container's type."""
    work = xp.uint32 if "int32" in (src.container, dst.container) else xp.uint8
    u = u.astype(work, copy=False)
    c = work
    fs = {e: f for f, e in enumerate(src.order)}
    fd = {e: f for f, e in enumerate(dst.order)}
    src_rows_T, dst_rows_T = src.rows == dst.axis, dst.rows == dst.axis
    if src_rows_T:                                   # u is [T, S/Ps]
        Tw, Sw = u.shape[0] // dst.P, u.shape[1]
        x = u.reshape(Tw, dst.P, Sw)
        code = lambda d: x[:, d, :]                  # noqa: E731  ([Tw, Sw])
    else:                                            # u is [S/Ps, T]
        Sw, Tw = u.shape[0], u.shape[1] // dst.P
        x = u.reshape(Sw, Tw, dst.P)
        code = lambda d: x[:, :, d]                  # noqa: E731  ([Sw, Tw])
    out = xp.empty((Tw, Sw, src.P) if dst_rows_T else (Sw, src.P, Tw), dtype=work)
    tmp = xp.empty(code(0).shape, dtype=work)
    acc = xp.empty(code(0).shape, dtype=work)
    for s in range(src.P):               # element s of each src word ...
        acc[...] = 0
        for d in range(dst.P):           # ... meets element d of each dst word
            sh = src.bits * (fs[s] - fd[d])
            if sh >= 0:
                xp.right_shift(code(d), c(sh), out=tmp)
            else:
                xp.left_shift(code(d), c(-sh), out=tmp)
            xp.bitwise_and(tmp, c(((1 << src.bits) - 1) << (src.bits * fd[d])), out=tmp)
            xp.bitwise_or(acc, tmp, out=acc)
        a = acc if src_rows_T == dst_rows_T else acc.T
        if dst_rows_T:
            out[:, :, s] = a
        else:
            out[:, s, :] = a
    S = Sw * src.P
    return out.reshape((Tw, S) if dst_rows_T else (S, Tw))


def _banded(xp, x, transpose: bool, fn=None):
    """fn(x.T) (or fn(x)), contiguous, for an fn that works on any band of
    rows alone. numpy takes bands of 64 rows: a large transposed view copies
    an order of magnitude slower at once (29M words: 0.9 s against 0.1 s on
    a 2-core CI machine), and band-sized temporaries are reused, where
    whole-array ones are fresh memory each time."""
    fn = fn or (lambda b: b)
    if xp is not np or x.ndim != 2 or x.size < (1 << 20):
        return xp.ascontiguousarray(fn(xp.ascontiguousarray(x.T) if transpose else x))
    out = np.empty(x.shape[::-1] if transpose else x.shape, dtype=x.dtype)
    for r in range(0, x.shape[0], 64):
        if transpose:
            out[:, r:r + 64] = fn(np.ascontiguousarray(x[r:r + 64].T))
        else:
            out[r:r + 64] = fn(x[r:r + 64])
    return out


def _transpose(xp, x):
    return _banded(xp, x, True)


# --- the weight codes, scales and zero points ------------------------------------------------

def _qweight(xp, ws: Weight, wd: Weight, q):
    if ws.pack is None:
        # 8- and 16-bit codes (the validator packs exactly the narrower
        # ones, so both specs agree): the elements as they are, moved
        return _transpose(xp, q) if ws.layout != wd.layout else xp.ascontiguousarray(q)
    return _move(xp, q, _weight_packed(ws), _weight_packed(wd))


def _int_zeros(xp, ws: Weight, wd: Weight, z):
    moved = _scale_transposed(ws, wd)
    if ws.zero.pack is None:
        # 8-bit zero points, one per element on both sides (as the weights)
        return _transpose(xp, z) if moved else xp.ascontiguousarray(z)
    one_d = z.ndim == 1
    out = _move(xp, z.reshape(1, -1) if one_d else z, _zero_packed(ws), _zero_packed(wd))
    return out.reshape(-1) if one_d else out


def _item_bytes(w: Weight, name: str) -> int:
    """Bytes per stored item of tensor `name` (storage.py's dtypes)."""
    if name == "qweight":
        return CONTAINER_BITS[w.pack.container] // 8 if w.pack else max(1, weight_code(w).bits // 8)
    if name == "scales" or w.zero.kind == "float":
        d = w.scale.dtype if name == "scales" else w.zero.dtype
        return DTYPE_BYTES[d]
    return CONTAINER_BITS[w.zero.pack.container] // 8 if w.zero.pack else 1


def _packed_words(w: Weight, name: str) -> bool:
    """Whether tensor `name` holds codes packed in integer words."""
    return bool(w.pack) if name == "qweight" else name == "zeros" and w.zero.kind == "int"


# --- entry point --------------------------------------------------------------------------

def transcode(src: Spec, dst: Spec, tensors: Mapping, N: int, K: int) -> Dict[str, object]:
    """The stored tensors of `src` at N x K ("qweight", "scales", "zeros" as
    its spec stores them; other keys such as "bias" pass through) -> those of
    `dst`, bit-exact. numpy arrays in, numpy out; CuPy in, CuPy out (on the
    current stream). A tensor both specs store alike is returned as it is
    (contiguous), not copied. TranscodeError if the specs do not store the same
    logical weight or a tensor is not what src stores."""
    check_compatible(src, dst)
    ws, wd = weight_of(src), weight_of(dst)
    want = stored_shapes(src, N, K)
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            raise TranscodeError(f"{name}: missing; spec {src.name} stores it as {list(shape)}")
        array_module(t)
        if tuple(int(d) for d in t.shape) != tuple(shape):
            raise TranscodeError(f"{name}: shape {list(t.shape)}, expected {list(shape)} "
                                 f"(spec {src.name}, N={N}, K={K})")
        size = getattr(getattr(t, "dtype", None), "itemsize", None)
        if size != _item_bytes(ws, name):
            raise TranscodeError(f"{name}: {getattr(t, 'dtype', type(t).__name__)}, expected "
                                 f"{_item_bytes(ws, name)}-byte items (spec {src.name})")
        if _packed_words(ws, name) and t.dtype.kind not in "iu":
            # (a float array of the right size would be shifted as numbers, not bits)
            raise TranscodeError(f"{name}: {t.dtype}, expected an integer array of packed "
                                 f"codes (spec {src.name})")
    q = tensors["qweight"]
    xp = array_module(q)
    if any(array_module(tensors[name]) is not xp for name in want):
        raise TranscodeError("qweight, scales and zeros must all be numpy arrays or all CuPy arrays")
    out = {k: v for k, v in tensors.items() if k not in want}
    out["qweight"] = _qweight(xp, ws, wd, q)
    if "scales" in want:
        s = tensors["scales"]
        out["scales"] = _transpose(xp, s) if _scale_transposed(ws, wd) else xp.ascontiguousarray(s)
    if ws.zero.kind == "float":
        z = tensors["zeros"]
        out["zeros"] = _transpose(xp, z) if _scale_transposed(ws, wd) else xp.ascontiguousarray(z)
    elif ws.zero.kind == "int":
        out["zeros"] = _int_zeros(xp, ws, wd, tensors["zeros"])
    return out
