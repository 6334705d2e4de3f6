"""The field table (codegen/fields.py) is what the validator reads specs by:
each mapping's keys, its required keys, each enumeration and bound, each
default, are the ones the validator enforces (so the JSON Schema generated
from the table, tests/codegen/test_schema.py, says what `opgen check` says)."""
import copy

import pytest

from opgen.codegen import fields as F
from opgen.codegen.canonical import spec_to_yaml_dict
from opgen.codegen.errors import SpecErrors
from opgen.codegen.planner.config import SIZE_LIMIT
from opgen.codegen.resolve import load_spec
from opgen.codegen.spec import INT_OUT_DTYPES, OUT_DTYPES
from opgen.codegen.validate import spec_from_dict

# One spec that holds every mapping of the table (where a mapping occurs twice,
# b.pack and b.zero.pack, the first is used), with the key of the zero kind
# and the codebook keys in specs of their own.
FULL = spec_to_yaml_dict(load_spec("gptq_v1_w4a16_g128"))
FULL["epilogue"] = {"bias": True, "activation": "silu"}
WHERE = {"spec": (), "shape": ("shape",), "a": ("a",), "b": ("b",), "pack": ("b", "pack"),
         "scale": ("b", "scale"), "zero": ("b", "zero"), "out": ("out",),
         "epilogue": ("epilogue",)}
CODEBOOK = {**copy.deepcopy(FULL), "b": {"dtype": "codebook", "bits": 2, "codebook": [0, 1, 2, 3],
                                         "pack": {"container": "int32", "axis": "k"}}}
CONST = copy.deepcopy(FULL)
CONST["b"]["zero"] = {"kind": "const", "value": 8}


def _base(mapping, key):
    if mapping == "b" and key in F.CODEBOOK_KEYS:
        return copy.deepcopy(CODEBOOK)
    if mapping == "zero" and key == "value":
        return copy.deepcopy(CONST)
    return copy.deepcopy(FULL)


def _at(d, path):
    for k in path:
        d = d[k]
    return d


def _errors(d):
    with pytest.raises(SpecErrors) as ei:
        spec_from_dict(d)
    return {e.path: e.message for e in ei.value.errors}


FIELDS = [(m, k, f) for m, table in F.MAPPINGS.items() for k, f in table.items()]


def test_the_table_covers_every_mapping_and_its_keys_are_the_allowed_ones():
    assert set(WHERE) == set(F.MAPPINGS)
    for mapping, path in WHERE.items():
        d = copy.deepcopy(FULL)
        _at(d, path)["bogus"] = 1
        msg = _errors(d)[".".join(path + ("bogus",))]
        assert msg.endswith("(allowed: " + ", ".join(F.MAPPINGS[mapping]) + ")"), msg


@pytest.mark.parametrize("mapping,key", [(m, k) for m, k, f in FIELDS if f.required])
def test_required_keys_are_required(mapping, key):
    d = _base(mapping, key)
    del _at(d, WHERE[mapping])[key]
    assert ".".join(WHERE[mapping] + (key,)) in _errors(d)


@pytest.mark.parametrize("mapping,key,field", [(m, k, f) for m, k, f in FIELDS
                                               if isinstance(f, F.Choice)])
def test_choices_are_the_table_s(mapping, key, field):
    """Every value the table lists is read (given the rest allows it); one it
    does not list is refused with the list."""
    path = ".".join(WHERE[mapping] + (key,))
    d = _base(mapping, key)
    _at(d, WHERE[mapping])[key] = "bogus"
    msg = _errors(d)[path]
    assert set(msg[msg.rindex("(allowed: ") + len("(allowed: "):-1].split(", ")) <= set(field.values)
    # (the base spec is a matmul with int zero points: the rules on one field narrow these two)
    narrowed = {("zero", "dtype"): F.ZERO_KIND_DTYPES["int"], ("out", "dtype"): F.OP_OUT_DTYPES["matmul"]}
    for v in narrowed.get((mapping, key), field.values):
        _at(d, WHERE[mapping])[key] = v
        try:
            spec_from_dict(d)
        except SpecErrors as e:             # a rule between fields may still refuse it
            assert not any(x.path == path and "is not a valid" in x.message for x in e.errors)


@pytest.mark.parametrize("mapping,key", [(m, k) for m, k, f in FIELDS if isinstance(f, F.Size)])
def test_sizes_are_bounded_by_the_table(mapping, key):
    d = _base(mapping, key)
    _at(d, WHERE[mapping])[key] = SIZE_LIMIT
    msg = _errors(d)[".".join(WHERE[mapping] + (key,))]
    assert msg == F.MAPPINGS[mapping][key].too_large(SIZE_LIMIT) and "32-bit" in msg


def test_defaults_are_the_table_s():
    """A spec without the optional keys reads as their defaults."""
    s = spec_from_dict({"opgen": 1, "name": "x", "op": "matmul", "a": {"dtype": "float16"},
                        "b": {"dtype": "uint8", "scale": {"dtype": "float16", "group": 32},
                              "zero": {"kind": "int", "dtype": "uint8"}}})
    t = F.MAPPINGS
    assert (s.description, s.accumulate) == (t["spec"]["description"].default,
                                             t["spec"]["accumulate"].default)
    assert (s.b.layout, s.b.formula) == (t["b"]["layout"].default, t["b"]["formula"].default)
    assert s.b.scale.layout == t["scale"]["layout"].default
    assert s.b.zero.offset == t["zero"]["offset"].default
    assert (s.epilogue.bias, s.epilogue.activation) == (t["epilogue"]["bias"].default,
                                                        t["epilogue"]["activation"].default)


def test_number_lists():
    d = _base("b", "codebook")
    d["b"]["codebook"] = [0, 1, 2, 10 ** 400]              # an integer beyond float64
    assert "finite numbers" in _errors(d)["b.codebook"]
    d = copy.deepcopy(FULL)
    d["b"]["pack"]["order"] = [0, 1.0, 2, 3, 4, 5, 6, 7]
    assert "list of integers" in _errors(d)["b.pack.order"]


def test_rules_on_one_field_name_known_values():
    assert set(F.OP_REQUIRES) == set(F.OP_FORBIDS) == set(F.OP_OUT_DTYPES) == set(F.OP_ACT_DTYPES) \
        == set(F.MAPPINGS["spec"]["op"].values)
    kinds = set(F.MAPPINGS["zero"]["kind"].values)
    assert set(F.ZERO_KIND_KEYS) == set(F.ZERO_KIND_REQUIRES) == kinds
    for kind, keys in F.ZERO_KIND_KEYS.items():
        assert set(keys) <= set(F.MAPPINGS["zero"]) and set(F.ZERO_KIND_REQUIRES[kind]) <= set(keys)
    for dtypes in F.ZERO_KIND_DTYPES.values():
        assert set(dtypes) <= set(F.MAPPINGS["zero"]["dtype"].values)
    assert set(F.CODEBOOK_KEYS) <= set(F.MAPPINGS["b"])


def test_int32_is_a_matmul_output_only():
    """The raw accumulator: a matmul output (under validate.py's rules), never
    a quantize one, and not among the outputs any matmul takes (OUT_DTYPES)."""
    assert "int32" in F.OP_OUT_DTYPES["matmul"] and "int32" in F.MAPPINGS["out"]["dtype"].values
    assert "int32" not in F.OP_OUT_DTYPES["quantize"] and "int32" not in OUT_DTYPES
    assert set(INT_OUT_DTYPES) == {"int32"}
    assert "int32 output" in F.MAPPINGS["a"]["scale"].doc
