"""Lowering: a validated Spec -> the constants the CUDA templates are written in.

The templates never look at the spec; they read a `Layout` (how the weight,
scale and zero arrays sit in memory, in the terms the kernel addresses them)
and a `Numerics` (how a code becomes a number, which mma runs). Both are
derived here once, so every format difference is data, not template branches. All of it is a
pure function of frozen inputs, cached: the runtime asks again on every launch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from .spec import (A8_DTYPES, CONTAINER_BITS, SUB_BYTE_INT_DTYPES, WEIGHT_CODES, Spec,
                   codes_per_container, weight_code)

CUDA_TYPES = {
    "float16": "half", "bfloat16": "__nv_bfloat16", "float32": "float",
    "int8": "int8_t", "uint8": "uint8_t", "float8_e4m3": "uint8_t",
    "float8_e5m2": "uint8_t", "int32": "int32_t", "e8m0": "uint8_t",
}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "uint8": 1,
               "float8_e4m3": 1, "float8_e5m2": 1, "int32": 4, "e8m0": 1}


@dataclass(frozen=True)
class Layout:
    """The stored weight as a 2-D array [rows, cols] of `elem_bytes` words.

    row_axis / col_axis: which logical axis ('n' or 'k') each storage dim walks;
    row_div / col_div: logical elements per storage step along it (P on the
    packed axis, 1 otherwise). A word holds `P` codes along `pack_axis`.
    """
    row_axis: str
    col_axis: str
    row_div: int
    col_div: int
    elem_bytes: int
    P: int
    bits: int
    pack_axis: Optional[str]
    order: Tuple[int, ...]

    @property
    def inner(self) -> str:
        """Logical axis that is contiguous in memory within a storage row."""
        return self.col_axis

    def storage(self, N: int, K: int) -> Tuple[int, int]:
        """(rows, bytes per row) of the stored weight of an N x K problem."""
        ext = {"n": N, "k": K}
        return ext[self.row_axis] // self.row_div, ext[self.col_axis] // self.col_div * self.elem_bytes


@dataclass(frozen=True)
class Numerics:
    mma: str                 # "float16" | "bfloat16" | "int8" | "float8_e4m3"
    compute_t: str           # CUDA type of the smem B tile / mma operand
    a_t: str
    out_t: str
    code_kind: str           # uint | int | ternary | table | fp4 | fp8e4m3 | fp8e5m2 | f16 | bf16
    dense: bool              # weights are already the mma operand type: no decode
    a_decode: bool           # activations widened (fp8 -> fp16) in shared memory
    a_row_scale: bool        # the epilogue multiplies row m by a_scale[m]
    scale_dtype: Optional[str]
    scale_t: Optional[str]        # its CUDA type
    scale_native: bool            # scales stored in compute_t (the rs GEMM loads them as they are)
    scale_gran: Optional[str]     # group | channel | tensor | None
    scale_layout: str
    group: int                    # K elements per scale (K for channel: set at launch)
    zero_kind: str
    zero_dtype: Optional[str]
    zero_P: int
    zero_pack_axis: Optional[str]
    zero_order: Tuple[int, ...]
    zero_offset: int
    zero_value: int
    formula: str
    table: Optional[Tuple[float, ...]]
    bias: bool
    activation: str
    out_dtype: str
    # 8-bit activations with sub-byte integer codes: the decode widens q - z to
    # the activation's 8-bit type (no scale: the sums are scaled afterwards).
    widen: bool = False
    # 8-bit activations staged as fp16 values code * a_scale[m] (the GEMVs:
    # numerics(..., a_to_f16=True)); from there on the fp16 path.
    a_staged_scale: bool = False


@functools.lru_cache(maxsize=None)
def weight_layout(spec: Spec) -> Layout:
    w = spec.b
    code = weight_code(w)
    P = codes_per_container(w)
    rows, cols = ("n", "k") if w.layout == "nt" else ("k", "n")
    pack_axis = w.pack.axis if w.pack else None
    if w.pack:
        elem_bytes = CONTAINER_BITS[w.pack.container] // 8
        order = tuple(w.pack.order)
    else:
        elem_bytes = max(1, code.bits // 8)
        order = (0,)
    return Layout(
        row_axis=rows, col_axis=cols,
        row_div=P if pack_axis == rows else 1,
        col_div=P if pack_axis == cols else 1,
        elem_bytes=elem_bytes, P=P, bits=code.bits, pack_axis=pack_axis, order=order,
    )


_CODE_KIND = {"uint": "uint", "int": "int", "ternary": "ternary", "table": "table"}
_FLOAT_KIND = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3": "fp8e4m3",
               "float8_e5m2": "fp8e5m2"}


@functools.lru_cache(maxsize=None)
def numerics(spec: Spec, fp8_mma: bool = True, a_to_f16: bool = False) -> Numerics:
    """fp8_mma: the target has an e4m3 mma.sync (sm_89+). Without it fp8
    activations are widened to fp16 in shared memory and the weights decoded,
    so the f16 tensor cores run the product (`a_decode`). a_to_f16: 8-bit
    activations with a row scale are staged as fp16 values (code x
    a_scale[m], `a_staged_scale`) and the weights decoded to fp16 (the
    GEMVs, whose fp16 products and sums need values, not codes: int8 x int8
    products overflow fp16)."""
    w = spec.b
    a = spec.a
    to_f16 = a_to_f16 and a.dtype in A8_DTYPES and a.scale == "row"
    mma = "float16" if to_f16 else a.dtype if (a.dtype != "float8_e4m3" or fp8_mma) else "float16"
    code = weight_code(w)
    kind = _FLOAT_KIND.get(w.dtype) or ("fp4" if w.dtype == "fp4_e2m1" else _CODE_KIND[code.kind])
    dense = (w.dtype == mma)
    widen = mma == a.dtype and a.dtype in A8_DTYPES and w.dtype in SUB_BYTE_INT_DTYPES
    s, z = w.scale, w.zero
    zP = 1
    if z.kind == "int" and z.pack is not None:
        zP = CONTAINER_BITS[z.pack.container] // WEIGHT_CODES[z.dtype].bits
    return Numerics(
        mma=mma,
        # 8-bit activations run dense (no decode): the decode type is unused.
        compute_t=CUDA_TYPES[mma] if mma in ("float16", "bfloat16") else "half",
        a_t=CUDA_TYPES[a.dtype],
        out_t=CUDA_TYPES[spec.out.dtype],
        code_kind=kind,
        dense=dense,
        a_decode=mma != a.dtype,
        a_row_scale=a.scale == "row" and not to_f16,
        scale_dtype=s.dtype if s else None,
        scale_t=CUDA_TYPES[s.dtype] if s else None,
        scale_native=bool(s) and mma in ("float16", "bfloat16") and s.dtype == mma,
        scale_gran=s.granularity if s else None,
        scale_layout=s.layout if s else "kn",
        group=s.group if (s and s.granularity == "group") else 0,
        zero_kind=z.kind,
        zero_dtype=z.dtype,
        zero_P=zP,
        zero_pack_axis=z.pack.axis if (z.kind == "int" and z.pack) else None,
        zero_order=tuple(z.pack.order) if (z.kind == "int" and z.pack) else (0,),
        zero_offset=z.offset,
        zero_value=z.value,
        formula=w.formula,
        table=code.table if code.kind == "table" else None,
        bias=spec.epilogue.bias,
        activation=spec.epilogue.activation,
        out_dtype=spec.out.dtype,
        widen=widen,
        a_staged_scale=to_f16,
    )


# --- one vector of stored words, unrolled -------------------------------------

@dataclass(frozen=True)
class Pair:
    word: int        # 32-bit word of the vector
    shift: int       # bit offset of the first code; the second sits `step` bits higher
    ia: int          # element index (into the vector's vals[]) of the first code
    ib: int
    step: int = 16   # 16: one code per half-word (fp16x2 lanes); 4: the two nibbles of a byte


@dataclass(frozen=True)
class Vector:
    """`vbytes` consecutive bytes of one storage row, decoded as a unit.

    Elements are numbered e = r * ncols + c over the vector's logical extent:
    `nrows` along the storage row axis (P when packed along it) by `ncols`
    along the column axis. `dn[e]`, `dk[e]` give each element's logical offset.
    """
    vbytes: int
    words: int
    nrows: int
    ncols: int
    pairs: Tuple[Pair, ...]
    dn: Tuple[int, ...]
    dk: Tuple[int, ...]

    @property
    def n_extent(self) -> int:
        return max(self.dn) + 1

    @property
    def k_extent(self) -> int:
        return max(self.dk) + 1


@functools.lru_cache(maxsize=None)
def vector(lay: Layout, vbytes: int, byte_pairs: bool = False) -> Vector:
    """byte_pairs (4-bit codes): pair the two nibbles of each byte, for a
    decode that looks a whole byte up in a table of value pairs."""
    assert vbytes % 4 == 0 and vbytes % lay.elem_bytes == 0
    assert not byte_pairs or lay.bits == 4
    V = vbytes // lay.elem_bytes
    nrows, ncols = lay.row_div, V * lay.col_div
    slots = vbytes * 8 // lay.bits

    def elem(slot: int) -> int:
        j, i = divmod(slot, lay.P)            # container j, bit field i
        e = lay.order[i]                      # element along the packed axis
        if lay.pack_axis is None:
            r, c = 0, j
        elif lay.pack_axis == lay.col_axis:
            r, c = 0, j * lay.P + e
        else:
            r, c = e, j
        return r * ncols + c

    per_word = 32 // lay.bits
    half = max(1, per_word // 2)
    pairs = []
    for w in range(vbytes // 4):
        for s in range(half):
            if byte_pairs:
                a = w * per_word + 2 * s
                pairs.append(Pair(w, 8 * s, elem(a), elem(a + 1), step=4))
            else:
                a = w * per_word + s
                pairs.append(Pair(w, s * lay.bits, elem(a), elem(a + half)))
    assert len(pairs) * 2 == slots
    dn, dk = [], []
    for e in range(nrows * ncols):
        r, c = divmod(e, ncols)
        rn = {lay.row_axis: r, lay.col_axis: c}
        dn.append(rn["n"])
        dk.append(rn["k"])
    return Vector(vbytes, vbytes // 4, nrows, ncols, tuple(pairs), tuple(dn), tuple(dk))


@dataclass(frozen=True)
class Decode:
    """How decode_pair turns two codes into compute values (see decode.cuh.j2)."""
    method: str          # magic | fp4 | e5m2 | e4m3 | table | pair_table | scalar | widen
    mask: int
    magic: bool
    magic_base: int = 0
    mask2_hex: str = ""
    magic2_hex: str = ""
    magic_hex: str = ""
    sub2_hex: str = ""
    sign_flip_hex: str = ""   # XOR applied to each word first (two's complement codes)
    sub_value: int = 0        # magic: magic_base + code bias (+ const zero), what one subtract removes;
                              # widen: the code bias (+ const zero)
    high_first: bool = False  # pair_table: an entry holds (value of its byte's high nibble, of the
                              # low one), where the layout puts the pair's first code (even k) high


def _h(x: int) -> str:
    return f"0x{x:08X}"


def pair_table_ok(lay: Layout, num: Numerics) -> bool:
    """4-bit codebook codes (NF4, fp4 e2m1): the GEMV (and the rs GEMM, where
    each lane's pairs are bytes: rs_byte_pairs) decodes a byte (two codes)
    with one shared-memory load from a table of value pairs."""
    return lay.bits == 4 and num.table is not None and num.code_kind in ("table", "fp4")


# The table of value pairs (decode.cuh.j2's g_pair): 256 bytes' pairs of
# 2-byte values, one copy per lane (a warp's lookups then never share a bank).
PAIR_TABLE_BYTES = 256 * 32 * 4


@functools.lru_cache(maxsize=None)
def decode_plan(lay: Layout, num: Numerics, pair_table: bool = False, high_first: bool = False) -> Decode:
    """pair_table: the caller pairs codes by byte (vector(..., byte_pairs=True),
    or rs_byte_pairs), the first of each pair in the byte's high nibble where
    high_first."""
    bits = lay.bits
    if pair_table:
        assert pair_table_ok(lay, num)
        return Decode("pair_table", 0xFF, False, high_first=high_first)
    mask = (1 << bits) - 1 if bits < 32 else 0xFFFFFFFF
    kind = num.code_kind
    f16 = num.compute_t == "half"
    integer = kind in ("uint", "int", "ternary")
    if integer:
        # The integer codes' value is c - bias once two's complement codes have
        # their sign bits flipped (XOR with `sign`); a const zero joins the bias.
        bias = {"uint": 0, "int": 1 << (bits - 1), "ternary": 1}[kind]
        bias += num.zero_value if num.zero_kind == "const" else 0
        sign = 0
        if kind == "int":
            for p in range(32 // bits):
                sign |= 1 << (p * bits + bits - 1)
    if num.widen:
        # Each byte lane of codes widened to int8 in place (decode.cuh.j2
        # widen_words): mask2_hex and sign_flip_hex are one code's mask and
        # sign bit in every byte.
        lane_sign = (1 << (bits - 1)) * 0x01010101 if sign else 0
        return Decode("widen", mask, False, mask2_hex=_h(mask * 0x01010101),
                      sign_flip_hex=_h(lane_sign) if sign else "", sub_value=bias)
    if integer and bits <= (8 if f16 else 7):
        # code c placed in the low mantissa bits of M=1024 (fp16) / 128 (bf16):
        # bits(M) | c == M + c exactly, so subtracting M + bias recovers the value.
        magic = 0x6400 if f16 else 0x4300
        base = 1024 if f16 else 128
        sub = _f16_bits(base + bias) if f16 else _bf16_bits(base + bias)
        return Decode("magic", mask, True, base, _h(mask | mask << 16), _h(magic | magic << 16),
                      f"0x{magic:04X}", _h(sub | sub << 16), _h(sign) if sign else "", base + bias)
    if kind == "fp4" and f16:
        return Decode("fp4", mask, False)
    if kind == "fp8e5m2" and f16:
        return Decode("e5m2", mask, False)
    if kind == "fp8e4m3" and f16:
        return Decode("e4m3", mask, False)
    if kind in ("table", "fp4"):
        return Decode("table", mask, False)
    return Decode("scalar", mask, False)


def _f16_bits(v: float) -> int:
    return int(np.array(v, np.float16).view(np.uint16))


def _bf16_bits(v: float) -> int:
    return int(np.array(v, np.float32).view(np.uint32)) >> 16


# --- GEMV: how one decoded vector meets the activations -----------------------

# fp16x2 products summed per accumulator lane before the fp32 flush: bounds the
# rounding drift and the overflow risk to what the first row GEMV accepted
# (docs/performance.md#gemv).
MAC_RUN = 16


@dataclass(frozen=True)
class Mac:
    """The GEMV inner product of one vector, as fp16x2 FMAs on its decoded pairs.

    Pair p (elements ia, ib) multiplies the activation pair (a[k0 + dk_a],
    a[k0 + dk_b]) into accumulator `slot`, an fp16x2 whose lanes belong to
    output columns slots[slot] = (dn_a, dn_b): a GPTQ pair (k, k+4) of one
    column sums into both lanes of that column, an AWQ pair (n, n+1) of one k
    keeps its columns apart. No activation shuffle of the weights is needed."""
    slots: Tuple[Tuple[int, int], ...]
    apairs: Tuple[Tuple[int, int], ...]            # distinct activation pairs (dk_a, dk_b)
    terms: Tuple[Tuple[int, int, int], ...]        # (pair, slot, activation pair)
    flush: int                                     # vectors between fp32 flushes


@functools.lru_cache(maxsize=None)
def gemv_mac(vec: Vector) -> Mac:
    slots, apairs, terms, count = [], [], [], {}
    for p, pr in enumerate(vec.pairs):
        cols = (vec.dn[pr.ia], vec.dn[pr.ib])
        # A slot takes at most MAC_RUN terms per vector; more open a second one.
        c = count.get(cols, 0)
        count[cols] = c + 1
        key = (cols, c // MAC_RUN)
        if key not in slots:
            slots.append(key)
        # Each distinct activation pair is built once per vector (one PRMT at most).
        ap = (vec.dk[pr.ia], vec.dk[pr.ib])
        if ap not in apairs:
            apairs.append(ap)
        terms.append((p, slots.index(key), apairs.index(ap)))
    per_vec = max(sum(1 for t in terms if t[1] == s) for s in range(len(slots)))
    return Mac(tuple(k[0] for k in slots), tuple(apairs), tuple(terms), max(1, MAC_RUN // per_vec))


def magic_split(dec: "Decode", shift: int, f16: bool) -> Tuple[int, int]:
    """Magic decode of the code pair at bit `shift`: (t, u) such that the codes
    are masked straight out of `w >> t` at mantissa bit u, value 2^u * code.
    Shifting only by multiples of 8 lets one shifted word serve several pairs
    (4-bit codes: w and w >> 8 for all four pairs); the 2^-u comes back in the
    HFMA2 that removes the magic number."""
    mant = 10 if f16 else 7
    u = shift % 8
    if u and (dec.mask << u) >= (1 << mant):
        return shift, 0
    return shift - u, u


def _zero_codes(num: Numerics, zero_bits: int) -> Tuple[int, int]:
    """The least and the greatest integer zero code."""
    if (num.zero_dtype or "").startswith("int"):
        return -(1 << (zero_bits - 1)), (1 << (zero_bits - 1)) - 1
    return 0, (1 << zero_bits) - 1


def fold_zero(num: Numerics, dec: "Decode", zero_bits: int) -> bool:
    """Integer zero points can join the magic-number constant (one HFMA2 for
    code - magic - z) when magic/2^u + bias + z stays an exactly representable
    integer for every zero code: |x| <= 2048 (fp16) or 256 (bf16)."""
    if dec.method != "magic" or num.zero_kind != "int" or num.formula != "(q - z) * s":
        return False
    limit = 2048 if num.compute_t == "half" else 256
    return all(abs(dec.sub_value + num.zero_offset + z) <= limit for z in _zero_codes(num, zero_bits))


def zero_sub_bits(num: Numerics, dec: "Decode", zero_bits: int) -> Optional[int]:
    """The bits of magic + bias + offset, when adding a zero code z to them
    gives the bits of magic + bias + offset + z for every code (all of them
    in the binade where the compute type steps by 1: fp16 [1024, 2048), bf16
    [128, 256)): the rs GEMM's per-row subtract is then an integer add
    and a multiply by 0x10001 (the value in both halves). None otherwise."""
    if not fold_zero(num, dec, zero_bits):
        return None
    half = num.compute_t == "half"
    lo, hi = _zero_codes(num, zero_bits)
    base = dec.sub_value + num.zero_offset
    bottom, top = (1024, 2048) if half else (128, 256)
    if not (bottom <= base + lo and base + hi < top):
        return None
    return _f16_bits(base) if half else _bf16_bits(base)


# --- the rs GEMM: each lane's code pairs -------------------------------------

@dataclass(frozen=True)
class RsPair:
    """Where a lane finds the codes of one of its wgmma A-fragment registers:
    k = k0 + 2q and k0 + 2q + 1 of its row (q: lane % 4). The first sits at
    bit `shift` + q * step of 32-bit word `word` of the row's k-tile slice
    (lanes q >= split: of word + 1, at that bit less 32), the second `gap`
    bits above it (16: the two halves of the word, the magic-number
    decode's own pairing)."""
    word: int
    shift: int
    step: int
    gap: int
    split: int = 4


def _code_bit(lay: Layout, e: int) -> int:
    """Bit of element e (along k) in one row's stream of stored words
    (little-endian: container j at bit j * its width)."""
    cbits = lay.elem_bytes * 8
    j, i = divmod(e, lay.P)
    return j * cbits + lay.order.index(i) * lay.bits


@functools.lru_cache(maxsize=None)
def rs_pairs(lay: Layout, BK: int) -> Optional[Tuple[Tuple[RsPair, RsPair], ...]]:
    """For each k16 step of a BK-deep tile, the lanes' pairs for its low
    (k0 = 16 ks) and high (k0 = 16 ks + 8) registers; None unless the
    weight rows run along k (codes packed along k, or 8-bit codes one per
    byte), each lane's pair lies in one word, and the lanes' pairs sit a
    fixed step apart in the row's stream of bits (in one word, or the first
    lanes in one and the rest in the next)."""
    if lay.row_axis != "n" or (lay.pack_axis or lay.col_axis) != "k":
        return None
    out = []
    for ks in range(BK // 16):
        halves = []
        for h in range(2):
            bits = []
            for q in range(4):
                e = 16 * ks + 8 * h + 2 * q
                a, b = _code_bit(lay, e), _code_bit(lay, e + 1)
                if a // 32 != b // 32:
                    return None
                bits.append((a, b - a))
            (a0, gap), step = bits[0], bits[1][0] - bits[0][0]
            if any(bq != (a0 + q * step, gap) for q, bq in enumerate(bits)):
                return None
            words = [(a0 + q * step) // 32 for q in range(4)]
            split = next((q for q in range(4) if words[q] != words[0]), 4)
            if any(w != words[0] + (q >= split) for q, w in enumerate(words)):
                return None
            halves.append(RsPair(words[0], a0 % 32, step, gap, split))
        out.append(tuple(halves))
    return tuple(out)


def rs_byte_pairs(pairs) -> Optional[bool]:
    """Whether every lane's pair of 4-bit codes is one byte's two nibbles
    (rs_pairs: the two a nibble apart, lanes whole bytes apart), what a
    pair table looks up at once: the first code in the high nibble (True),
    in the low one (False); None where they are not."""
    gaps = {p.gap for hs in pairs for p in hs}
    if len(gaps) != 1 or abs(next(iter(gaps))) != 4:
        return None
    if any((p.shift + min(p.gap, 0)) % 8 or p.step % 8 or p.split != 4 for hs in pairs for p in hs):
        return None
    return next(iter(gaps)) < 0


# The pairs of 4-bit codes in the interleaved order 0, 2, 4, 6, 1, 3, 5, 7:
# word 2 ks + h, bits 4q and 16 + 4q (the rs GEMM's first and fastest decode).
def rs_pairs_are_interleaved4(pairs) -> bool:
    return all(p == RsPair(2 * ks + h, 0, 4, 16) for ks, hs in enumerate(pairs) for h, p in enumerate(hs))


def rs_pairs_in_halves(pairs) -> bool:
    """Whether every lane's pair is in one word's two halves (gap 16: one
    shift and one lop3 a pair, as in the interleaved order of any width)."""
    return all(p.gap == 16 and p.split == 4 for hs in pairs for p in hs)
