"""The spec language as JSON Schema (draft 2020-12), written out from the
field table the validator reads specs by (fields.py): keys, required keys,
enumerations, size bounds, defaults, a line of help per key, and the rules
that hang on one enumerated field (the op, the zero kind, the weight dtype).
Editors that read JSON Schema for YAML complete and check specs with it;
the rules between fields beyond those (a group dividing a fixed K, the
kernels' alignment, ...) stay `opgen check`'s.

The package ships the generated file (SHIPPED, in opgen.specs);
`opgen schema` prints it.
"""
from __future__ import annotations

import dataclasses
import json
import re
from importlib import resources
from pathlib import Path
from typing import Dict

from .fields import (
    CODEBOOK_KEYS, FORMAT_VERSION, MAPPINGS, OP_ACT_DTYPES, OP_FORBIDS, OP_OUT_DTYPES,
    OP_REQUIRES, ZERO_KIND_DTYPES, ZERO_KIND_KEYS, ZERO_KIND_REQUIRES, Choice, Field, Flag,
    Formula, Integer, Numbers, Size, Sub, Text, Version,
)
from .planner.config import SIZE_LIMIT
from .spec import (
    EXACT_INTS, WEIGHT_CODES, WEIGHT_DTYPES, ZERO_KINDS, Activation, Output, Pack, Spec, Weight,
    Zero,
)
from .validate import A8_DECODE_INTS, FLOAT_WEIGHT_DTYPES, SUB_BYTE_INT_DTYPES, zero_range

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SHIPPED = "spec.schema.json"          # in the opgen.specs package, next to the shipped specs


def field_schema(f: Field) -> dict:
    """One key's schema."""
    out: dict = {"description": f.doc}
    if isinstance(f, Sub):
        out["$ref"] = f"#/$defs/{f.mapping}"
    elif isinstance(f, Choice):
        out["enum"] = list(f.values)
    elif isinstance(f, Size):
        out["anyOf"] = [{"type": "integer", "minimum": 1, "maximum": SIZE_LIMIT - 1},
                        {"enum": list(f.words)}]
    elif isinstance(f, Version):
        out["const"] = f.value
    elif isinstance(f, Integer):
        out["type"] = "integer"
        if f.lo is not None:
            out["minimum"] = f.lo
        if f.hi is not None:
            out["maximum"] = f.hi
    elif isinstance(f, Text):
        out["type"] = "string"
        if f.pattern:
            out["pattern"] = f"^{f.pattern}$"
    elif isinstance(f, Flag):
        out["type"] = "boolean"
    elif isinstance(f, Numbers):
        out.update(type="array", items={"type": "integer" if f.integers else "number"})
    elif isinstance(f, Formula):
        # the validator ignores whitespace: any spacing of one of the formulas
        spaced = "|".join(r"\s*".join(re.escape(c) for c in v if not c.isspace())
                          for v in f.values)
        out.update(type="string", anyOf=[{"enum": list(f.values)},
                                         {"pattern": rf"^\s*(?:{spaced})\s*$"}])
    else:                                                   # pragma: no cover
        raise TypeError(f"no schema for {type(f).__name__}")
    if f.default is not None and not f.required and not isinstance(f, Sub):
        out["default"] = f.default
    return out


def mapping_schema(name: str) -> dict:
    table = MAPPINGS[name]
    out = {"type": "object", "properties": {k: field_schema(f) for k, f in table.items()},
           "additionalProperties": False}
    required = [k for k, f in table.items() if f.required]
    if required:
        out["required"] = required
    return out


def _when(key: str, value, then: dict) -> dict:
    return {"if": {"properties": {key: {"const": value}}, "required": [key]}, "then": then}


def _zero_bounds() -> Dict[str, dict]:
    """The widest range of zero.value / zero.offset any spec allows (the
    validator's bound depends on the weight and activation types:
    validate.zero_range), so that the schema never refuses a valid spec."""
    ranges: Dict[str, list] = {"value": [], "offset": []}
    for wd in WEIGHT_DTYPES:
        if wd in FLOAT_WEIGHT_DTYPES:
            continue
        bits = WEIGHT_CODES[wd].bits
        pack = Pack("int32", "k", tuple(range(32 // bits))) if bits < 8 else None
        acts = tuple(EXACT_INTS) + (tuple(A8_DECODE_INTS) if wd in SUB_BYTE_INT_DTYPES else ())
        for a in acts:
            base = Spec(name="bounds", op="matmul", a=Activation(a), b=Weight(wd, pack=pack),
                        out=Output())
            ranges["value"].append(zero_range(_with(base, Zero("const"))))
            for zd in ZERO_KIND_DTYPES["int"]:
                ranges["offset"].append(zero_range(_with(base, Zero("int", zd))))
    return {k: {"minimum": min(r[0] for r in v if r[0] <= r[1]),
                "maximum": max(r[1] for r in v if r[0] <= r[1])}      # (lo > hi: none fits)
            for k, v in ranges.items()}


def _with(spec: Spec, zero: Zero) -> Spec:
    return dataclasses.replace(spec, b=dataclasses.replace(spec.b, zero=zero))


def spec_schema() -> dict:
    """The JSON Schema of a spec file."""
    defs = {name: mapping_schema(name) for name in MAPPINGS if name != "spec"}
    zero = defs["zero"]
    for key, bounds in _zero_bounds().items():
        zero["properties"][key].update(bounds)
    zero["allOf"] = [
        _when("kind", kind, {
            **({"required": list(ZERO_KIND_REQUIRES[kind])} if ZERO_KIND_REQUIRES[kind] else {}),
            "properties": {**{k: False for k in MAPPINGS["zero"]
                              if k != "kind" and k not in ZERO_KIND_KEYS[kind]},
                           **({"dtype": {"enum": list(ZERO_KIND_DTYPES[kind])}}
                              if kind in ZERO_KIND_DTYPES else {})}})
        for kind in ZERO_KINDS]
    defs["b"]["allOf"] = [
        _when("dtype", "codebook", {"required": list(CODEBOOK_KEYS)}),
        {"if": {"properties": {"dtype": {"not": {"const": "codebook"}}}},
         "then": {"properties": {k: False for k in CODEBOOK_KEYS}}}]
    top = mapping_schema("spec")
    top["allOf"] = [
        _when("op", op, {
            "required": list(OP_REQUIRES[op]),
            "properties": {**{k: False for k in OP_FORBIDS[op]},
                           "a": {"properties": {"dtype": {"enum": list(OP_ACT_DTYPES[op])}}},
                           "out": {"properties": {"dtype": {"enum": list(OP_OUT_DTYPES[op])}}}}})
        for op in OP_REQUIRES]
    return {"$schema": DRAFT,
            "title": f"opgen spec (format version {FORMAT_VERSION})",
            "description": "A quantized-matmul operator spec for opgen (docs/spec.md). Generated "
                           "from the validator's field table by `opgen schema`; `opgen check` "
                           "also checks the rules between fields.",
            **top, "$defs": defs}


def schema_text() -> str:
    """The schema as the package ships it (and `opgen schema` prints it)."""
    return json.dumps(spec_schema(), indent=2) + "\n"


def shipped_schema() -> Path:
    """The shipped schema file."""
    return Path(str(resources.files("opgen.specs") / SHIPPED))


__all__ = ["spec_schema", "schema_text", "shipped_schema", "SHIPPED"]
