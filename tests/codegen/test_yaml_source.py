"""Reading YAML with located errors (codegen/yaml_source.py): the line of
every field, malformed text and duplicate keys, typed field reads; hostile
text (aliases, nesting, size, odd characters and numbers, YAML 1.1 forms)
ends in one located line per problem, quickly."""
from __future__ import annotations

import time

import pytest
import yaml

from opgen.codegen.errors import SpecErrors
from opgen.codegen.resolve import shipped_specs
from opgen.codegen.yaml_source import (
    BAD, MAX_ALIAS_NODES, Ctx, MAX_DEPTH, MAX_SPEC_BYTES, Reader, decode_spec, parse_yaml,
    plain_reads_as_string,
)

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


# --- hostile text: every problem one located line, in bounded time ----------------

def _one_error(text: str, filename: str = "h.yaml"):
    """parse_yaml + validation-free reading -> the single SpecError raised."""
    with pytest.raises(SpecErrors) as ei:
        parse_yaml(text, filename)
    (e,) = ei.value.errors
    assert e.file == filename and "\n" not in str(e)
    return e


def _timed(fn, *args):
    t0 = time.perf_counter()
    try:
        return fn(*args)
    finally:
        assert time.perf_counter() - t0 < 2.0


def test_limits_are_far_above_a_shipped_spec():
    for path in shipped_specs().values():
        text = path.read_text()
        assert len(text.encode()) * 16 < MAX_SPEC_BYTES
        assert not any(isinstance(ev, yaml.AliasEvent) for ev in yaml.parse(text))
    assert MAX_DEPTH >= 4 * 5 and MAX_ALIAS_NODES >= 100      # b.zero.pack.order.i: 5 levels


def test_billion_laughs_stops_at_the_alias_budget():
    text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 12))
    e = _timed(_one_error, text)
    assert e.path == "yaml" and e.line == 3 and f"at most {MAX_ALIAS_NODES}" in e.message


def test_aliases_within_the_budget_are_expanded():
    data, ctx = parse_yaml("p: &p {container: int32, axis: k}\nq: *p\nr: [*p, *p]\n", "a.yaml")
    assert data["q"] == data["r"][0] == {"container": "int32", "axis": "k"}
    assert not ctx.errors


@pytest.mark.parametrize("text, line", [
    ("opgen: 1\nname: &a [*a]\n", 2),
    ("opgen: 1\nname: &a\n  x:\n    - *a\n", 4),
])
def test_recursive_alias_is_one_located_error(text, line):
    e = _timed(_one_error, text)
    assert (e.line, e.path) == (line, "yaml") and "inside its own anchor &a, a cycle" in e.message


@pytest.mark.parametrize("text, line", [
    ("opgen: 1\nname: " + "[" * 5000 + "]" * 5000 + "\n", 2),
    ("opgen: 1\nb:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)), 2 + MAX_DEPTH),
])
def test_deep_nesting_is_one_located_error(text, line):
    e = _timed(_one_error, text)
    assert (e.line, e.path) == (line, "yaml") and f"at most {MAX_DEPTH}" in e.message


def test_deep_nesting_through_aliases_is_located():
    half = MAX_DEPTH // 2 + 1
    text = (f"x: &x {'[' * half}1{']' * half}\n"
            f"y: &y {'[' * half}*x{']' * half}\n")
    with pytest.raises(SpecErrors) as ei:
        _timed(parse_yaml, text, "al.yaml")
    assert ei.value.errors and all(f"at most {MAX_DEPTH}" in e.message for e in ei.value)
    assert {e.line for e in ei.value} == {1}             # where the too-deep node is written


def test_thousands_of_unknown_keys_are_reported_in_linear_time():
    n = 5000
    text = "opgen: 1\n" + "".join(f"k{i}: 1\n" for i in range(n))
    assert len(text) < MAX_SPEC_BYTES

    def read():
        data, ctx = parse_yaml(text, "k.yaml")
        Reader.mapping(ctx, data, (), ("opgen",))
        return ctx.errors
    errors = _timed(read)
    assert len(errors) == n and errors[-1].line == n + 1


def test_errors_are_deduplicated_in_linear_time():
    ctx = Ctx("d.yaml", {}, default_line=1)

    def report():
        for i in range(20000):
            ctx.err(("k", i), "unknown key")
        ctx.err(("k", 7), "unknown key")                  # again: reported once
    _timed(report)
    assert len(ctx.errors) == 20000


def test_oversized_text_is_rejected_before_parsing():
    e = _timed(_one_error, "k: 1\n" * (5 * 2 ** 20 // 5))
    assert (e.line, e.path) == (1, "spec") and f"at most {MAX_SPEC_BYTES} bytes" in e.message


def test_bytes_are_decoded_with_a_located_error():
    assert decode_spec("opgen: 1\nname: é\n".encode(), "u.yaml") == "opgen: 1\nname: é\n"
    with pytest.raises(SpecErrors) as ei:
        decode_spec(b"opgen: 1\nname: \xff\xfe\n", "u.yaml")
    (e,) = ei.value.errors
    assert (e.line, e.path) == (2, "yaml") and "0xff is not UTF-8" in e.message


@pytest.mark.parametrize("text, line", [
    ("opgen: 1\nname: a\x00b\n", 2),
    ("opgen: 1\n\nname: \x07\n", 3),
])
def test_control_character_is_one_located_line(text, line):
    e = _one_error(text)
    assert (e.line, e.path) == (line, "yaml") and "not allowed" in e.message


@pytest.mark.parametrize("number", ["1" * 400, "-1" + "0" * 150, "1" + "0" * 150 + ".5"])
def test_huge_number_is_one_located_line(number):
    e = _one_error(f"b:\n  codebook: [1, {number}]\n")
    assert (e.line, e.path) == (2, "b.codebook.1") and "too long" in e.message


def test_a_long_string_that_starts_like_a_number_is_a_string():
    text = "1" * 150 + " volts"
    data, ctx = parse_yaml(f"d: {text}\n", "s.yaml")
    assert data == {"d": text} and not ctx.errors


def test_integers_are_bounded_to_64_bits():
    data, _ = parse_yaml(f"n: {2 ** 64 - 1}\nm: {-(2 ** 64 - 1)}\n", "i.yaml")
    assert data == {"n": 2 ** 64 - 1, "m": -(2 ** 64 - 1)}
    e = _one_error(f"opgen: 1\nn: {2 ** 64}\n")
    assert (e.line, e.path) == (2, "n") and "below 2**64" in e.message


def test_merge_keys_merge():
    text = ("p: &p {container: int32, axis: k}\n"
            "q: {<<: *p, axis: n}\n"
            "r:\n  <<: [{a: 1, b: 1}, {a: 2, c: 2}]\n  b: 0\n")
    data, ctx = parse_yaml(text, "m.yaml")
    assert data["q"] == {"container": "int32", "axis": "n"}     # own keys override
    assert data["r"] == {"b": 0, "a": 1, "c": 2}                # earlier merged ones win
    assert not ctx.errors
    assert ctx.line(("q", "axis")) == 2 and ctx.line(("q", "container")) == 1
    e = _one_error("x: {<<: 1}\n")
    assert (e.line, e.path) == (1, "x.<<") and "merge key takes a mapping" in e.message


# YAML 1.1 (PyYAML) and 1.2 read these plain scalars differently: rejected, both readings shown
@pytest.mark.parametrize("text, says", [
    ("0200", "128 by YAML 1.1 but as 200 by YAML 1.2"),
    ("2:08", "128 by YAML 1.1 but as a string"),
    ("1:30.5", "90.5 by YAML 1.1 but as a string"),
    ("0b101", "5 by YAML 1.1 but as a string"),
    ("1_000", "1000 by YAML 1.1 but as a string"),
    ("yes", "true by YAML 1.1 but as a string"),
    ("Off", "false by YAML 1.1 but as a string"),
    ("1e3", "a string by YAML 1.1 but as 1000.0 by YAML 1.2"),
    ("0o17", "a string by YAML 1.1 but as 15 by YAML 1.2"),
    ("2024-01-31", "the date 2024-01-31 by YAML 1.1 but as a string"),
])
def test_yaml11_only_forms_are_rejected(text, says):
    e = _one_error(f"opgen: 1\nshape:\n  K: {text}\n")
    assert (e.line, e.path) == (3, "shape.K") and says in e.message
    assert f'the quoted string "{text}"' in e.message
    data, ctx = parse_yaml(f"opgen: 1\nshape:\n  K: '{text}'\n", "q.yaml")   # quoted: a string
    assert data["shape"]["K"] == text and not ctx.errors


def test_forms_both_versions_read_alike_are_accepted():
    data, ctx = parse_yaml("a: [0, -7, +5, 0x1f, 1.5, .5, 2., 1.0e+3, -.inf, true, False, ~, "
                           "null, y, n, '<<', =, x]\n", "s.yaml")
    assert data["a"][:13] == [0, -7, 5, 31, 1.5, 0.5, 2.0, 1000.0, float("-inf"), True, False,
                              None, None]
    assert data["a"][13:] == ["y", "n", "<<", "=", "x"] and not ctx.errors


@pytest.mark.parametrize("value", ["0b_", "2001-13-45", "!!float abc", "!!int 1.5",
                                   "!!timestamp x"])
def test_unreadable_scalar_is_one_located_line(value):
    e = _one_error(f"opgen: 1\nname: {value}\n")
    assert (e.line, e.path) == (2, "name") and "cannot be read" in e.message


def test_every_problem_in_values_is_reported_before_validation():
    with pytest.raises(SpecErrors) as ei:
        parse_yaml("a: 0200\nb: {on: 1}\nc: 2:08\n", "v.yaml")
    assert [(e.line, e.path) for e in ei.value] == [(1, "a"), (2, "b.on"), (3, "c")]


def test_a_key_that_is_not_printable_stays_on_one_line():
    data, ctx = parse_yaml('"a\\nb": 1\n"\\u2028": 2\n', "n.yaml")
    Reader.mapping(ctx, data, (), ("x",))
    assert len(ctx.errors) == 2 and all("\n" not in str(e) and "\u2028" not in str(e)
                                        for e in ctx.errors)
    assert ctx.errors[0].path == "'a\\nb'"


def test_a_list_as_key_is_one_located_error():
    e = _one_error("opgen: 1\n? [a, b]\n: 1\n")
    assert (e.line, e.path) == (2, "spec") and "plain value" in e.message


@pytest.mark.parametrize("text, plain", [
    ("hello", True), ("0E0", False), ("0o17", False), ("1_000", True), ("0x1F", False),
    (".nan", False), ("-.inf", False), ("true", False), ("yes", True), ("~", False), ("", False),
])
def test_plain_reads_as_string_in_yaml_1_2(text, plain):
    """(yes: a boolean to YAML 1.1 only; PyYAML quotes those itself)"""
    assert plain_reads_as_string(text) is plain
