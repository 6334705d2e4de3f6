"""The canonical YAML form (codegen/canonical.py): what it writes loads back
to the same Spec, and writing that again gives the same form."""
from __future__ import annotations

import pytest

from opgen.codegen.canonical import dump_spec, dump_yaml, spec_to_yaml_dict
from opgen.codegen.resolve import as_spec, load_spec, shipped_specs
from opgen.codegen.validate import spec_from_dict


@pytest.mark.parametrize("name", sorted(shipped_specs()))
def test_shipped_specs_round_trip(name):
    spec = load_spec(name)
    d = spec_to_yaml_dict(spec)
    assert load_spec(dump_yaml(d)) == spec
    again = load_spec(dump_spec(spec), filename=f"{name}.yaml")
    assert again == spec and spec_to_yaml_dict(again) == d


def test_planes_round_trip_and_are_written_only_when_set():
    d = spec_to_yaml_dict(as_spec("bitnet_b158"))
    assert "planes" not in d["b"]["pack"]
    d["b"]["pack"] = dict(d["b"]["pack"], axis="n", planes=True)
    s = spec_from_dict(d)
    assert s.b.pack.planes and spec_to_yaml_dict(s)["b"]["pack"]["planes"] is True


@pytest.mark.parametrize("text", ["0E0", "0o17", "1e3", ".inf", "yes", "null", "12", "plain"])
def test_strings_the_two_yamls_read_otherwise_are_quoted(text):
    """PyYAML writes YAML 1.1 and quotes what 1.1 would not read as a string;
    load_spec refuses a plain scalar YAML 1.2 reads otherwise (0E0: a float)."""
    spec = spec_from_dict(dict(spec_to_yaml_dict(as_spec("fp16")), description=text))
    assert load_spec(dump_spec(spec)).description == text
    assert load_spec(dump_yaml(spec_to_yaml_dict(spec))).description == text
