"""The canonical YAML form (codegen/canonical.py): what it writes loads back
to the same Spec, and writing that again gives the same form."""
from __future__ import annotations

import pytest
import yaml

from opgen.codegen.canonical import dump_spec, spec_to_yaml_dict
from opgen.codegen.resolve import load_spec, shipped_specs


@pytest.mark.parametrize("name", sorted(shipped_specs()))
def test_shipped_specs_round_trip(name):
    spec = load_spec(name)
    d = spec_to_yaml_dict(spec)
    assert load_spec(yaml.safe_dump(d)) == spec
    again = load_spec(dump_spec(spec), filename=f"{name}.yaml")
    assert again == spec and spec_to_yaml_dict(again) == d
