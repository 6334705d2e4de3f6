"""planner/rs.py: the rs GEMM (decoded weights as wgmma's register operand)."""
import dataclasses

import pytest

from opgen.codegen import hw, planner
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
    for name, why in (("gptq_v2_w4a16_g128", r"stored \[N, K\] packed along k"), ("fp16", "dense"),
                      ("w8a8_int8", "dense")):
        with pytest.raises(planner.PlanError, match=why):
            planner.geometry(spec(name), c, "sm_90")
    # 1-bit codes: a 64-deep tile is 8 bytes a row
    w1 = spec("w1a16_g128")
    w1 = dataclasses.replace(w1, b=dataclasses.replace(w1.b, zero=dataclasses.replace(w1.b.zero, kind="none", dtype=None),
                                                       formula="(q - z) * s"))
    with pytest.raises(planner.PlanError, match="8 bytes a row"):
        planner.geometry(w1, c, "sm_90")
    # float zero points and q * s - z (w1a16), 128-deep tiles
    assert planner.geometry(spec("w1a16_g128"), dataclasses.replace(c, BK=128), "sm_90")["rs"]
    # 1-bit codes' 256-row tiles: 64 KiB of activations a stage, so a 3-deep
    # ring (no 4-deep one fits); 3 stages nowhere a 4-deep ring fits
    tall = dataclasses.replace(c, BM=256, WN=256, BK=128, kgroups=1, stages=3)
    w1x = planner.execution_spec(spec("w1a16_g128"), "sm_90")
    assert planner.geometry(w1x, tall, "sm_90")["smem"] > 3 * 64 * 1024
    with pytest.raises(planner.PlanError, match="shared memory"):
        planner.geometry(w1x, dataclasses.replace(tall, stages=4), "sm_90")
    with pytest.raises(planner.PlanError, match="shallower than 4"):
        planner.geometry(w1x, dataclasses.replace(tall, BM=128, WN=128), "sm_90")
    w1_tall = {(x.BN, x.stages) for x in planner.candidates(w1x, "sm_90", 1024, 8192, 8192) if x.rs and x.BM == 256}
    assert w1_tall == {(64, 3), (128, 3)}
    with pytest.raises(planner.PlanError, match="sm_90a"):
        planner.geometry(spec("w4a16_sym_g128"), c, "sm_80")
    for bad, why in ((dict(split_k=2), "split_k 1"), (dict(kgroups=3), "k-groups"),
                     (dict(BN=128, kgroups=4), "threads per block"), (dict(stages=6, kgroups=4), "split evenly"),
                     (dict(BK=32), "BK in"), (dict(BM=256, WN=256, BN=128, kgroups=2, stages=4), "registers")):
        with pytest.raises(planner.PlanError, match=why):
            planner.geometry(spec("w4a16_sym_g128"), dataclasses.replace(c, **bad), "sm_90")
    cands = [c for c in planner.candidates(spec("w4a16_sym_g128"), "sm_90", 64, 8192, 8192) if c.rs]
    assert {c.kgroups for c in cands} == {1, 2, 4} and {c.BM for c in cands} >= {16, 32, 64, 128}
    # which shipped specs have an rs GEMM (as stored: GPTQ and AWQ only in
    # their execution layouts), and which decoding each runs
    have = {n: planner.rs.kernel_class(spec(n), "sm_90") for n in MATMUL
            if any(c.rs for c in planner.candidates(spec(n), "sm_90", 64, 8192, 8192))}
    assert {n: k.rsplit("/", 1)[0] for n, k in have.items()} == {
        "w4a16_sym_g128": "magic/halves", "gptq_v1_w4a16_g128_repacked": "magic_int_zero/halves",
        "gptq_v2_w4a16_g128_repacked": "magic_int_zero/halves", "w2a16_g128": "magic/pairs",
        "bitnet_b158": "magic_cvt_scale/pairs", "bnb_nf4": "table_cvt_scale/pairs",
        "w1a16_g128": "magic_float_zero_minus_z/pairs", "fp8_e4m3_w8a16": "e4m3_cvt_scale/pairs",
        "mxfp4": "fp4_cvt_scale/pairs", "w4a8_int8": "widen/bytes", "bitnet_b158_a8": "widen/bytes",
        "int8_int4_int32": "widen/bytes", "w4a8_int8_g128": "widen_int_zero_group/bytes",
        "w4a8_fp8": "widen_e4m3_group/bytes"}
    # in their execution layouts each lane's pair is in a word's halves
    exec_kind = {n: planner.rs.kernel_class(planner.execution_spec(spec(n), "sm_90"), "sm_90").rsplit("/", 1)[0]
                 for n in ("w2a16_g128", "bitnet_b158", "w1a16_g128", "gptq_v2_w4a16_g128", "awq_w4a16_g128")}
    assert exec_kind == {"w2a16_g128": "magic/halves", "bitnet_b158": "magic_cvt_scale/halves",
                         "w1a16_g128": "magic_float_zero_minus_z/halves",
                         "gptq_v2_w4a16_g128": "magic_int_zero/halves", "awq_w4a16_g128": "magic_int_zero/halves"}
    # scale groups shorter than a k-tile: several scales a row and tile
    # (MXFP4's 32), but not in the 4-bit interleaved kernels run on the device
    assert planner.geometry(spec("mxfp4"), dataclasses.replace(c, BK=128), "sm_90")["spt"] == 4
    sym = spec("w4a16_sym_g128")
    g64 = dataclasses.replace(sym, b=dataclasses.replace(sym.b, scale=dataclasses.replace(sym.b.scale, group=64)))
    with pytest.raises(planner.PlanError, match="scale groups of 64 split a 128-deep k-tile"):
        planner.geometry(g64, dataclasses.replace(c, BK=128), "sm_90")
    assert {k.rsplit("/", 1)[1] for k in have.values()} == {"float16", "int8", "float8_e4m3"}
    # bfloat16 activations: the same decoding, not yet run on the device
    bf = spec("w4a16_sym_g128")
    bf = dataclasses.replace(bf, a=dataclasses.replace(bf.a, dtype="bfloat16"),
                             b=dataclasses.replace(bf.b, scale=dataclasses.replace(bf.b.scale, dtype="bfloat16")))
    assert planner.rs.kernel_class(bf, "sm_90") == "magic/halves/bfloat16"
    assert planner.family_of(planner.heuristic(bf, "sm_90", 64, 8192, 8192)).name != "rs"
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


def test_widened_codes_for_int8_activations():
    """Sub-byte integer codes with 8-bit activations: the rs GEMM widens them
    into the int8 (e4m3) wgmma's fragment registers (k32 steps, s32 sums;
    e4m3's fp32 sums flushed every k-tile), in 128-deep k-tiles of
    byte-lanes words; group scales flushed per group, integer zero points,
    an int32 output; groups that split a k-tile refused with the reason. Both kernels were checked on
    the device (rs_verified: the heuristic's picks, test_heuristic)."""
    c = planner.Config("gemm", 64, 128, 128, 64, 64, 4, 1, wgmma=True, tma=True, rs=True)
    g = planner.geometry(spec("w4a8_int8"), c, "sm_90")
    assert g["widen"] and g["acc_int"] and not g["flush"] and g["kernel"] == "widen/bytes"
    assert (g["a_tile"], g["b_rowb"], g["wgmma_k"], g["wgmma_types"]) == (64 * 128, 64, 32, "s32.s8.s8")
    assert planner.geometry(spec("bitnet_b158_a8"), c, "sm_90")["b_rowb"] == 32       # 2-bit codes
    assert planner.geometry(spec("int8_int4_int32"), c, "sm_90")["widen"]             # the raw int32 sums
    g = planner.geometry(spec("w4a8_int8_g128"), c, "sm_90")
    assert g["flush"] and g["kernel"] == "widen_int_zero_group/bytes" and g["tpg"] == 1
    # e4m3 activations: the fp8 wgmma's fp32 sums flushed every k-tile, with its group scale
    g = planner.geometry(spec("w4a8_fp8"), c, "sm_90")
    assert g["flush"] and g["flush_scaled"] and not g["acc_int"] and g["wgmma_types"] == "f32.e4m3.e4m3"
    fp8 = spec("w4a8_fp8")
    fp8_256 = dataclasses.replace(fp8, b=dataclasses.replace(fp8.b, scale=dataclasses.replace(fp8.b.scale, group=256)))
    with pytest.raises(planner.PlanError, match="flushed every k-tile"):
        planner.geometry(fp8_256, c, "sm_90")
    for name, bad, why in (("w4a8_int8", dict(BK=64), "128-deep"),
                           ("w4a8_int8_g128", dict(BM=256, WN=256), "no measured register need"),
                           ("w4a8_int8", dict(stages=6, kgroups=4, BN=64), "split evenly")):
        with pytest.raises(planner.PlanError, match=why):
            planner.geometry(spec(name), dataclasses.replace(c, **bad), "sm_90")
    g128 = spec("w4a8_int8_g128")
    scale = lambda group: dataclasses.replace(g128, b=dataclasses.replace(  # noqa: E731
        g128.b, scale=dataclasses.replace(g128.b.scale, group=group)))
    with pytest.raises(planner.PlanError, match="whole k-tiles per group"):
        planner.geometry(scale(64), c, "sm_90")
    # a group of two k-tiles is one k-group's: the ring must hold whole groups for each
    assert planner.geometry(scale(256), dataclasses.replace(c, kgroups=2, BN=64), "sm_90")["tpg"] == 2
    with pytest.raises(planner.PlanError, match="whole 2-tile scale groups"):
        planner.geometry(scale(256), dataclasses.replace(c, kgroups=2, BN=64, stages=6), "sm_90")
    assert {"widen/bytes/int8", "widen_int_zero_group/bytes/int8"} <= hw.H200.rs_verified


def _bf16(s):
    """s with bfloat16 activations and output."""
    return dataclasses.replace(s, name=s.name + "_bf16", a=dataclasses.replace(s.a, dtype="bfloat16"),
                               out=dataclasses.replace(s.out, dtype="bfloat16"))


def test_pairs_of_other_layouts():
    """Layouts other than the interleaved 4-bit one: each lane's pair moved
    into a word's halves (lower.rs_pairs), the scales converted where they
    are not the activations' type; each ran on the device
    (hw.H200.rs_verified), so the heuristic picks them as the 4-bit ones;
    with bf16 activations not (not run there), the tuner times them."""
    c = planner.Config("gemm", 64, 64, 64, 64, 64, 8, 1, wgmma=True, tma=True, rs=True, kgroups=2)
    for name, words in (("w2a16_g128", 4), ("bitnet_b158", 4), ("bnb_nf4", 8)):
        g = planner.geometry(spec(name), c, "sm_90")
        assert not g["interleaved4"] and g["words"] == words and g["b_rowb"] == 4 * words
        assert planner.rs.kernel_class(spec(name), "sm_90") in hw.H200.rs_verified
        assert planner.family_of(planner.heuristic(spec(name), "sm_90", 64, 8192, 8192)).name == "rs"
        bf16 = _bf16(spec(name))
        assert planner.rs.kernel_class(bf16, "sm_90") not in hw.H200.rs_verified
        assert planner.family_of(planner.heuristic(bf16, "sm_90", 64, 8192, 8192)).name != "rs"
    nf4 = planner.geometry(spec("bnb_nf4"), c, "sm_90")["pairs"]
    # element 2j sits in the high nibble of byte j: lane q's pair at bits 8q + 4 and 8q
    assert (nf4[0][0].word, nf4[0][0].shift, nf4[0][0].step, nf4[0][0].gap) == (0, 4, 8, -4)
    assert planner.family_of(planner.heuristic(spec("w4a16_sym_g128"), "sm_90", 64, 8192, 8192)).name == "rs"


def test_scale_groups_shorter_than_a_tile_take_no_zero_points():
    """Several scales a row and k-tile, but one zero point a unit: a 2-bit
    spec with zero points in groups of 32 has no 64-deep rs GEMM."""
    c = planner.Config("gemm", 64, 64, 64, 64, 64, 8, 1, wgmma=True, tma=True, rs=True, kgroups=2)
    w2 = spec("w2a16_g128")
    w2 = dataclasses.replace(w2, b=dataclasses.replace(w2.b, scale=dataclasses.replace(w2.b.scale, group=32)))
    assert planner.geometry(w2, c, "sm_90")["spt"] == 2
    w2z = dataclasses.replace(w2, b=dataclasses.replace(w2.b, zero=spec("w1a16_g128").b.zero,
                                                        formula="q * s - z"))
    with pytest.raises(planner.PlanError, match="scale groups of 32 split a 64-deep k-tile"):
        planner.geometry(w2z, c, "sm_90")


def test_scale_words():
    """One-byte (e8m0) scales stored [N, K / group], several a row and
    k-tile (MXFP4's 2 or 4): one word a row, so the rs GEMM runs only where
    rows are whole words (K a multiple of the k-tile); a scale of another
    type or layout keeps one register a scale."""
    mx = spec("mxfp4")
    for BK, spt in ((64, 2), (128, 4)):
        c = planner.Config("gemm", 16, 64, BK, 64, 16, 8, 1, wgmma=True, tma=True, rs=True, kgroups=2,
                           pair_table=True)
        g = planner.geometry(mx, c, "sm_90")
        assert g["spt"] == spt and g["scale_words"]
        assert planner.shape_ok(g, c, 8192, 2176) and planner.shape_ok(g, c, 8192, 1152)
        assert planner.shape_ok(g, c, 8192, 1088) is (BK == 64)         # 17 x 64
    nf4 = planner.geometry(spec("bnb_nf4"), c, "sm_90")                 # float32, 2 a tile
    assert nf4["spt"] == 2 and not nf4["scale_words"]
    # candidates follow: no 128-deep rs GEMM for MXFP4 at K = 1088, 64-deep ones still
    deep = {x.BK for x in planner.candidates(mx, "sm_90", 16, 8192, 1088) if x.rs}
    assert deep == {64}
    assert {x.BK for x in planner.candidates(mx, "sm_90", 16, 8192, 1152) if x.rs} == {64, 128}


def test_pair_tables():
    """Config.pair_table: NF4 and MXFP4, whose lanes' pairs are bytes, look
    each byte's two values up at once (a 32 KiB table, static shared memory
    beside the ring); other codes and layouts are refused with the reason,
    and the flag without rs is no rs GEMM. Candidates for the tuner; the
    heuristic takes them only where hw.Calibration.rs_pair_tables lists the
    decoding (test_heuristic)."""
    c = planner.Config("gemm", 64, 64, 64, 64, 64, 8, 1, wgmma=True, tma=True, rs=True, kgroups=2,
                       pair_table=True)
    assert c.name == "gemm_64x64x64_w64x64_p8_s1_wg_tma_rs2_pt"
    for name, high_first in (("bnb_nf4", True), ("mxfp4", False)):
        g = planner.geometry(spec(name), c, "sm_90")
        assert g["dec"].method == "pair_table" and g["dec"].high_first is high_first
        kernel = "pair_table_cvt_scale/pairs" if name == "bnb_nf4" else "pair_table_fp4_cvt_scale/pairs"
        assert g["kernel"] == kernel
        assert planner.rs.kernel_class(spec(name), "sm_90", pair_table=True) == kernel + "/float16"
        assert g["smem"] == planner.geometry(spec(name), dataclasses.replace(c, pair_table=False), "sm_90")["smem"]
        cands = [x for x in planner.candidates(spec(name), "sm_90", 64, 8192, 8192) if x.rs]
        assert any(x.pair_table for x in cands) and any(not x.pair_table for x in cands)
    for name in ("w4a16_sym_g128", "w2a16_g128", "fp8_e4m3_w8a16", "bitnet_b158"):
        assert planner.rs.kernel_class(spec(name), "sm_90", pair_table=True) is None
        with pytest.raises(planner.PlanError, match="a pair table is for 4-bit codebook or e2m1 codes"):
            planner.geometry(spec(name), c, "sm_90")
        assert not any(x.pair_table for x in planner.candidates(spec(name), "sm_90", 64, 8192, 8192))
    for bad in (dict(rs=False), dict(rs=False, pair_table=False)):
        with pytest.raises(planner.PlanError, match="for rs configs"):
            planner.geometry(spec("bnb_nf4"), dataclasses.replace(c, **bad), "sm_90")
    # the table's 32 KiB count against the block's shared memory: a ring that
    # fits without it does not with it
    deep = dataclasses.replace(c, BM=128, WN=128, BN=64, BK=128, kgroups=1, stages=6, pair_table=False)
    mx = spec("mxfp4")
    assert planner.geometry(mx, deep, "sm_90")["smem"] + 32 * 1024 > hw.arch("sm_90").smem_per_block - 1024
    with pytest.raises(planner.PlanError, match="shared memory"):
        planner.geometry(mx, dataclasses.replace(deep, pair_table=True), "sm_90")
