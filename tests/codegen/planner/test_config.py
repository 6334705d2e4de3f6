"""planner/config.py: Config names and dicts, the alignment rule (check_shape)."""
from dataclasses import replace

import pytest

from opgen.codegen import planner
from opgen.codegen.spec import Shape
from opgen.codegen.resolve import load_spec, shipped_specs


def spec(name):
    return load_spec(shipped_specs()[name])


def test_config_round_trip_and_names():
    cfgs = planner.all_configs()
    assert len({c.name for c in cfgs}) == len(cfgs)
    for c in cfgs[:50]:
        assert planner.Config.from_dict(c.to_dict()) == c


def test_fixed_shape_in_spec_is_enforced():
    s = replace(spec("w4a16_sym_g128"), shape=Shape(None, 4096, 4096))
    with pytest.raises(planner.PlanError, match="spec fixes N=4096"):
        planner.check_shape(s, 8192, 4096)


def test_nn_weights_need_16_byte_rows():
    # AWQ [K, N / 8] int32: 24 columns are 12-byte rows (a misaligned cp.async on the GPU).
    with pytest.raises(planner.PlanError, match="multiple of 32"):
        planner.check_shape(spec("awq_w4a16_g128"), 24, 1024)
    planner.check_shape(spec("awq_w4a16_g128"), 544, 1024)
    planner.check_shape(spec("gptq_v2_w4a16_g128"), 24, 1024)   # [K / 8, N] int32: 96-byte rows


def test_alignment_rule_is_stated():
    s = spec("gptq_v2_w4a16_g128")
    with pytest.raises(planner.PlanError, match="multiple of 32"):
        planner.candidates(s, "sm_90", 1, 4096, 4100)
    with pytest.raises(planner.PlanError, match="multiple of 8"):
        planner.candidates(s, "sm_90", 1, 4100, 4096)
