"""planner/gemv.py: the SIMT GEMVs (row and column) and the tensor-core one."""
import dataclasses

import numpy as np
import pytest

from opgen.codegen import planner
from opgen.codegen.lower import decode_plan, numerics, weight_layout
from opgen.codegen.resolve import load_spec, shipped_specs


def spec(name):
    return load_spec(shipped_specs()[name])


def test_byte_pairs_for_4_bit_codebooks():
    """NF4 and MXFP4 GEMVs pair the two nibbles of each byte (one lookup in a
    table of value pairs); the pair is the byte's low then high nibble, which
    NF4 stores as elements k + 1, k and MXFP4 as k, k + 1."""
    for name, first in (("bnb_nf4", 1), ("mxfp4", 0)):
        s = spec(name)
        g = planner.geometry(s, planner.Config("gemv", vbytes=16, mmax=1, warps=8, cols=4), "sm_90")
        assert g["dec"].method == "pair_table"
        v = g["vec"]
        assert all(p.step == 4 and p.shift % 8 == 0 for p in v.pairs)
        p0 = v.pairs[0]
        assert (v.dk[p0.ia], v.dk[p0.ib]) == (first, 1 - first)
    # the GEMMs keep the per-code table; other formats their decode
    nf4 = spec("bnb_nf4")
    assert decode_plan(weight_layout(nf4), numerics(nf4)).method == "table"
    g = planner.geometry(spec("w4a16_sym_g128"), planner.Config("gemv", vbytes=16, mmax=1), "sm_90")
    assert g["dec"].method == "magic" and g["vec"].pairs[0].step == 16


def test_row_gemv_shared_memory_and_columns():
    s = spec("w2a16_g128")
    cfg = planner.Config("gemv", warps=8, vbytes=16, split_k=1, mmax=1, cols=4)
    g = planner.geometry(s, cfg, "sm_90")
    assert g["scheme"] == "row"
    assert planner.launch_smem(g, cfg, 8192) == 8192 * 2          # one row of fp16 activations
    assert planner.launch_smem(g, cfg, 8032) == 126 * 128     # 16064 bytes: whole 128-byte lines
    assert planner.grid(s, cfg, 1, 8192) == (8192 // 32, 1, 1)
    # too many staged rows for the cap: needs split-K
    big = planner.Config("gemv", warps=8, vbytes=4, split_k=1, mmax=8, cols=1)
    assert not planner.shape_ok(planner.geometry(s, big, "sm_90"), big, 8192, 8192)
    # columns per warp are a row-GEMV notion
    with pytest.raises(planner.PlanError, match="row GEMV"):
        planner.geometry(spec("gptq_v2_w4a16_g128"), planner.Config("gemv", cols=2, mmax=1), "sm_90")


def test_tensor_core_gemv_rules():
    s = spec("w4a16_sym_g128")
    cfg = planner.Config("gemv", warps=8, vbytes=16, split_k=1, mmax=4, tc=True)
    g = planner.geometry(s, cfg, "sm_90")
    assert cfg.name.endswith("_tc") and planner.grid(s, cfg, 3, 8192) == (8192 // 128, 1, 1)
    assert planner.shape_ok(g, cfg, 8192, 8192)          # k-blocks of 4 x 32 weights
    assert not planner.shape_ok(g, cfg, 8192, 8192 + 32)
    # a quad's 4 vectors (4 x 64 2-bit weights) would span two scale groups
    with pytest.raises(planner.PlanError, match="one scale group"):
        planner.geometry(spec("w2a16_g128"), planner.Config("gemv", vbytes=16, mmax=1, tc=True), "sm_90")
    with pytest.raises(planner.PlanError, match="weights stored"):
        planner.geometry(spec("gptq_v2_w4a16_g128"), planner.Config("gemv", mmax=1, tc=True), "sm_90")
    # 9-16 rows: two m-tiles; staged rows of 16 x 8192 fp16 need split-K 4
    cfg16 = planner.Config("gemv", warps=8, vbytes=16, split_k=4, mmax=16, tc=True)
    assert planner.shape_ok(planner.geometry(s, cfg16, "sm_90"), cfg16, 8192, 8192)
    half = dataclasses.replace(cfg16, split_k=2)
    assert not planner.shape_ok(planner.geometry(s, half, "sm_90"), half, 8192, 8192)
    with pytest.raises(planner.PlanError, match="at most 16 rows"):
        planner.geometry(s, planner.Config("gemv", mmax=32, tc=True), "sm_90")
    # the heuristic takes it from M = 2 to 16 (measured faster at M = 4), not
    # at M = 1, nor at 9-16 where w4a16_sym's rs GEMM fills the SMs (planner.heuristic.rs_from_m9)
    assert not planner.heuristic(s, "sm_90", 1, 8192, 8192).tc
    for M, N in ((2, 8192), (4, 8192), (8, 8192), (16, 4096)):
        pick = planner.heuristic(s, "sm_90", M, N, 8192)
        assert pick.tc and pick.mmax >= M and planner.blocks(s, pick, M, N) >= 15 * 132 // 8


def test_8_bit_activations_on_the_gemvs():
    """int8 activations with integer codes on the SIMT row GEMV: the int8
    GEMV (gemv.int_dot) in the spec's own numerics (int8 products, a_scale
    in the epilogue), an int32 output too; e4m3 activations, and int8 ones
    on the tensor-core GEMV, staged as fp16 values (codes x a_scale[m],
    weights decoded to fp16, no a_scale in the epilogue); the GEMMs keep the
    spec's 8-bit numerics."""
    cfg = planner.Config("gemv", vbytes=16, mmax=1, warps=4)
    tc = planner.Config("gemv", vbytes=16, mmax=1, warps=4, tc=True)
    for name in ("w8a8_int8", "w4a8_int8_g128", "bitnet_b158_a8", "int8_int4_int32"):
        s = planner.execution_spec(spec(name), "sm_90")
        num = planner.kernel_numerics(s, cfg, "sm_90")
        assert num == numerics(s) and not num.a_staged_scale
        assert planner.plan(s, cfg, "sm_90").kind == "gemv_int8"
    for name in ("w8a8_int8", "w4a8_int8_g128", "w4a8_fp8", "fp8_e4m3_w8a8"):
        s = planner.execution_spec(spec(name), "sm_90")
        staged = [tc] if spec(name).a.dtype == "int8" else [cfg, tc]
        for c in staged:
            num = planner.kernel_numerics(s, c, "sm_90")
            assert num.a_staged_scale and not num.a_row_scale and num.mma == "float16" and not num.widen
        if spec(name).a.dtype != "int8":
            assert planner.plan(s, cfg, "sm_90").kind == "gemv_row"
        gemm = planner.kernel_numerics(s, planner.Config("gemm", 64, 128, 64, 32, 64, 3), "sm_90")
        assert gemm == numerics(s) and gemm.a_row_scale and not gemm.a_staged_scale
    # an int32 output: the int8 GEMV alone, one k-slice (its sums stay exact)
    exact = planner.execution_spec(spec("int8_int4_int32"), "sm_90")
    assert planner.geometry(exact, cfg, "sm_90")["int_dot"]
    with pytest.raises(planner.PlanError, match="split_k 1"):
        planner.geometry(exact, dataclasses.replace(cfg, split_k=2), "sm_90")
    with pytest.raises(planner.PlanError, match="int32"):
        planner.geometry(exact, tc, "sm_90")
    # weights stored [K, N] (the column GEMV) are not staged: refused
    kn = dataclasses.replace(spec("w8a8_int8"), b=dataclasses.replace(spec("w8a8_int8").b, layout="tn"))
    with pytest.raises(planner.PlanError, match="row GEMVs"):
        planner.geometry(kn, planner.Config("gemv", vbytes=16, mmax=1), "sm_90")


@pytest.mark.parametrize("vbytes", [4, 16])
@pytest.mark.parametrize("name", ["w4a8_int8", "w4a8_int8_g128", "bitnet_b158_a8", "int8_int4_int32"])
def test_int8_gemv_lanes_give_the_dot_product(name, vbytes):
    """The int8 GEMV's arithmetic (gemv_int8.cu.j2 dot_vector and the zero
    term), emulated on random vectors with the geometry's lane masks, sign
    flips and code bias: per lane j of word i the dp4a of the masked bytes
    (2^(j bits) high) with activation word i x LANES + j, shifted down, less
    (zero point + zero_bias) x the vector's activation sum, is the exact
    dot product of the codes' values less the zero point (constant, or a
    random integer one) and the activations."""
    s = planner.execution_spec(spec(name), "sm_90")
    lay, num = weight_layout(s), numerics(s)
    g = planner.geometry(s, planner.Config("gemv", vbytes=vbytes, mmax=1), "sm_90")
    words, P, mask = vbytes // 4, lay.P, 2 ** lay.bits - 1
    assert g["act_sums"] == (g["zero_bias"] != 0 or num.zero_kind == "int")
    rng = np.random.default_rng(7)
    lo, hi = {"uint": (0, mask), "int": (-2 ** (lay.bits - 1), 2 ** (lay.bits - 1) - 1),
              "ternary": (-1, 1)}[num.code_kind]
    for _ in range(100):
        vals = rng.integers(lo, hi + 1, words * P)          # element e of the vector, along k
        acts = rng.integers(-128, 128, words * P)
        zero = int(rng.integers(0, mask + 1)) if num.zero_kind == "int" else (
            num.zero_value if num.zero_kind == "const" else 0)
        stored = (vals + (1 if num.code_kind == "ternary" else 0)) & mask   # ternary keeps value + 1
        d = 0
        for i in range(words):
            word = 0
            for field, e in enumerate(lay.order):           # field f of word i holds element order[f]
                word |= int(stored[i * P + e]) << (field * lay.bits)
            for j in range(g["lanes"]):
                x = word & int(g["lane_masks"][j], 16)
                if g["lane_flips"]:
                    x ^= int(g["lane_flips"][j], 16)
                act = acts[(i * g["lanes"] + j) * 4:(i * g["lanes"] + j) * 4 + 4]
                p = sum(((x >> 8 * b) & 0xFF) * int(act[b]) for b in range(4))   # dp4a.u32.s32
                assert p % 2 ** (j * lay.bits) == 0
                d += p >> (j * lay.bits)
        zc = (zero if num.zero_kind == "int" else 0) + g["zero_bias"]
        d -= zc * int(acts.sum())
        assert d == int(((vals - zero) * acts).sum())
