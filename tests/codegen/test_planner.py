"""The tile planner and the lowering it stands on (CPU only)."""
import dataclasses

import pytest

from opgen.codegen import planner
from opgen.codegen.lower import vector, weight_layout
from opgen.codegen.validate import load_spec, shipped_specs

MATMUL = [n for n, p in sorted(shipped_specs().items()) if load_spec(p).op == "matmul"]


def spec(name):
    return load_spec(shipped_specs()[name])


@pytest.mark.parametrize("name", MATMUL)
def test_vector_covers_each_element_once(name):
    """Every code slot of a weight vector lands on a distinct element, and the
    elements fill the vector's logical extent."""
    s = spec(name)
    lay = weight_layout(s)
    for vb in (4, 8, 16):
        if vb % lay.elem_bytes:
            continue
        for byte_pairs in ((False, True) if lay.bits == 4 else (False,)):
            v = vector(lay, vb, byte_pairs)
            seen = sorted([p.ia for p in v.pairs] + [p.ib for p in v.pairs])
            assert seen == list(range(v.nrows * v.ncols))
            cells = set(zip(v.dn, v.dk))
            assert len(cells) == v.nrows * v.ncols == v.n_extent * v.k_extent


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
    from opgen.codegen.lower import decode_plan, numerics
    nf4 = spec("bnb_nf4")
    assert decode_plan(weight_layout(nf4), numerics(nf4)).method == "table"
    g = planner.geometry(spec("w4a16_sym_g128"), planner.Config("gemv", vbytes=16, mmax=1), "sm_90")
    assert g["dec"].method == "magic" and g["vec"].pairs[0].step == 16


@pytest.mark.parametrize("name", MATMUL)
@pytest.mark.parametrize("M", [1, 3, 8, 16, 100, 4096])
def test_candidates_and_heuristic(name, M):
    s = spec(name)
    cands = planner.candidates(s, "sm_90", M, 4096, 11008)
    assert cands and len(set(cands)) == len(cands)
    pick = planner.heuristic(s, "sm_90", M, 4096, 11008)
    assert pick in cands
    for c in cands:
        assert c.family == "gemm" or M <= c.mmax <= (16 if c.tc else 8)
        if c.family == "gemm":
            # wgmma tiles are 64 rows at least and tried from M = 9 on
            assert c.BM <= max(64 if c.wgmma else 16, 2 * M)
            assert not c.wgmma or M > 8
    if M > 16:
        assert pick.family == "gemm"
    elif M > 8:
        assert pick.family == "gemm" or pick.tc


@pytest.mark.parametrize("name", MATMUL)
def test_wgmma_only_where_it_runs(name):
    """wgmma configs on sm_90 for K-major weights (all but AWQ), never on sm_80,
    and 128-byte operand rows (the swapped GEMM: k-tiles of one or two)."""
    s = spec(name)
    # (predecode configs read the dense [N, K] twin: K-major for every spec)
    wg = [c for c in planner.candidates(s, "sm_90", 256, 4096, 4096) if c.wgmma and not c.predecode]
    assert bool(wg) == (name != "awq_w4a16_g128")
    for c in wg:
        g = planner.geometry(s, c, "sm_90")
        assert g["target"] == "sm_90a" and c.WM == 64 and c.BK * g["ce"] in ((128, 256) if c.rs else (128,))
    assert not any(c.wgmma for c in planner.candidates(s, "sm_80", 256, 4096, 4096))


def test_wgmma_refusals_name_the_reason():
    with pytest.raises(planner.PlanError, match="sm_90a"):
        planner.geometry(spec("w4a16_sym_g128"), planner.Config("gemm", 64, 128, 64, 64, 128, 4, 1, wgmma=True), "sm_80")
    with pytest.raises(planner.PlanError, match="K-major"):
        planner.geometry(spec("awq_w4a16_g128"), planner.Config("gemm", 64, 128, 64, 64, 128, 4, 1, wgmma=True), "sm_90")
    with pytest.raises(planner.PlanError, match="128-byte rows"):
        planner.geometry(spec("w8a8_int8"), planner.Config("gemm", 64, 128, 256, 64, 128, 4, 1, wgmma=True), "sm_90")


def test_tma_rules():
    """tma configs: weights stored [N, K] on sm_90a only, whole K per block,
    clusters only where two m-tiles can share the weight tile, and the grid
    rounded up to whole clusters."""
    tma = lambda **kw: planner.Config("gemm", 128, 256, kw.pop("BK", 64), 64, 256, 4, 1, wgmma=True, tma=True, **kw)
    g = planner.geometry(spec("fp16"), tma(cluster=2), "sm_90")
    assert g["tma"] and g["threads"] == 384 and g["consumers"] == 2 and g["regs"] == (40, 232)
    assert g["smem"] == 4 * (128 + 256) * 128 + 1024
    # AWQ packs along n (no K-major decode); decoded weights load their own tiles
    for name, cfg, why in (("awq_w4a16_g128", tma(), "packed along k"),
                           ("w4a16_sym_g128", tma(cluster=2), "cluster 1"),
                           ("w1a16_g128", tma(), r"16\+")):
        with pytest.raises(planner.PlanError, match=why):
            planner.geometry(spec(name), cfg, "sm_90")
    # decoded weights: the stored B words sit between A and B in each stage,
    # the producer warpgroup decodes them beside one MMA warpgroup
    g = planner.geometry(spec("w4a16_sym_g128"), dataclasses.replace(tma(), BM=64, BN=128, WN=128), "sm_90")
    assert not g["dense"] and g["consumers"] == 1 and g["b_rowb"] == 32 and g["raw_bytes"] == 128 * 32
    assert g["stage_bytes"] == (64 + 128) * 128 + 128 * 32 and g["regs"] is None
    # decoding groups: one warp each while a lane has <= 8 vectors / 256 weights a tile
    assert g["dec_warps"] == 1          # 128 rows x 2 vectors of 32 weights: 8 vectors a lane
    wide = planner.geometry(spec("w4a16_sym_g128"), dataclasses.replace(tma(), BM=64), "sm_90")
    assert wide["dec_warps"] == 2       # 256 rows: 16 vectors a lane in one warp
    g = planner.geometry(spec("w4a16_sym_g128"), tma(), "sm_90")
    assert g["consumers"] == 2 and g["regs"] == planner.TMA_DECODE_REGS == (96, 200)
    # GPTQ's [K / 8, N] words: a raw tile of BK / 8 rows of BN words
    g = planner.geometry(spec("gptq_v2_w4a16_g128"), tma(), "sm_90")
    assert (g["b_rows"], g["b_rowb"], g["raw_bytes"]) == (8, 256 * 4, 8 * 1024)
    assert g["stored"].storage(4096, 8192) == (1024, 4096 * 4)
    # split-K: decoded weights only (more blocks to decode), one block per cluster
    assert planner.geometry(spec("w4a16_sym_g128"), dataclasses.replace(tma(), split_k=4), "sm_90")["tma"]
    for name, cfg in (("fp16", tma()), ("w8a8_int8", tma(BK=128))):
        cfg = dataclasses.replace(cfg, split_k=2)
        with pytest.raises(planner.PlanError, match="split-K tma"):
            planner.geometry(spec(name), cfg, "sm_90")
    # setmaxnreg can only hand out what the launch allocated (else the MMA warps hang)
    for producer in (planner.TMA_PRODUCER_REGS, 96):
        consumer = planner._consumer_regs(producer)
        assert consumer % 8 == 0 and 24 <= producer < consumer <= 256
        assert 128 * producer + 256 * consumer <= planner.TMA_BLOCK_REGS == 384 * 168
    with pytest.raises(planner.PlanError, match="sm_90a"):
        planner.geometry(spec("fp16"), tma(), "sm_80")
    with pytest.raises(planner.PlanError, match="min_blocks 1"):
        planner.geometry(spec("fp16"), dataclasses.replace(tma(), min_blocks=2), "sm_90")
    with pytest.raises(planner.PlanError, match="tma configs"):
        planner.geometry(spec("fp16"), planner.Config("gemm", 128, 256, 64, 64, 256, 4, 1, wgmma=True, cluster=2), "sm_90")
    # gptq reaches the tma GEMM through predecode (its dense twin)
    assert planner.geometry(spec("gptq_v2_w4a16_g128"), tma(predecode=True), "sm_90")["tma"]
    assert planner.grid(spec("fp16"), tma(cluster=2), 300, 1000) == (4, 4, 1)
    assert planner.grid(spec("fp16"), tma(), 300, 1000) == (4, 3, 1)
    with pytest.raises(planner.PlanError, match="rasters are for tma"):
        planner.geometry(spec("fp16"), planner.Config("gemm", 128, 256, 64, 64, 256, 4, 1, wgmma=True, raster=8), "sm_90")
    for M in (64, 128, 129):
        cands = [c for c in planner.candidates(spec("w8a8_int8"), "sm_90", M, 4096, 4096) if c.tma]
        assert cands and all(c.cluster == 1 or M > c.BM for c in cands)
        assert all(not c.raster or M > c.BM * c.cluster for c in cands)
        assert any(c.cluster == 2 for c in cands) == (M > 64)


def test_heuristic_takes_tma_like_the_tuned_winners():
    """From M = 9 the heuristic picks the TMA GEMM for dense operands (and
    for predecode's dense half), with the run4 winners' tiles."""
    for name, M, want in (("w8a8_int8", 64, (64, 64, 0)), ("fp8_e4m3_w8a8", 256, (128, 128, 8)),
                          ("fp16", 4096, (128, 256, 8)), ("gptq_v2_w4a16_g128", 4096, (128, 256, 8))):
        c = planner.heuristic(spec(name), "sm_90", M, 8192, 8192)
        assert c.tma and (c.BM, c.BN, c.raster) == want, c.name
    assert not planner.heuristic(spec("w8a8_int8"), "sm_80", 64, 8192, 8192).tma


def test_heuristic_takes_tall_tiles_for_decoded_weights():
    """Decoded weights on wgmma above M = 64: 128-row tiles despite padding
    (each m-tile decodes the weights again), 256 wide once they fill most of a
    wave, as the run6 winners of the 129-256 bucket had them."""
    for name, M, N, want in (("mxfp4", 256, 8192, (128, 128)),
                             ("bnb_nf4", 192, 6144, (128, 128)),
                             ("bnb_nf4", 256, 28672, (128, 256)),
                             ("mxfp4", 256, 14336, (128, 256))):
        c = planner.heuristic(spec(name), "sm_90", M, N, 8192)
        assert c.wgmma and not c.predecode and (c.BM, c.BN) == want, c.name
    # dense operands keep the TMA rule, M <= 64 the least padding
    assert planner.heuristic(spec("gptq_v2_w4a16_g128"), "sm_90", 48, 6144, 6144).BM == 64


def test_swapped_gemm_rules():
    """The swapped GEMM (decoded weights as wgmma's register operand) takes
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


def test_heuristic_takes_the_swapped_gemm_above_16_rows():
    """w4a16_sym from M = 17 to the predecode threshold: the swapped GEMM as
    its run12 winners had it (64 weight rows, two k-groups; 128-deep k-tiles
    up to 128 rows, then a 256-row m-tile with a producer warpgroup), and
    past 256 rows as run14's."""
    s = spec("w4a16_sym_g128")
    for M, want in ((17, (32, 128, 8)), (64, (64, 128, 8)), (100, (128, 128, 6)), (256, (256, 64, 6))):
        c = planner.heuristic(s, "sm_90", M, 8192, 8192)
        assert c.rs and c.BN == 64 and c.kgroups == 2 and (c.BM, c.BK, c.stages) == want, (M, c.name)
    assert planner.geometry(s, planner.heuristic(s, "sm_90", 256, 8192, 8192), "sm_90")["regs"] == (40, 232)
    assert planner.heuristic(s, "sm_90", 16, 8192, 8192).tc
    assert not planner.heuristic(s, "sm_80", 64, 8192, 8192).rs
    # past 256 rows (run14): 128 weight rows, one k-group, until predecode
    c = planner.heuristic(s, "sm_90", 1024, 8192, 8192)
    assert c.rs and (c.BM, c.BN, c.BK, c.kgroups, c.stages) == (256, 128, 64, 1, 4), c.name
    assert planner.heuristic(s, "sm_90", 2048, 8192, 8192).predecode


def test_config_round_trip_and_names():
    cfgs = planner.all_configs()
    assert len({c.name for c in cfgs}) == len(cfgs)
    for c in cfgs[:50]:
        assert planner.Config.from_dict(c.to_dict()) == c


def test_geometry_refusals_name_the_reason():
    s = spec("w8a8_int8")
    with pytest.raises(planner.PlanError, match="multiple of 128"):
        planner.geometry(s, planner.Config("gemm", 16, 128, 64, 16, 32, 4, 1), "sm_90")
    with pytest.raises(planner.PlanError, match="float16/bfloat16 activations"):
        planner.geometry(s, planner.Config("gemv"), "sm_90")
    # no e4m3 mma before sm_89: fp8 activations are widened to fp16 (BK of 64 halves)
    g = planner.geometry(spec("fp8_e4m3_w8a8"), planner.Config("gemm", 16, 128, 64, 16, 32, 4, 1), "sm_80")
    assert g["a_decode"] and not g["dense"]
    with pytest.raises(planner.PlanError, match="GEMV family"):
        planner.geometry(spec("fp8_e4m3_w8a8"), planner.Config("gemv"), "sm_80")
    with pytest.raises(planner.PlanError, match="shared memory"):
        planner.geometry(spec("fp16"), planner.Config("gemm", 128, 128, 64, 64, 32, 16, 1), "sm_86")


def test_fixed_shape_in_spec_is_enforced():
    from dataclasses import replace
    from opgen.codegen.spec import Shape
    s = replace(spec("w4a16_sym_g128"), shape=Shape(None, 4096, 4096))
    with pytest.raises(planner.PlanError, match="spec fixes N=4096"):
        planner.check_shape(s, 8192, 4096)


def test_nn_weights_need_16_byte_rows():
    # AWQ [K, N / 8] int32: 24 columns are 12-byte rows (a misaligned cp.async on the GPU).
    with pytest.raises(planner.PlanError, match="multiple of 32"):
        planner.check_shape(spec("awq_w4a16_g128"), 24, 1024)
    planner.check_shape(spec("awq_w4a16_g128"), 544, 1024)
    planner.check_shape(spec("gptq_v2_w4a16_g128"), 24, 1024)   # [K / 8, N] int32: 96-byte rows


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
    # the heuristic takes it from M = 2 to 16 (measured faster at M = 4), not at M = 1
    assert not planner.heuristic(s, "sm_90", 1, 8192, 8192).tc
    for M in (2, 4, 16):
        pick = planner.heuristic(s, "sm_90", M, 8192, 8192)
        assert pick.tc and pick.mmax >= M and planner.blocks(s, pick, M, 8192) >= 15 * 132 // 8


@pytest.mark.parametrize("name", MATMUL)
def test_predecode_stages(name):
    """Decoded weights at large M: the dequant stage of the spec, then the dense
    GEMM of its twin (activation-dtype weights [N, K], no scales); offered from
    M = 256, picked by the heuristic from `predecode_from`; never for dense weights."""
    s = spec(name)
    decoded = not planner.numerics(s).dense and s.a.dtype in ("float16", "bfloat16")
    assert not any(c.predecode for c in planner.candidates(s, "sm_90", 255, 4096, 4096))
    pd = [c for c in planner.candidates(s, "sm_90", 256, 4096, 4096) if c.predecode]
    assert bool(pd) == decoded
    pick = planner.heuristic(s, "sm_90", 4096, 4096, 4096)
    assert pick.predecode == decoded
    if not decoded:
        return
    (q, dq), (twin, gemm) = planner.stages(s, pick)
    assert q == s and dq == planner.DEQUANT and pick.name.endswith("_pd")
    assert twin.b.dtype == s.a.dtype and twin.b.layout == "nt" and twin.b.scale is None
    assert gemm == dataclasses.replace(pick, predecode=False) and gemm.wgmma
    assert planner.geometry(s, pick, "sm_90")["predecode"]
    assert planner.geometry(s, dq, "sm_90")["b_kmajor"]      # [N, K] rows out
    assert planner.grid(s, dq, 4096, 8192) == (8192 // dq.BN, planner.DEQUANT_KSPLIT, 1)
    start = planner.predecode_from(s, planner.candidates(s, "sm_90", 1024, 4096, 4096))
    assert planner.heuristic(s, "sm_90", start, 4096, 4096).predecode
    assert not planner.heuristic(s, "sm_90", start - 1, 4096, 4096).predecode


@pytest.mark.parametrize("name,start", [("awq_w4a16_g128", 256), ("gptq_v2_w4a16_g128", 256),
                                        ("w1a16_g128", 256), ("bnb_nf4", 512),
                                        ("w4a16_sym_g128", 2048), ("gptq_v2_w4a16_g128_repacked", 2048)])
def test_predecode_from(name, start):
    """The measured thresholds (tuner logs, bench/results/h200/run3, run4 and
    run14): no fused wgmma (AWQ) or per-group zero points from 256, the swapped
    GEMM's specs from 2048, the rest from 512."""
    s = spec(name)
    assert planner.predecode_from(s, planner.candidates(s, "sm_90", 1024, 8192, 8192)) == start
