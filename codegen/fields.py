"""The spec language's fields, stated once: for each mapping its keys, which
are required, what each key takes, its default and a line of help.

validate.py reads every field through this table (`open_mapping`, then
`FieldReader.get`), so the keys, enumerations and bounds it checks are the
ones listed here; schema.py writes the same table out as JSON Schema.  The
rules between fields (a scale group dividing a fixed K, what 8-bit
activations demand of the weight, when an int32 output is allowed, ...) are
validate.py's code; the few that depend on one enumerated field (the op, the
zero kind, the weight dtype) are the tables at the end, read by both.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from .planner.config import SIZE_LIMIT
from .spec import (
    ACCUMULATE, ACT_DTYPES, ACTIVATIONS, AXES, CONTAINERS, FLOAT_ZERO_DTYPES, FORMULAS,
    INT_OUT_DTYPES, INT_ZERO_DTYPES, LAYOUTS, OPS, OUT_DTYPES, SCALE_DTYPES, SCALE_LAYOUTS,
    WEIGHT_DTYPES, ZERO_KINDS,
)
from .yaml_source import BAD, Ctx, PathT, Reader, is_int, show

FORMAT_VERSION = 1
NAME_PATTERN = "[a-z0-9_]{1,64}"    # (64: kernel and cache file names stay under 255 bytes)
QUANT_OUT_DTYPES = ("int8", "float8_e4m3")          # out.dtype of op quantize
QUANT_ACT_DTYPES = ("float16", "bfloat16")          # a.dtype of op quantize
SCALE_GROUP_WORDS = ("channel", "tensor")
CODEBOOK_BITS = (1, 2, 3, 4)

_DEFAULT = object()


# --- what a field takes --------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Field:
    """One key of a mapping. `read` returns its value, `default` when it is
    absent (BAD when it is required: the missing key is already reported),
    or BAD when it is wrong (reported)."""
    doc: str
    required: bool = False
    default: Any = None

    def absent(self, default=_DEFAULT):
        if default is not _DEFAULT:
            return default
        return BAD if self.required else self.default


@dataclass(frozen=True, kw_only=True)
class Choice(Field):
    values: Tuple[str, ...]
    what: str

    def read(self, r: Reader, key: str, default=_DEFAULT):
        return r.choice(key, self.values, default=self.absent(default), what=self.what)


@dataclass(frozen=True, kw_only=True)
class Size(Field):
    """A positive integer the kernels' 32-bit indexing holds, or one of `words`."""
    words: Tuple[str, ...]
    what: str

    def read(self, r: Reader, key: str, default=_DEFAULT):
        v = r.pos_int_or_word(key, self.words, default=self.absent(default), what=self.what)
        if is_int(v) and v >= SIZE_LIMIT:
            r.ctx.err(r.p(key), self.too_large(v))
            return BAD
        return v

    def too_large(self, v: int) -> str:
        return (f"{v} is not a valid {self.what} (allowed: 1..{SIZE_LIMIT - 1}, "
                f"{', '.join(self.words)}: the kernels index with 32-bit int)")


@dataclass(frozen=True, kw_only=True)
class Integer(Field):
    lo: Optional[int] = None
    hi: Optional[int] = None

    def read(self, r: Reader, key: str, default=_DEFAULT):
        return r.integer(key, self.absent(default), lo=self.lo, hi=self.hi)


@dataclass(frozen=True, kw_only=True)
class Version(Field):
    value: int

    def read(self, r: Reader, key: str, default=_DEFAULT):
        if not r.has(key):
            return self.absent(default)
        v = r.raw(key)
        if not (is_int(v) and v == self.value):
            r.ctx.err(r.p(key), f"unsupported format version {show(v)} (allowed: {self.value})")
            return BAD
        return v


@dataclass(frozen=True, kw_only=True)
class Text(Field):
    pattern: Optional[str] = None
    what: str = "string"

    def read(self, r: Reader, key: str, default=_DEFAULT):
        v = r.string(key, self.absent(default))
        if r.has(key) and isinstance(v, str) and self.pattern and not re.fullmatch(self.pattern, v):
            r.ctx.err(r.p(key), f"{show(v)} is not a valid {self.what} (allowed: {self.pattern})")
            return BAD
        return v


@dataclass(frozen=True, kw_only=True)
class Flag(Field):
    def read(self, r: Reader, key: str, default=_DEFAULT):
        return r.boolean(key, self.absent(default))


@dataclass(frozen=True, kw_only=True)
class Numbers(Field):
    """A list of integers (`integers`) or of finite numbers -> a tuple."""
    integers: bool = False

    def read(self, r: Reader, key: str, default=_DEFAULT):
        if not r.has(key):
            return self.absent(default)
        v = r.raw(key)
        good = is_int if self.integers else _is_finite
        if not isinstance(v, list) or not all(good(x) for x in v):
            kind = "integers" if self.integers else "finite numbers"
            r.ctx.err(r.p(key), f"must be a list of {kind}; got {show(v)}")
            return BAD
        return tuple(v) if self.integers else tuple(float(x) for x in v)


def _is_finite(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:           # an integer beyond float64
        return False


@dataclass(frozen=True, kw_only=True)
class Formula(Field):
    """One of `values`; whitespace is not significant."""
    values: Tuple[str, ...]

    def read(self, r: Reader, key: str, default=_DEFAULT):
        if not r.has(key):
            return self.absent(default)
        v = r.raw(key)
        if isinstance(v, str):
            squeezed = "".join(v.split())
            for f in self.values:
                if "".join(f.split()) == squeezed:
                    return f
        r.ctx.err(r.p(key), f"{show(v)} is not a supported formula "
                            f"(allowed: {', '.join(repr(f) for f in self.values)})")
        return BAD


@dataclass(frozen=True, kw_only=True)
class Sub(Field):
    """A nested mapping, read by its own table (MAPPINGS[mapping])."""
    mapping: str

    def read(self, r: Reader, key: str, default=_DEFAULT):
        return r.raw(key, self.absent(default))


# --- the table -----------------------------------------------------------------------

_PACK_DOC = "several codes in one storage word"

MAPPINGS: Dict[str, Dict[str, Field]] = {
    "spec": {
        "opgen": Version(doc="format version", required=True, value=FORMAT_VERSION),
        "name": Text(doc="identifier of the operator (used in generated symbol names)",
                     required=True, pattern=NAME_PATTERN, what="name"),
        "description": Text(doc="free text (does not affect the content hash)", default=""),
        "op": Choice(doc="operator kind", required=True, values=OPS, what="op"),
        "shape": Sub(doc="fixed or dynamic sizes", mapping="shape"),
        "a": Sub(doc="the activation operand", required=True, mapping="a"),
        "b": Sub(doc="the weight operand (op matmul: required; op quantize: forbidden)",
                 mapping="b"),
        "accumulate": Choice(doc="accumulator type", values=ACCUMULATE, default="float32",
                             what="accumulator"),
        "out": Sub(doc="the output (op quantize: required)", mapping="out"),
        "epilogue": Sub(doc="what is applied to each output element", mapping="epilogue"),
    },
    "shape": {
        "M": Size(doc="rows of A and out", words=("dynamic",), what="M"),
        "N": Size(doc="columns of W and out", words=("any",), what="N"),
        "K": Size(doc="reduction length", words=("any",), what="K"),
    },
    "a": {
        "dtype": Choice(doc="element type of A", required=True, values=ACT_DTYPES,
                        what="activation dtype"),
        "scale": Choice(doc="a float32 scale per row of A (int8 and float8_e4m3 activations; "
                            "none with an int32 output)",
                        values=("row",), what="activation scale"),
    },
    "b": {
        "dtype": Choice(doc="code type of the weight", required=True, values=WEIGHT_DTYPES,
                        what="weight dtype"),
        "layout": Choice(doc="nt: stored [N, K]; nn: stored [K, N]", values=LAYOUTS,
                         default="nt", what="weight layout"),
        "pack": Sub(doc=_PACK_DOC + " (required below 8 bits)", mapping="pack"),
        "scale": Sub(doc="the weight scales", mapping="scale"),
        "zero": Sub(doc="the zero point", mapping="zero"),
        "formula": Formula(doc="how code q, zero point z and scale s give the weight",
                           values=FORMULAS, default=FORMULAS[0]),
        "codebook": Numbers(doc="dtype codebook: the 2**bits values of the codes"),
        "bits": Integer(doc="dtype codebook: the code width", lo=CODEBOOK_BITS[0],
                        hi=CODEBOOK_BITS[-1]),
    },
    "pack": {
        "container": Choice(doc="the storage word", required=True, values=CONTAINERS,
                            what="pack container"),
        "axis": Choice(doc="the axis along which the codes of one word are consecutive",
                       required=True, values=AXES, what="pack axis"),
        "order": Numbers(doc="order[i]: the element held in bit field i (a permutation of "
                             "0..P-1; default 0..P-1)", integers=True),
        "planes": Flag(doc="true: word j holds element j of each of the P equal planes the "
                           "axis is cut into (field i: plane order[i]), not P consecutive "
                           "elements", default=False),
    },
    "scale": {
        "dtype": Choice(doc="element type of the scales", required=True, values=SCALE_DTYPES,
                        what="scale dtype"),
        "group": Size(doc="K elements sharing a scale, or channel / tensor", required=True,
                      words=SCALE_GROUP_WORDS, what="scale group"),
        "layout": Choice(doc="kn: stored [K/G, N]; nk: stored [N, K/G]", values=SCALE_LAYOUTS,
                         default="kn", what="scale layout"),
    },
    "zero": {
        "kind": Choice(doc="none, a constant, a float array or integer codes",
                       required=True, values=ZERO_KINDS, what="zero kind"),
        "dtype": Choice(doc="element type of the zero points (kinds float and int)",
                        values=FLOAT_ZERO_DTYPES + INT_ZERO_DTYPES, what="zero dtype"),
        "pack": Sub(doc=_PACK_DOC + " (kind int, below 8 bits)", mapping="pack"),
        "offset": Integer(doc="kind int: added to each stored zero code", default=0),
        "value": Integer(doc="kind const: the zero point of every element", default=0),
    },
    "out": {
        "dtype": Choice(doc="element type of out (int32: the raw accumulator of int8 "
                            "activations, no scales)", required=True,
                        values=OUT_DTYPES + INT_OUT_DTYPES + QUANT_OUT_DTYPES, what="output dtype"),
    },
    "epilogue": {
        "bias": Flag(doc="add bias[N] (out dtype)", default=False),
        "activation": Choice(doc="applied after the bias", values=ACTIVATIONS, default="none",
                             what="activation"),
    },
}

# Rules that hang on one enumerated field.
OP_REQUIRES = {"matmul": ("b",), "quantize": ("out",)}
OP_FORBIDS = {"matmul": (), "quantize": ("b",)}
OP_OUT_DTYPES = {"matmul": OUT_DTYPES + INT_OUT_DTYPES, "quantize": QUANT_OUT_DTYPES}
OP_ACT_DTYPES = {"matmul": ACT_DTYPES, "quantize": QUANT_ACT_DTYPES}
ZERO_KIND_KEYS = {"none": (), "const": ("value",), "float": ("dtype",),
                  "int": ("dtype", "pack", "offset")}
ZERO_KIND_REQUIRES = {"none": (), "const": ("value",), "float": ("dtype",), "int": ("dtype",)}
ZERO_KIND_DTYPES = {"float": FLOAT_ZERO_DTYPES, "int": INT_ZERO_DTYPES}
CODEBOOK_KEYS = ("codebook", "bits")            # with b.dtype codebook (required), only then


class FieldReader(Reader):
    """A Reader of one mapping of the table: `get(key)` reads the key as the
    table says."""
    table: Dict[str, Field] = {}

    def get(self, key: str, default=_DEFAULT):
        return self.table[key].read(self, key, default)


def open_mapping(ctx: Ctx, value, path: PathT, mapping: str) -> Optional[FieldReader]:
    """A reader of `value` as table mapping `mapping`, its unknown and missing
    keys reported; None (reported) when it is not a mapping."""
    table = MAPPINGS[mapping]
    r = FieldReader.mapping(ctx, value, path, tuple(table),
                            required=tuple(k for k, f in table.items() if f.required))
    if r is not None:
        r.table = table
    return r


__all__ = ["MAPPINGS", "Field", "FieldReader", "open_mapping", "FORMAT_VERSION",
           "QUANT_OUT_DTYPES", "QUANT_ACT_DTYPES"]
