"""Execution layouts (codegen/planner/execution.py): how the kernels want a
spec's weight stored. For every shipped spec and for specs drawn from the
whole language: the execution spec holds the same weight (a transcode
target), is a valid spec, is its own execution spec, and fits the shapes
it is asked for; the formats stored otherwise land where the rs GEMM
and the row GEMV read them."""
from __future__ import annotations

import dataclasses

from pathlib import Path

import pytest
from hypothesis import given, settings

from opgen.codegen import planner
from opgen.codegen.canonical import spec_to_yaml_dict
from opgen.codegen.errors import SpecErrors
from opgen.codegen.lower import rs_pairs, weight_layout
from opgen.codegen.planner.execution import (EXECUTION_SUFFIX, LAYOUTS, execution_spec, held_name, interleaved,
                                             with_execution_specs)
from opgen.codegen.resolve import as_spec, shipped_specs
from opgen.codegen.spec import Activation, Output, Pack, Spec
from opgen.codegen.transcode import check_compatible
from opgen.codegen.validate import spec_from_dict
from weight_strategies import SETTINGS, weights

MATMULS = [n for n in shipped_specs() if as_spec(n).op == "matmul"]


def test_interleaved_pairs_neighbours():
    assert interleaved(8) == (0, 2, 4, 6, 1, 3, 5, 7)
    assert interleaved(2) == (0, 1)
    assert interleaved(16)[:3] == (0, 2, 4) and interleaved(16)[8:11] == (1, 3, 5)


def _valid(s: Spec) -> bool:
    d = spec_to_yaml_dict(s)
    try:
        return spec_to_yaml_dict(spec_from_dict(d)) == d
    except SpecErrors:
        return False


def _is_execution_spec_of(e: Spec, s: Spec, arch: str) -> None:
    check_compatible(s, e)                                # the same weight
    assert _valid(e) or not _valid(s)                     # the validator accepts it as it does s
    assert execution_spec(e, arch) is e                   # settled
    assert (e.a, e.out, e.epilogue, e.accumulate, e.shape) == (s.a, s.out, s.epilogue, s.accumulate, s.shape)
    assert e is s or e.name == s.name + EXECUTION_SUFFIX


@pytest.mark.parametrize("arch", sorted(LAYOUTS))
@pytest.mark.parametrize("name", MATMULS)
def test_every_shipped_spec(name, arch):
    s = as_spec(name)
    e = execution_spec(s, arch)
    _is_execution_spec_of(e, s, arch)
    planner.check_shape(e, 4096, 4096)
    assert e.b.layout == "nt" and (e.b.pack is None or e.b.pack.axis == "k")


@pytest.mark.parametrize("name", ["gptq_v1_w4a16_g128", "gptq_v2_w4a16_g128", "awq_w4a16_g128"])
def test_4_bit_formats_stored_otherwise_land_on_the_rs_gemm(name):
    s = as_spec(name)
    e = execution_spec(s, "sm_90")
    assert e.name == name + EXECUTION_SUFFIX
    assert e.b.pack == Pack("int32", "k", interleaved(8)) and e.b.layout == "nt"
    assert (e.b.scale, e.b.zero) == (s.b.scale, s.b.zero)           # kept as stored
    for M in (32, 64, 256):
        cfg = planner.heuristic(e, "sm_90", M, 8192, 8192, sms=132)
        assert planner.family_of(cfg).name == "rs", (M, cfg.name)


@pytest.mark.parametrize("name,P", [("w2a16_g128", 16), ("bitnet_b158", 16), ("w1a16_g128", 32)])
def test_2_and_1_bit_codes_stored_in_sequence_move_to_the_interleaved_order(name, P):
    """Each rs GEMM lane's pair in a word's two halves, as for 4-bit codes:
    decoded by one shift and lop3 (rs_pairs: gap 16), not joined first."""
    s = as_spec(name)
    e = execution_spec(s, "sm_90")
    assert e.name == name + EXECUTION_SUFFIX
    assert e.b.pack == Pack("int32", "k", interleaved(P)) and e.b.layout == "nt"
    assert (e.b.scale, e.b.zero) == (s.b.scale, s.b.zero)
    pairs = rs_pairs(weight_layout(e), 128)
    assert {p.gap for hs in pairs for p in hs} == {16}


@pytest.mark.parametrize("name", ["w4a16_sym_g128", "gptq_v2_w4a16_g128_repacked", "bnb_nf4", "mxfp4",
                                  "bitnet_b158_a8", "fp8_e4m3_w8a16", "w8a8_int8"])
def test_specs_already_stored_for_the_kernels_are_their_own(name):
    s = as_spec(name)
    assert execution_spec(s, "sm_90") is s


def test_the_specs_with_those_they_run_as():
    """Each spec by its name and its execution spec by its own (one name
    for one layout on every arch, else an error: DB keys carry no layout);
    held_name goes back to the spec the user holds."""
    specs = [as_spec("w2a16_g128"), as_spec("w4a16_sym_g128")]
    out = with_execution_specs(specs)
    assert list(out) == ["w2a16_g128", "w2a16_g128_exec", "w4a16_sym_g128"]
    assert out["w2a16_g128_exec"].content_hash() == execution_spec(specs[0], "sm_90").content_hash()
    assert [held_name(s) for s in out.values()] == ["w2a16_g128", "w2a16_g128", "w4a16_sym_g128"]
    other = dict(LAYOUTS)
    other["sm_80"] = dataclasses.replace(LAYOUTS["sm_80"], int_words=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("opgen.codegen.planner.execution.LAYOUTS", other)
        with pytest.raises(planner.PlanError, match="gptq_v2_w4a16_g128_exec: the execution spec differs"):
            with_execution_specs([as_spec("gptq_v2_w4a16_g128")])


def test_an_unknown_arch_is_refused():
    with pytest.raises(planner.PlanError, match="no execution layout for sm_70"):
        execution_spec(as_spec("awq_w4a16_g128"), "sm_70")


def test_other_ops_are_their_own():
    q = as_spec("quantize_int8_row")
    assert execution_spec(q, "sm_90") is q


@settings(**SETTINGS)
@given(weights())
def test_every_weight_the_language_has(wnk):
    w, N, K = wnk
    s = Spec("user", "matmul", Activation("float16"), w, Output())
    for arch in LAYOUTS:
        e = execution_spec(s, arch)
        _is_execution_spec_of(e, s, arch)
        # every size the stored form takes, the execution form takes
        if not planner.config.shape_problems(s, N, K):
            assert not planner.config.shape_problems(e, N, K), (N, K)
        if w.pack is not None and e is not s:
            assert e.b.pack.axis == "k" or w.scale is not None


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[3].joinpath("docs", "examples").glob("*.yaml")))
def test_user_specs_outside_the_shipped_ones_take_the_same_path(path):
    """docs/examples (the bench runs them beside the shipped specs): stored as
    their checkpoints store them, run in the rs GEMM's layout, picked by the
    heuristic from M = 17 as the shipped 4-bit formats are."""
    s = as_spec(str(path))
    e = execution_spec(s, "sm_90")
    _is_execution_spec_of(e, s, "sm_90")
    assert e is not s and e.b.pack == Pack("int32", "k", interleaved(8))
    for M in (32, 256):
        assert planner.family_of(planner.heuristic(e, "sm_90", M, 8192, 8192)).name == "rs"


def test_a_group_smaller_than_a_vector_keeps_the_stored_form():
    """44 2-bit codes per group: every 4+-byte vector along k would straddle
    groups, so codes stored along n stay there, where a kernel reads them
    (a review found opgen.load refusing this shape in the execution layout)."""
    d = spec_to_yaml_dict(as_spec("w2a16_g128"))
    d["b"].update(dtype="codebook", bits=2, codebook=[-1.0, -0.25, 0.25, 1.0], layout="nn",
                  pack={"axis": "n", "container": "uint8", "order": [0, 1, 2, 3]},
                  zero={"kind": "none"})
    d["b"]["scale"]["group"] = 44
    spec = spec_from_dict(d)
    assert execution_spec(spec, "sm_90") is spec
    assert planner.candidates(spec, "sm_90", 1, 256, 352)
    d["b"]["scale"]["group"] = 48                      # three 4-byte vectors: moved to k
    assert execution_spec(spec_from_dict(d), "sm_90").b.pack.axis == "k"
