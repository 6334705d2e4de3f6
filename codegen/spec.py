"""The spec model: what a validated operator spec holds.

`codegen.resolve.load_spec` turns YAML into these frozen dataclasses (or a
list of `SpecError`s); everything downstream (reference semantics, planner,
templates, runtime) reads only these objects, never raw YAML.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Dict, Optional, Tuple

# --- vocabulary ---------------------------------------------------------------
ACT_DTYPES = ("float16", "bfloat16", "int8", "float8_e4m3")
# Activations stored as 8-bit codes: a per-row float32 scale (none with an
# int32 output); the product runs on the codes (docs/spec.md).
A8_DTYPES = ("int8", "float8_e4m3")
WEIGHT_DTYPES = (
    "float16", "bfloat16", "int8", "uint8", "int4", "uint4", "int2", "uint2",
    "uint1", "ternary", "nf4", "fp4_e2m1", "float8_e4m3", "float8_e5m2", "codebook",
)
SCALE_DTYPES = ("float16", "bfloat16", "float32", "e8m0")
ZERO_KINDS = ("none", "const", "float", "int")
FLOAT_ZERO_DTYPES = ("float16", "bfloat16", "float32")
INT_ZERO_DTYPES = ("uint8", "uint4", "uint2", "uint1", "int8", "int4", "int2")
CONTAINERS = ("uint8", "int32")
LAYOUTS = ("nt", "nn")            # nt: stored [N, K]; nn: stored [K, N]
SCALE_LAYOUTS = ("kn", "nk")      # kn: stored [K/G, N]; nk: stored [N, K/G]
AXES = ("k", "n")
FORMULAS = ("(q - z) * s", "q * s - z")
ACCUMULATE = ("float32", "int32")
OUT_DTYPES = ("float16", "bfloat16", "float32")
# The raw int32 accumulator: a matmul output only of int8 activations with
# no scale at all (validate.py), so kept apart from the outputs any matmul takes.
INT_OUT_DTYPES = ("int32",)
ACTIVATIONS = ("none", "relu", "silu", "gelu")
OPS = ("matmul", "quantize")

CONTAINER_BITS = {"uint8": 8, "int32": 32}

# The integers a float type holds exactly: |x| <= 2^(significand bits). The
# kernels decode weights in the activation type, so a zero point and every
# q - z must stay within its bound (validate.py) to be subtracted exactly.
EXACT_INTS = {"float16": 2048, "bfloat16": 256}
FINITE_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}   # largest finite value


@dataclass(frozen=True)
class Pack:
    """Several codes in one storage word.

    container: the word type; axis: the logical axis (k or n) along which the
    codes of one word are consecutive; order[i]: the index, within the word's
    run of consecutive elements, of the element held in bit field i (field 0 is
    the least significant `bits` bits). planes: instead of P consecutive
    elements, word j holds element j of each of P equal planes the axis is
    cut into (field i: plane order[i]; HF BitNet's four row blocks per byte).
    """
    container: str
    axis: str
    order: Tuple[int, ...]
    planes: bool = False


@dataclass(frozen=True)
class Scale:
    """granularity 'group' (group = K elements sharing a scale), 'channel'
    (one per n) or 'tensor' (one value). layout: kn -> stored [K/G, N],
    nk -> stored [N, K/G]; for channel it is stored [N], for tensor [1]."""
    dtype: str
    granularity: str
    group: Optional[int] = None
    layout: str = "kn"


@dataclass(frozen=True)
class Zero:
    """kind none: no zero point; const: the fixed integer `value` for every
    element (symmetric formats, e.g. (q - 8) * s); float: a float tensor laid out
    like the scales; int: integer codes of `dtype`, packed by `pack` (or one per
    element of `dtype` when pack is None), laid out like the scales; the zero
    point is stored + offset (GPTQ v1 stores z - 1, so offset 1)."""
    kind: str = "none"
    dtype: Optional[str] = None
    pack: Optional[Pack] = None
    offset: int = 0
    value: int = 0


@dataclass(frozen=True)
class Weight:
    dtype: str
    layout: str = "nt"
    pack: Optional[Pack] = None
    scale: Optional[Scale] = None
    zero: Zero = field(default_factory=Zero)
    formula: str = "(q - z) * s"
    codebook: Optional[Tuple[float, ...]] = None   # only for dtype 'codebook'
    bits: Optional[int] = None                     # only for dtype 'codebook'


@dataclass(frozen=True)
class Activation:
    dtype: str
    scale: Optional[str] = None        # 'row': per-row float32 scale (int8/fp8)


@dataclass(frozen=True)
class Output:
    dtype: str = "float16"


@dataclass(frozen=True)
class Epilogue:
    bias: bool = False
    activation: str = "none"


@dataclass(frozen=True)
class Shape:
    """Each of M, N, K: None for dynamic/any, or a fixed int."""
    M: Optional[int] = None
    N: Optional[int] = None
    K: Optional[int] = None


@dataclass(frozen=True)
class Spec:
    name: str
    op: str
    a: Activation
    b: Optional[Weight]
    out: Output
    accumulate: str = "float32"
    epilogue: Epilogue = field(default_factory=Epilogue)
    shape: Shape = field(default_factory=Shape)
    description: str = ""
    version: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    def content_hash(self) -> str:
        """Hash of everything that changes semantics or code (not the file)."""
        d = self.to_dict()
        d.pop("description", None)
        # Fields added with a default that keeps the meaning of every spec
        # written before them leave the hash (and the tuning records keyed
        # by it) as it was while at their default.
        for pack in (d["b"] and d["b"]["pack"], d["b"] and d["b"]["zero"]["pack"]):
            if pack and not pack["planes"]:
                del pack["planes"]
        blob = json.dumps(d, sort_keys=True, default=list).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# --- facts about weight dtypes (data, not branches) --------------------------

NF4_TABLE = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)
# OCP MX fp4 e2m1: code bit 3 is the sign, bits 0..2 index this table.
FP4_E2M1_TABLE = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@dataclass(frozen=True)
class WeightCode:
    """How a weight dtype's stored code maps to a number.

    kind: 'uint' (value = code), 'int' (two's complement), 'ternary'
    (code 0,1,2 -> -1,0,+1), 'table' (value = table[code]), 'float' (IEEE-like
    bits, decoded by the dtype's own rule).
    """
    bits: int
    kind: str
    table: Optional[Tuple[float, ...]] = None

    @property
    def lo(self) -> int:
        return {"uint": 0, "int": -(1 << (self.bits - 1)), "ternary": -1}.get(self.kind, 0)

    @property
    def hi(self) -> int:
        return {"uint": (1 << self.bits) - 1, "int": (1 << (self.bits - 1)) - 1,
                "ternary": 1}.get(self.kind, (1 << self.bits) - 1)


WEIGHT_CODES = {
    "float16": WeightCode(16, "float"),
    "bfloat16": WeightCode(16, "float"),
    "float8_e4m3": WeightCode(8, "float"),
    "float8_e5m2": WeightCode(8, "float"),
    "int8": WeightCode(8, "int"),
    "uint8": WeightCode(8, "uint"),
    "int4": WeightCode(4, "int"),
    "uint4": WeightCode(4, "uint"),
    "int2": WeightCode(2, "int"),
    "uint2": WeightCode(2, "uint"),
    "uint1": WeightCode(1, "uint"),
    "ternary": WeightCode(2, "ternary"),
    "nf4": WeightCode(4, "table", NF4_TABLE),
    "fp4_e2m1": WeightCode(4, "table", FP4_E2M1_TABLE),
}


# Integer codes below 8 bits, ternary included: with 8-bit activations they
# are widened to the activation type (issue 29), so q - z is an integer the
# 8-bit product multiplies exactly.
SUB_BYTE_INT_DTYPES = tuple(d for d, c in WEIGHT_CODES.items()
                            if c.kind in ("uint", "int", "ternary") and c.bits < 8)


def weight_code(w: Weight) -> WeightCode:
    if w.dtype == "codebook":
        return WeightCode(w.bits, "table", tuple(w.codebook))
    return WEIGHT_CODES[w.dtype]


def codes_per_container(w: Weight) -> int:
    """P: codes held by one storage word (1 when unpacked)."""
    if w.pack is None:
        return 1
    return CONTAINER_BITS[w.pack.container] // weight_code(w).bits


def weight_storage_shape(w: Weight, N: int, K: int) -> Tuple[int, int]:
    """Shape of the stored weight array (in containers, or elements when unpacked)."""
    P = codes_per_container(w)
    rows, cols = (N, K) if w.layout == "nt" else (K, N)
    if w.pack is not None:
        if w.pack.axis == "k":
            rows, cols = (rows, cols // P) if w.layout == "nt" else (rows // P, cols)
        else:
            rows, cols = (rows // P, cols) if w.layout == "nt" else (rows, cols // P)
    return rows, cols


def n_groups(s: Scale, K: int) -> int:
    return K // s.group if s.granularity == "group" else 1


def scale_shape(s: Scale, N: int, K: int) -> Tuple[int, ...]:
    if s.granularity == "tensor":
        return (1,)
    if s.granularity == "channel":
        return (N,)
    g = n_groups(s, K)
    return (g, N) if s.layout == "kn" else (N, g)


def zero_shape(w: Weight, N: int, K: int) -> Tuple[int, ...]:
    """Stored zero-point array shape (kinds float and int), in containers if packed."""
    shp = scale_shape(w.scale, N, K)
    z = w.zero
    if z.kind != "int" or z.pack is None:
        return shp
    P = CONTAINER_BITS[z.pack.container] // WEIGHT_CODES[z.dtype].bits
    if len(shp) == 1:
        return (shp[0] // P,)
    g_axis, n_axis = (0, 1) if w.scale.layout == "kn" else (1, 0)
    axis = n_axis if z.pack.axis == "n" else g_axis
    out = list(shp)
    out[axis] //= P
    return tuple(out)


def stored_shapes(spec: Spec, N: int, K: int) -> Dict[str, Tuple[int, ...]]:
    """The stored weight tensors of `spec` at N x K and their shapes: "qweight"
    always, "scales" when the weights have a scale, "zeros" for float and int
    zero points (in containers where packed).  What the kernels read, the
    reference draws and a checkpoint must hold."""
    w = spec.b
    out = {"qweight": tuple(weight_storage_shape(w, N, K))}
    if w.scale is not None:
        out["scales"] = tuple(scale_shape(w.scale, N, K))
    if w.zero.kind in ("float", "int"):
        out["zeros"] = tuple(zero_shape(w, N, K))
    return out
