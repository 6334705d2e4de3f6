"""planner/config.py: Config names and dicts, the size rule (check_shape,
shape_problems): alignment, integers, the reach of 32-bit indexing."""
from dataclasses import replace

import numpy as np
import pytest

from opgen.codegen import planner
from opgen.codegen.canonical import spec_to_yaml_dict
from opgen.codegen.planner.config import INDEX_LIMIT, SIZE_LIMIT
from opgen.codegen.spec import Shape
from opgen.codegen.validate import spec_from_dict
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


def test_packed_zero_points_fill_whole_words():
    """Int zero points packed 8 to an int32 along k, group 128: K = 512 has 4
    groups, half a word (stored zeros (0, N), and candidates were offered);
    along n, 16 two-bit ones to a word need N a multiple of 16."""
    d = spec_to_yaml_dict(spec("gptq_v2_w4a16_g128"))
    d["b"]["zero"]["pack"]["axis"] = "k"
    zk = spec_from_dict(d)
    assert zk.shape.K is None
    with pytest.raises(planner.PlanError, match="K=512 must be a multiple of 1024 "
                                                r"\(group 128, 8 zero points per int32"):
        planner.candidates(zk, "sm_90", 1, 256, 512)
    assert planner.candidates(zk, "sm_90", 1, 256, 1024)
    d = spec_to_yaml_dict(spec("w2a16_g128"))
    d["b"]["zero"] = {"kind": "int", "dtype": "uint2", "pack": {"container": "int32", "axis": "n"}}
    zn = spec_from_dict(d)
    with pytest.raises(planner.PlanError, match=r"N=8 must be a multiple of 16 \(16 zero points"):
        planner.check_shape(zn, 8, 1024)
    planner.check_shape(zn, 16, 1024)


def test_alignment_rule_is_stated():
    s = spec("gptq_v2_w4a16_g128")
    with pytest.raises(planner.PlanError, match="multiple of 32"):
        planner.candidates(s, "sm_90", 1, 4096, 4100)
    with pytest.raises(planner.PlanError, match="multiple of 8"):
        planner.candidates(s, "sm_90", 1, 4100, 4096)


# --- sizes: integers the kernels' 32-bit indexing holds ---------------------------------------

@pytest.mark.parametrize("N", [4096.7, 4096.0, "4096", True])
def test_sizes_are_integers_not_truncated(N):
    """load(N=4096.7) truncated silently: a size that is not an integer is refused."""
    with pytest.raises(planner.PlanError, match=f"N={N!r} must be an integer"):
        planner.check_shape(spec("gptq_v2_w4a16_g128"), N, 4096)


def test_numpy_integers_are_sizes():
    planner.check_shape(spec("gptq_v2_w4a16_g128"), np.int64(4096), np.int32(4096))


@pytest.mark.parametrize("dim,v", [("N", 2 ** 31), ("K", 2 ** 64 + 1), ("M", 2 ** 31),
                                   ("N", SIZE_LIMIT)])
def test_sizes_beyond_32_bit_indexing_are_refused(dim, v):
    """Sizes from 2^31 to 2^64 + 1 were accepted; the kernels take them as int."""
    sizes = {**dict(N=4096, K=4096, M=16), dim: v}
    with pytest.raises(planner.PlanError, match=rf"{dim}={v} is out of range \(allowed: "
                                                rf"1..{SIZE_LIMIT - 1}: .*32-bit int\)"):
        planner.check_shape(spec("gptq_v2_w4a16_g128"), **sizes)


def test_the_largest_sizes_pass():
    s = spec("gptq_v2_w4a16_g128")
    K = SIZE_LIMIT - 128                   # a multiple of 32 and of the group
    planner.check_shape(s, 8, K, M=SIZE_LIMIT - 1)
    assert (8 * K // 128) < INDEX_LIMIT


@pytest.mark.parametrize("v", [0, -8])
def test_sizes_are_positive(v):
    with pytest.raises(planner.PlanError, match=f"N={v} must be positive"):
        planner.check_shape(spec("gptq_v2_w4a16_g128"), v, 4096)


def test_the_scale_table_must_fit_a_32_bit_index():
    """decode.cuh.j2's scale_index, (k / group) * N + n, is an int."""
    s = spec("gptq_v2_w4a16_g128")
    assert planner.config.shape_problems(s, N=2 ** 20, K=2 ** 19) == [
        ("K", "N * K / group = 4294967296 scales is too many for the kernels' 32-bit index "
              f"(allowed: below {INDEX_LIMIT})")]
    planner.check_shape(s, 2 ** 16, 2 ** 19)


def test_problems_name_their_dimension_and_skip_unknown_sizes():
    awq = spec("awq_w4a16_g128")
    assert [d for d, _ in planner.config.shape_problems(awq, N=4104)] == ["N"]
    assert [d for d, _ in planner.config.shape_problems(awq, K=100)] == ["K", "K"]   # 32, group
    assert planner.config.shape_problems(awq) == []


def test_quantize_k_is_a_positive_multiple_of_8():
    q = spec("quantize_int8_row")
    for K in (0, -8, 12):
        with pytest.raises(planner.PlanError, match=f"K={K} must be a positive multiple of 8"):
            planner.check_shape(q, K=K)
    planner.check_shape(q, K=8)
    with pytest.raises(planner.PlanError, match="out of range"):
        planner.check_shape(q, K=2 ** 31)
