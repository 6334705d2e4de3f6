"""A Spec back to YAML, in canonical form: `load_spec` of what these write
gives the same Spec (validate.py is the other direction)."""
from __future__ import annotations

from typing import Any, Dict

import yaml

from .spec import Pack, Spec, Weight
from .yaml_source import plain_reads_as_string


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, but strings that YAML 1.2 would read as something
    else are quoted (load_spec refuses a plain scalar the two YAMLs disagree on)."""


_Dumper.add_representer(str, lambda dumper, s: dumper.represent_scalar(
    "tag:yaml.org,2002:str", s, style=None if plain_reads_as_string(s) else '"'))


def dump_yaml(data, **kw) -> str:
    """yaml.safe_dump's text of data (keyword arguments: its options), which
    load_spec reads back as data."""
    return yaml.dump(data, Dumper=_Dumper, **kw)


def spec_to_yaml_dict(spec: Spec) -> dict:
    """Canonical YAML form of a Spec: load_spec(dump_yaml(d)) == spec."""
    d: Dict[str, Any] = {"opgen": spec.version, "name": spec.name}
    if spec.description:
        d["description"] = spec.description
    d["op"] = spec.op
    d["shape"] = {
        "M": "dynamic" if spec.shape.M is None else spec.shape.M,
        "N": "any" if spec.shape.N is None else spec.shape.N,
        "K": "any" if spec.shape.K is None else spec.shape.K,
    }
    a: Dict[str, Any] = {"dtype": spec.a.dtype}
    if spec.a.scale is not None:
        a["scale"] = spec.a.scale
    d["a"] = a
    if spec.b is not None:
        d["b"] = _weight_to_dict(spec.b)
    d["accumulate"] = spec.accumulate
    d["out"] = {"dtype": spec.out.dtype}
    d["epilogue"] = {"bias": spec.epilogue.bias, "activation": spec.epilogue.activation}
    return d


def _pack_to_dict(p: Pack) -> dict:
    d = {"container": p.container, "axis": p.axis, "order": list(p.order)}
    if p.planes:
        d["planes"] = True
    return d


def _weight_to_dict(w: Weight) -> dict:
    b: Dict[str, Any] = {"dtype": w.dtype, "layout": w.layout}
    if w.pack is not None:
        b["pack"] = _pack_to_dict(w.pack)
    if w.scale is not None:
        s = w.scale
        b["scale"] = {"dtype": s.dtype,
                      "group": s.group if s.granularity == "group" else s.granularity}
        if s.granularity == "group":
            b["scale"]["layout"] = s.layout
    z = w.zero
    zd: Dict[str, Any] = {"kind": z.kind}
    if z.kind == "const":
        zd["value"] = z.value
    elif z.kind == "float":
        zd["dtype"] = z.dtype
    elif z.kind == "int":
        zd["dtype"] = z.dtype
        if z.pack is not None:
            zd["pack"] = _pack_to_dict(z.pack)
        zd["offset"] = z.offset
    b["zero"] = zd
    b["formula"] = w.formula
    if w.dtype == "codebook":
        b["bits"] = w.bits
        b["codebook"] = list(w.codebook)
    return b


def dump_spec(spec: Spec) -> str:
    """The spec as YAML text (canonical form, keys in language order)."""
    return dump_yaml(spec_to_yaml_dict(spec), sort_keys=False, default_flow_style=None, width=100)


__all__ = ["spec_to_yaml_dict", "dump_spec", "dump_yaml"]
