"""Reading YAML with located errors (codegen/yaml_source.py): the line of
every field, malformed text and duplicate keys, typed field reads."""
from __future__ import annotations

import pytest

from opgen.codegen.errors import SpecErrors
from opgen.codegen.yaml_source import BAD, Reader, parse_yaml

TEXT = """\
opgen: 1
b:
  dtype: uint4
  pack: {container: int32,
         axis: k}
  order:
    - 0
    - 1
"""


def test_every_field_has_its_line():
    data, ctx = parse_yaml(TEXT, "f.yaml")
    assert data == {"opgen": 1, "b": {"dtype": "uint4", "pack": {"container": "int32", "axis": "k"},
                                      "order": [0, 1]}}
    assert not ctx.errors
    assert (ctx.line(("opgen",)), ctx.line(("b",)), ctx.line(("b", "dtype"))) == (1, 2, 3)
    assert ctx.line(("b", "pack", "axis")) == 5
    assert ctx.line(("b", "order", 1)) == 8
    assert ctx.line(("b", "pack", "missing")) == 4          # its nearest ancestor's line


def test_malformed_yaml_is_one_located_error():
    with pytest.raises(SpecErrors) as ei:
        parse_yaml("opgen: 1\nname: [x\nop: matmul\n", "m.yaml")
    (e,) = ei.value.errors
    assert (e.file, e.path) == ("m.yaml", "yaml") and e.line >= 2
    assert e.message.startswith("malformed YAML")
    with pytest.raises(SpecErrors) as ei:
        parse_yaml("", "e.yaml")
    assert ei.value.paths == ["spec"]


def test_duplicate_key_reported_at_its_line():
    data, ctx = parse_yaml("opgen: 1\nopgen: 2\n", "d.yaml")
    assert data == {"opgen": 1}
    (e,) = ctx.errors
    assert (e.line, e.path) == (2, "opgen")
    assert "duplicate" in e.message and "line 1" in e.message


def test_reader_reports_every_problem_at_its_line():
    data, ctx = parse_yaml("x: 1\na: {dtype: float64,\n    extra: 1, n: 0}\n", "r.yaml")
    r = Reader.mapping(ctx, data["a"], ("a",), ("dtype", "n", "scale"),
                       required=("dtype", "scale"))
    assert r.choice("dtype", ("float16",), what="dtype") is BAD
    assert r.integer("n", lo=1) is BAD
    assert r.string("scale", "default") == "default"
    assert Reader.mapping(ctx, data["x"], ("x",), ("k",)) is None
    with pytest.raises(SpecErrors) as ei:
        ctx.raise_if_any()
    got = {(e.line, e.path) for e in ei.value.errors}
    assert got == {(1, "x"), (2, "a.dtype"), (3, "a.extra"), (2, "a.scale"), (3, "a.n")}
    msgs = {e.path: e.message for e in ei.value.errors}
    assert "(allowed: float16)" in msgs["a.dtype"] and "unknown key 'extra'" in msgs["a.extra"]
    assert [e.line for e in ei.value.errors] == sorted(e.line for e in ei.value.errors)
