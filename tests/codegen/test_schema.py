"""The JSON Schema of the spec language (codegen/schema.py): a valid draft
2020-12 schema, the shipped file equal to what the generator makes now, every
shipped spec and every valid generated spec accepted, and what the field
table refuses refused (unknown keys, values outside an enumeration or a
bound, the rules on one field: op, zero kind, codebook); the example specs
of 8-bit activations with sub-byte weights (tests/a8_examples.py) too."""
import copy
import json

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from opgen.codegen import schema
from opgen.codegen.canonical import spec_to_yaml_dict
from opgen.codegen.fields import MAPPINGS
from opgen.codegen.planner.config import SIZE_LIMIT
from opgen.codegen.resolve import load_spec, shipped_specs
from opgen.codegen.validate import spec_from_dict
from a8_examples import A8_PATHS
from strategies import valid_spec_dicts

VALIDATOR = jsonschema.Draft202012Validator(schema.spec_schema())


def test_it_is_a_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(schema.spec_schema())
    assert schema.spec_schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_shipped_file_is_what_the_generator_makes_now():
    """Regenerate with `opgen schema -o specs/spec.schema.json` after changing
    the field table."""
    shipped = schema.shipped_schema()
    assert shipped.name == schema.SHIPPED and shipped.parent.name == "specs"
    assert shipped.read_text() == schema.schema_text()
    assert json.loads(shipped.read_text()) == schema.spec_schema()


@pytest.mark.parametrize("name", sorted(shipped_specs()))
def test_every_shipped_spec_validates(name):
    VALIDATOR.validate(yaml.safe_load(shipped_specs()[name].read_text()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_spec_dicts())
def test_what_check_accepts_the_schema_accepts(d):
    spec_from_dict(d)
    VALIDATOR.validate(d)
    VALIDATOR.validate(spec_to_yaml_dict(spec_from_dict(d)))    # the canonical form too


def _gptq():
    return spec_to_yaml_dict(load_spec("gptq_v1_w4a16_g128"))


def _refused(d):
    return [e.message for e in VALIDATOR.iter_errors(d)]


def _with(d, path, value):
    d = copy.deepcopy(d)
    x = d
    for k in path[:-1]:
        x = x[k]
    if value is DELETE:
        del x[path[-1]]
    else:
        x[path[-1]] = value
    return d


DELETE = object()


@pytest.mark.parametrize("path,value", [
    (("bogus",), 1), (("b", "bogus"), 1), (("b", "pack", "bogus"), 1), (("b", "zero", "bogus"), 1),
    (("opgen",), 2), (("opgen",), "1"), (("name",), "Has Space"), (("op",), "conv"),
    (("a", "dtype"), "float64"), (("b", "dtype"), "uint3"), (("b", "layout"), "tn"),
    (("b", "pack", "container"), "int16"), (("b", "pack", "order"), [0.5]),
    (("b", "scale", "group"), "128"), (("b", "scale", "group"), 0),
    (("b", "scale", "group"), SIZE_LIMIT), (("shape", "N"), SIZE_LIMIT), (("shape", "M"), "any"),
    (("b", "zero", "kind"), "asym"), (("b", "zero", "offset"), 2 ** 31),
    (("b", "zero", "value"), 8),                       # kind int takes no value
    (("b", "formula"), "q + z"), (("accumulate",), "float64"), (("out", "dtype"), "int8"),
    (("epilogue",), {"bias": "yes"}), (("b", "bits"), 2),   # bits only with dtype codebook
    (("a",), DELETE), (("b",), DELETE), (("b", "scale", "dtype"), DELETE),
    (("b", "zero", "dtype"), DELETE),                  # kind int needs its dtype
])
def test_the_schema_refuses_what_the_table_refuses(path, value):
    d = _with(_gptq(), path, value)
    assert _refused(d), d
    with pytest.raises(Exception):
        spec_from_dict(d)                              # and so does the validator


def test_formulas_in_any_spacing_and_the_rules_on_op():
    assert not _refused(_with(_gptq(), ("b", "formula"), " (q-z) *s "))
    q = spec_to_yaml_dict(load_spec("quantize_int8_row"))
    assert not _refused(q)
    assert _refused(_with(q, ("b",), {"dtype": "int8"}))            # quantize takes no b
    assert _refused(_with(q, ("out",), DELETE))                       # and needs out
    assert _refused(_with(q, ("out", "dtype"), "float16"))
    assert _refused(_with(q, ("a", "dtype"), "int8"))


def test_zero_bounds_are_the_widest_the_validator_allows():
    """The schema's bounds on zero.value / zero.offset take in every valid
    spec (the validator's bound depends on the types: validate.zero_range)."""
    props = schema.spec_schema()["$defs"]["zero"]["properties"]
    d = spec_to_yaml_dict(load_spec("w4a16_sym_g128"))
    d["b"]["dtype"], d["b"]["pack"] = "uint1", {"container": "int32", "axis": "k"}
    for v in (props["value"]["minimum"], props["value"]["maximum"]):
        d["b"]["zero"]["value"] = v
        assert not _refused(d)
        spec_from_dict(d)                              # reached: a valid spec at each end
    d["b"]["zero"]["value"] = props["value"]["maximum"] + 1
    assert _refused(d)
    assert set(props) == set(MAPPINGS["zero"])


@pytest.mark.parametrize("path", sorted(A8_PATHS.values()), ids=lambda p: p.stem)
def test_the_a8_example_specs_validate(path):
    """8-bit activations with sub-byte weights, the int32 output: the
    example specs of issue 29, in the file and in canonical form."""
    VALIDATOR.validate(yaml.safe_load(path.read_text()))
    VALIDATOR.validate(spec_to_yaml_dict(load_spec(path)))


def test_int32_is_a_matmul_output_only():
    q = spec_to_yaml_dict(load_spec("quantize_int8_row"))
    assert _refused(_with(q, ("out", "dtype"), "int32"))
    d = spec_to_yaml_dict(load_spec("w8a8_int8"))
    del d["a"]["scale"], d["b"]["scale"]
    d["out"]["dtype"] = "int32"
    assert not _refused(d)
    spec_from_dict(d)


def test_zero_bounds_take_in_the_8_bit_activations():
    """The widest ranges include those of sub-byte weights decoded to int8 / e4m3."""
    props = schema.spec_schema()["$defs"]["zero"]["properties"]
    d = spec_to_yaml_dict(load_spec("w4a8_int8"))
    for v in (-112, 128):                       # validate.zero_range's ends for int8 x uint4
        d["b"]["zero"]["value"] = v
        spec_from_dict(d)
        assert props["value"]["minimum"] <= v <= props["value"]["maximum"] and not _refused(d)
