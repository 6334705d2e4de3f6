"""planner/rs.py: the rs GEMM (decoded weights as wgmma's register operand)."""
import dataclasses

import pytest

from opgen.codegen import planner
from opgen.codegen.resolve import load_spec, shipped_specs

MATMUL = [n for n, p in sorted(shipped_specs().items()) if load_spec(p).op == "matmul"]


def spec(name):
    return load_spec(shipped_specs()[name])


def test_rs_gemm_rules():
    """The rs GEMM (decoded weights as wgmma's register operand) takes
    4-bit codes stored [N, K] whose pack order puts pair q of a word at bits
    4q and 16 + 4q (w4a16_sym), refuses the rest with the reason, splits k
    between k-groups only, and stays inside ptxas's register cap."""
    c = planner.Config("gemm", 64, 64, 64, 64, 64, 8, 1, wgmma=True, tma=True, rs=True, kgroups=2)
    g = planner.geometry(spec("w4a16_sym_g128"), c, "sm_90")
    assert g["rs"] and g["threads"] == 2 * 128 + 32 and g["b_rowb"] == 32 and g["stored"]
    # 64-deep tiles in pairs of one scale group, where each slot keeps one k-group
    tpg = lambda **kw: planner.geometry(spec("w4a16_sym_g128"), dataclasses.replace(c, **kw), "sm_90")["tpg"]  # noqa: E731
    assert (tpg(), tpg(stages=6), tpg(stages=6, kgroups=1), tpg(BK=128)) == (2, 1, 2, 1)
    assert c.name == "gemm_64x64x64_w64x64_p8_s1_wg_tma_rs2"
    for name, why in (("gptq_v2_w4a16_g128", r"stored \[N, K\]"), ("bnb_nf4", "pack order"),
                      ("w2a16_g128", "4-bit"), ("fp16", "4-bit")):
        with pytest.raises(planner.PlanError, match=why):
            planner.geometry(spec(name), c, "sm_90")
    with pytest.raises(planner.PlanError, match="sm_90a"):
        planner.geometry(spec("w4a16_sym_g128"), c, "sm_80")
    for bad, why in ((dict(split_k=2), "split_k 1"), (dict(kgroups=3), "k-groups"),
                     (dict(BN=128, kgroups=4), "threads per block"), (dict(stages=6, kgroups=4), "split evenly"),
                     (dict(BK=32), "BK in"), (dict(BM=256, WN=256, BN=128, kgroups=2, stages=4), "registers")):
        with pytest.raises(planner.PlanError, match=why):
            planner.geometry(spec("w4a16_sym_g128"), dataclasses.replace(c, **bad), "sm_90")
    cands = [c for c in planner.candidates(spec("w4a16_sym_g128"), "sm_90", 64, 8192, 8192) if c.rs]
    assert {c.kgroups for c in cands} == {1, 2, 4} and {c.BM for c in cands} >= {16, 32, 64, 128}
    rs_specs = ("w4a16_sym_g128", "gptq_v1_w4a16_g128_repacked", "gptq_v2_w4a16_g128_repacked")
    assert not any(c.rs for n in MATMUL if n not in rs_specs
                   for c in planner.candidates(spec(n), "sm_90", 64, 8192, 8192))
    # integer zero points: the subtract of 1024 + z must stay an integer add
    # on the fp16 bits (unsigned 4-bit codes: 1024 .. 1039), signed ones
    # (1016 .. 1031) cross a binade
    gq = spec("gptq_v2_w4a16_g128_repacked")
    g = planner.geometry(gq, c, "sm_90")
    assert g["rs"] and g["regs"] is None
    signed = dataclasses.replace(gq, b=dataclasses.replace(gq.b, zero=dataclasses.replace(gq.b.zero, dtype="int4")))
    with pytest.raises(planner.PlanError, match="integer add"):
        planner.geometry(signed, c, "sm_90")
    # its own register table: four 128-deep k-groups of 32 rows do not fit
    with pytest.raises(planner.PlanError, match="registers"):
        planner.geometry(gq, dataclasses.replace(c, BM=32, WN=32, BK=128, kgroups=4), "sm_90")
