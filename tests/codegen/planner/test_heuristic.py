"""planner/heuristic.py: the picks without tuning, as the measured winners
had them."""
import dataclasses

import pytest

from opgen.codegen import hw, planner
from opgen.codegen.resolve import load_spec, shipped_specs


def spec(name):
    return load_spec(shipped_specs()[name])


def test_heuristic_takes_tma_like_the_tuned_winners():
    """From M = 17 the heuristic picks the TMA GEMM for dense operands (and
    for predecode's dense half), with the tuned winners' tiles (docs/performance.md#tma-gemm)."""
    for name, M, want in (("w8a8_int8", 64, (64, 64, 0)), ("fp8_e4m3_w8a8", 256, (128, 128, 8)),
                          ("fp16", 4096, (128, 256, 8)), ("gptq_v2_w4a16_g128", 4096, (128, 256, 8))):
        c = planner.heuristic(spec(name), "sm_90", M, 8192, 8192)
        assert c.tma and (c.BM, c.BN, c.raster) == want, c.name
    assert not planner.heuristic(spec("w8a8_int8"), "sm_80", 64, 8192, 8192).tma


def test_dense_operands_up_to_16_rows_take_the_mma_sync_16_row_tile():
    """Dense operands at M = 1 and 9-16: the mma.sync GEMM's 16-row tile
    (not the TMA GEMM, not fp16's tensor-core GEMV), 128-deep k-steps, the
    deepest pipeline, split-K only for grids short of filling the device
    (docs/performance.md#heuristic). (int8 codes with int8 activations at
    M = 1-4: the int8 GEMV, test_8_bit_activation_gemvs_only_where_they_won.)"""
    def pick(name, M, N, K):
        c = planner.heuristic(spec(name), "sm_90", M, N, K, 132)
        assert c.family == "gemm" and not (c.tma or c.wgmma) and c.BM == 16 and c.BK == 128, c.name
        return c
    for name in ("w8a8_int8", "fp8_e4m3_w8a8", "fp16"):
        # 112 and 224 tiles: whole K at M = 1 and 16
        assert pick(name, 16, 14336, 4096).split_k == 1 and pick(name, 16, 28672, 8192).split_k == 1
    for name in ("w8a8_int8", "fp8_e4m3_w8a8"):
        if name == "fp8_e4m3_w8a8":
            assert pick(name, 1, 14336, 4096).split_k == 1 and pick(name, 1, 28672, 4096).split_k == 1
            assert pick(name, 1, 8192, 8192).split_k > 1
        # 48 and 64 tiles: whole K at M = 16; split at M = 1
        assert pick(name, 16, 6144, 4096).split_k == 1 and pick(name, 16, 8192, 8192).split_k == 1
        # 32 tiles: split to about one wave at M = 16; 64 tiles of 224
        # k-steps: split two ways
        assert pick(name, 16, 4096, 14336).split_k == 4
        assert pick(name, 16, 8192, 28672).split_k == 2
    # a narrower tile filling the device loses to the 128-wide one
    assert pick("fp16", 16, 4096, 4096).BN == 128
    # from M = 17 the TMA GEMM again
    assert planner.heuristic(spec("w8a8_int8"), "sm_90", 32, 8192, 8192, 132).tma


def test_heuristic_takes_tall_tiles_for_decoded_weights(monkeypatch):
    """Decoded weights on the cp.async wgmma GEMM above M = 64 (where the rs
    GEMM is not the pick: here taken out): 128-row tiles despite padding
    (each m-tile decodes the weights again), 256 wide once they fill most of a
    wave, as the tuned winners of the 129-256 bucket had them
    (docs/performance.md#gemm)."""
    monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, rs_verified=frozenset()))
    for name, M, N, want in (("mxfp4", 256, 8192, (128, 128)),
                             ("bnb_nf4", 192, 6144, (128, 128)),
                             ("bnb_nf4", 256, 28672, (128, 256)),
                             ("mxfp4", 256, 14336, (128, 256))):
        c = planner.heuristic(spec(name), "sm_90", M, N, 8192)
        assert c.wgmma and not c.predecode and (c.BM, c.BN) == want, c.name
    # dense operands keep the TMA rule, M <= 64 the least padding
    assert planner.heuristic(spec("gptq_v2_w4a16_g128"), "sm_90", 48, 6144, 6144).BM == 64


def test_heuristic_takes_the_rs_gemm_above_16_rows():
    """w4a16_sym from M = 17 to the predecode threshold: the rs GEMM as
    its sweeps' winners had it (64 weight rows, two k-groups; 128-deep
    k-tiles up to 128 rows, then a 256-row m-tile with a producer
    warpgroup), and past 256 rows as the tuned ones
    (docs/performance.md#rs-gemm)."""
    s = spec("w4a16_sym_g128")
    for M, want in ((17, (32, 128, 8)), (64, (64, 128, 8)), (100, (128, 128, 6)), (256, (256, 64, 6))):
        c = planner.heuristic(s, "sm_90", M, 8192, 8192)
        assert c.rs and c.BN == 64 and c.kgroups == 2 and (c.BM, c.BK, c.stages) == want, (M, c.name)
    assert planner.geometry(s, planner.heuristic(s, "sm_90", 256, 8192, 8192), "sm_90")["regs"] == (40, 232)
    # M = 9-16: the rs GEMM where its 64-row blocks fill the SMs (1.22-2.17x
    # the tensor-core GEMV in the tuned records), else the GEMV
    c = planner.heuristic(s, "sm_90", 16, 8192, 8192)
    assert c.rs and (c.BM, c.BN, c.kgroups, c.stages) == (16, 64, 4, 12), c.name
    assert planner.heuristic(s, "sm_90", 8, 8192, 8192).tc
    assert planner.heuristic(s, "sm_90", 16, 4096, 8192).tc
    assert planner.heuristic(s, "sm_90", 16, 5120, 5120, sms=132).rs    # Qwen2.5-14B: 1.58x
    for name in ("w4a16_sym_g128", "bnb_nf4", "mxfp4"):                    # Qwen2.5-7B: 1.35-1.65x
        assert planner.heuristic(spec(name), "sm_90", 16, 4608, 3584, sms=132).rs, name
    # every other decoding's too since their 12-stage, four-k-group rs GEMM
    # (8192^2: 1.06-1.96x the tensor-core GEMV)
    for name in ("bnb_nf4", "mxfp4", "fp8_e4m3_w8a16", "w1a16_g128", "w2a16_g128", "bitnet_b158"):
        assert planner.heuristic(spec(name), "sm_90", 16, 8192, 8192).rs, name
    assert not planner.heuristic(s, "sm_80", 64, 8192, 8192).rs
    # past 256 rows: 128 weight rows, one k-group, until predecode
    c = planner.heuristic(s, "sm_90", 1024, 8192, 8192)
    assert c.rs and (c.BM, c.BN, c.BK, c.kgroups, c.stages) == (256, 128, 64, 1, 4), c.name
    # through the largest bucket's M (its rs GEMM won 7 of 8 H200 records at
    # 4096), predecode from 8192; GPTQ's rs GEMM gives way from 2048
    assert planner.heuristic(s, "sm_90", 4096, 8192, 8192).rs
    assert planner.heuristic(s, "sm_90", 8192, 8192, 8192).predecode
    assert planner.heuristic(spec("gptq_v2_w4a16_g128_repacked"), "sm_90", 2048, 8192, 8192).predecode


def test_tensor_core_gemv_on_narrow_layers():
    """M = 2-16 on layers too narrow for ~2 tensor-core GEMV blocks per SM:
    the most blocks of 8-byte vectors or wider (where the code has them),
    not the widest vectors' few (512 x 3584, M = 16, H100: w4 v8 s8, 64
    blocks, 8.2 us; the w8 v16 s2 pick, 8 blocks, 14.9). Wide layers keep
    the widest vectors at ~2 blocks per SM."""
    for name, want in (("w4a16_sym_g128", "gemv_m16_w4_v8_s8_tc"), ("bnb_nf4", "gemv_m16_w4_v8_s8_tc")):
        c = planner.heuristic(planner.execution_spec(spec(name), "sm_90"), "sm_90", 16, 512, 3584, sms=132)
        assert c.name == want, (name, c.name)
    c = planner.heuristic(spec("w4a16_sym_g128"), "sm_90", 16, 4096, 14336, sms=132)
    assert c.name == "gemv_m16_w8_v16_s8_tc"
    # M = 2-4 there: the row GEMV (it won 19 of 21 such records, H100: 512 x
    # 3584 and gpt-oss-20b's K = 2880 layers, 1.1-3.4x); wide layers keep
    # the tensor-core GEMV
    for name, (N, K) in (("w4a16_sym_g128", (512, 3584)), ("mxfp4", (4096, 2880)), ("bnb_nf4", (2880, 2880))):
        c = planner.heuristic(planner.execution_spec(spec(name), "sm_90"), "sm_90", 4, N, K, sms=132)
        assert c.family == "gemv" and not c.tc, (name, c.name)
    assert planner.heuristic(spec("w4a16_sym_g128"), "sm_90", 4, 4096, 4096, sms=132).tc


def test_no_tensor_core_gemv_of_narrow_vectors_at_9_to_16_rows(monkeypatch):
    """M = 9-16 off the rs GEMM, where the tensor-core GEMV would load 8 codes
    a vector (MXFP4's scale groups of 32; K = 18944's slices): the split-K
    mma.sync GEMM, as the winners had it (hw.H200.tc_gemv_min_codes says
    where). 16-code vectors (NF4, 2-bit) keep the GEMV; so does M = 2-8."""
    mx = spec("mxfp4")
    for N, K, want in ((512, 3584, "gemm_16x64x64_w16x16_p4_s8"), (1024, 5120, "gemm_16x64x64_w16x16_p4_s8"),
                       (1024, 4096, "gemm_16x64x64_w16x16_p4_s8"), (3584, 18944, "gemm_16x64x64_w16x16_p4_s8")):
        assert planner.heuristic(mx, "sm_90", 16, N, K, sms=132).name == want, (N, K)
    c = planner.heuristic(spec("w4a16_sym_g128"), "sm_90", 12, 3584, 18944, sms=132)
    assert c.family == "gemm" and not (c.tc or c.wgmma) and c.split_k == 8, c.name
    for name, N, K in (("bnb_nf4", 1024, 8192), ("w2a16_g128", 4096, 14336)):
        c = planner.heuristic(planner.execution_spec(spec(name), "sm_90"), "sm_90", 16, N, K, sms=132)
        assert c.tc, (name, c.name)
    assert planner.heuristic(mx, "sm_90", 8, 1024, 4096, sms=132).tc
    # Without the calibration (0: any vector), the GEMV as before.
    monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, tc_gemv_min_codes=0))
    assert planner.heuristic(mx, "sm_90", 16, 512, 3584, sms=132).name == "gemv_m16_w4_v4_s16_tc"


def test_codebook_tensor_core_gemv_takes_8_warps_where_they_fill_the_sms(monkeypatch):
    """NF4's tensor-core GEMV on 1024-row layers: 8-warp blocks split 16 ways
    (128 blocks), as every NF4 winner had them, not the 4-warp pick's 256
    (hw.H200.tc_gemv_eight_warps); on 512-row layers (32 such blocks) the
    most blocks as before; other codes unchanged."""
    nf4 = spec("bnb_nf4")
    for M, K in ((8, 4096), (16, 4096), (16, 8192), (16, 5120)):
        assert planner.heuristic(nf4, "sm_90", M, 1024, K, sms=132).name == f"gemv_m{M}_w8_v8_s16_tc", (M, K)
    assert planner.heuristic(nf4, "sm_90", 16, 512, 3584, sms=132).name == "gemv_m16_w4_v8_s8_tc"
    assert planner.heuristic(spec("w4a16_sym_g128"), "sm_90", 16, 1024, 8192, sms=132).warps == 4
    monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, tc_gemv_eight_warps=frozenset()))
    assert planner.heuristic(nf4, "sm_90", 16, 1024, 8192, sms=132).name == "gemv_m16_w4_v8_s16_tc"


def test_rs_gemm_from_m9_where_k_is_short():
    """M = 9-16 on 4096- and 3584-row layers (0.48 and 0.42 of the SMs in
    64-row blocks): the rs GEMM where K <= 4096, the tensor-core GEMV
    where K is longer (hw.H200.rs_from_m9_short_k_fill_of says why); fp8
    weights keep the GEMV."""
    for name in ("w4a16_sym_g128", "bnb_nf4", "w2a16_g128", "bitnet_b158", "w1a16_g128"):
        s = planner.execution_spec(spec(name), "sm_90")
        for N, K in ((4096, 4096), (3584, 3584)):
            assert planner.heuristic(s, "sm_90", 16, N, K, sms=132).rs, (name, N, K)
        for N, K in ((4096, 14336), (3584, 18944), (4096, 4224)):
            assert not planner.heuristic(s, "sm_90", 12, N, K, sms=132).rs, (name, N, K)
        assert not planner.heuristic(s, "sm_90", 16, 3200, 3200, sms=132).rs     # 0.38 of the SMs
    assert not planner.heuristic(spec("fp8_e4m3_w8a16"), "sm_90", 16, 4096, 4096, sms=132).rs


def test_nf4_leaves_its_rs_gemm_on_narrow_layers():
    """NF4 at M = 17-64 on a 1024-row layer: split-K GEMMs as its winners
    had them (its rs GEMM fills a quarter to half of the SMs and lost by
    1.37-1.75x); on wide layers, and for the 4-bit interleaved decodings,
    the rs GEMM."""
    nf4 = spec("bnb_nf4")
    c = planner.heuristic(nf4, "sm_90", 32, 1024, 4096, sms=132)
    assert not c.rs and not c.wgmma and c.split_k > 1, c.name
    c = planner.heuristic(nf4, "sm_90", 64, 1024, 4096, sms=132)
    assert c.name == "gemm_64x64x64_w64x64_p4_s8_wg", c.name
    assert planner.heuristic(nf4, "sm_90", 32, 14336, 4096, sms=132).rs
    assert planner.heuristic(nf4, "sm_90", 128, 1024, 4096, sms=132).rs
    assert planner.heuristic(spec("w4a16_sym_g128"), "sm_90", 32, 1024, 4096, sms=132).rs


def test_nf4_rs_tiles_as_its_winners_had_them():
    """NF4's table decode: four k-groups of 12 stages for 64-row blocks on a
    grid under one wave (two on wider grids), and 256 x 128 tiles at M =
    512 on a 5120-row layer (its decode costs 128 rows of M:
    hw.H200.rs_decode_rows_of), as its tuned winners had them."""
    nf4 = spec("bnb_nf4")
    c = planner.heuristic(nf4, "sm_90", 32, 5120, 5120, sms=132)
    assert c.rs and (c.BM, c.BN, c.kgroups, c.stages) == (32, 64, 4, 12), c.name
    c = planner.heuristic(nf4, "sm_90", 32, 14336, 4096, sms=132)
    assert c.rs and c.kgroups == 2, c.name
    c = planner.heuristic(nf4, "sm_90", 512, 5120, 5120, sms=132)
    assert c.rs and (c.BM, c.BN) == (256, 128), c.name
    # w4a16_sym keeps two k-groups there
    assert planner.heuristic(spec("w4a16_sym_g128"), "sm_90", 100, 1024, 4096, sms=132).kgroups == 2


def test_rs_at_16_rows_as_the_h200_winners_had_them():
    """M = 9-16 (H200 records, Qwen2.5-72B's layers never tuned before among
    them): on grids of one wave four k-groups of 12 stages (64-row blocks) or
    two (128-row ones); on wider grids two of 6 (64 rows) or one of 6 (128
    rows; the widened codes keep two of 12); NF4's pair table 128-deep on
    grids of up to two waves (hw.H200.rs_pair_tables_128_deep), 64-deep on
    wider ones and for MXFP4 (docs/performance.md#heuristic)."""
    sym, nf4, mx = spec("w4a16_sym_g128"), spec("bnb_nf4"), spec("mxfp4")
    want = {(sym, 8192, 8192): "gemm_16x64x128_w64x16_p12_s1_wg_tma_rs4",
            (sym, 28672, 8192): "gemm_16x128x128_w64x16_p6_s1_wg_tma_rs",
            (sym, 29568, 8192): "gemm_16x128x128_w64x16_p6_s1_wg_tma_rs",
            (nf4, 8192, 29568): "gemm_16x64x128_w64x16_p12_s1_wg_tma_rs4_pt",
            (nf4, 59136, 8192): "gemm_16x64x64_w64x16_p6_s1_wg_tma_rs2_pt",
            (mx, 8192, 8192): "gemm_16x64x64_w64x16_p12_s1_wg_tma_rs4_pt",
            (mx, 59136, 8192): "gemm_16x64x64_w64x16_p6_s1_wg_tma_rs2_pt"}
    for (s, N, K), config in want.items():
        assert planner.heuristic(s, "sm_90", 16, N, K, sms=132).name == config, (s.name, N, K)
    c = planner.heuristic(nf4, "sm_90", 16, 28672, 8192, sms=132)
    assert c.pair_table and (c.BN, c.BK, c.kgroups) == (128, 128, 1), c.name
    a8 = spec("w4a8_int8")
    assert planner.heuristic(a8, "sm_90", 16, 28672, 8192, sms=132).kgroups == 2
    # 64 rows of M on grids past one wave: one k-group of 4 stages (pair
    # tables' 64-row blocks two of 6), as 11 H200 / H100 winners had them
    for name, N, K, config in (("w4a8_fp8", 28672, 8192, "gemm_64x128x128_w64x64_p4_s1_wg_tma_rs"),
                               ("bnb_nf4", 29568, 8192, "gemm_64x128x64_w64x64_p4_s1_wg_tma_rs_pt"),
                               ("mxfp4", 59136, 8192, "gemm_64x64x64_w64x64_p6_s1_wg_tma_rs2_pt")):
        assert planner.heuristic(spec(name), "sm_90", 64, N, K, sms=132).name == config, name
    assert planner.heuristic(sym, "sm_90", 64, 8192, 8192, sms=132).kgroups == 2      # (one wave)
    # MXFP4 on 1024-row layers at M = 33-64 gives way to a split-K GEMM, as NF4
    c = planner.heuristic(mx, "sm_90", 64, 1024, 8192, sms=132)
    assert not c.rs and c.split_k > 1, c.name


def test_decode_gemv_splits_k_only_for_starved_grids():
    """M = 1, weights [N, K]: 1024- and 512-row layers' GEMVs run whole-K
    (split in two they took 1.42-1.66x longer in nine tuned records); wide
    layers were never split; the column GEMV of weights stored [K, N] still
    splits (its winners split K 2-16 ways)."""
    s = spec("w4a16_sym_g128")
    assert planner.heuristic(s, "sm_90", 1, 1024, 4096, sms=132).split_k == 1
    for name in ("w4a16_sym_g128", "bnb_nf4", "mxfp4", "w8a8_int8"):
        assert planner.heuristic(spec(name), "sm_90", 1, 512, 3584, sms=132).split_k == 1, name
    assert planner.heuristic(s, "sm_90", 1, 8192, 8192, sms=132).split_k == 1
    assert planner.heuristic(spec("gptq_v2_w4a16_g128"), "sm_90", 1, 8192, 8192, sms=132).split_k > 1


def test_decode_gemv_prefetches_except_codebook_lookups():
    """16-byte GEMV loads prefetch the next run, except where the codes are
    looked up in a table (NF4: 13-17 % slower with it)."""
    assert planner.heuristic(spec("w4a16_sym_g128"), "sm_90", 1, 8192, 8192).prefetch
    c = planner.heuristic(spec("bnb_nf4"), "sm_90", 1, 8192, 8192)
    assert c.vbytes == 16 and not c.prefetch


def test_rs_tiles_fill_a_wave_on_narrow_layers():
    """Narrow layers (Llama-3-8B's k / v and q / o projections) take smaller
    m-tiles, so that the blocks fill a wave, as their tuned winners did: at
    1024 x 4096, M = 512, 64 x 64 tiles (15.6 us; the 256 x 128 tile the
    heuristic took before: 46.7), at 4096 x 4096, M = 256, 128 x 64 (19.3 vs
    28.7 for 256 x 64); and a wide layer (14336 x 4096) keeps M rounded up."""
    s = spec("w4a16_sym_g128")
    for N, K, M, tile in ((1024, 4096, 512, (64, 64)), (1024, 4096, 128, (32, 64)),
                          (4096, 4096, 256, (128, 64)), (4096, 14336, 512, (256, 64)),
                          (14336, 4096, 256, (256, 128))):
        c = planner.heuristic(s, "sm_90", M, N, K, sms=132)
        assert c.rs and (c.BM, c.BN) == tile, (N, K, M, c.name)


@pytest.mark.parametrize("name,start", [("awq_w4a16_g128", 256), ("gptq_v2_w4a16_g128", 256),
                                        ("w1a16_g128", 2048), ("bnb_nf4", 2048), ("mxfp4", 2048),
                                        ("w4a16_sym_g128", 8192), ("gptq_v2_w4a16_g128_repacked", 2048),
                                        ("w4a8_int8", 16384), ("bitnet_b158_a8", 16384)])
def test_predecode_from(name, start):
    """The measured thresholds (docs/performance.md#predecode): no fused wgmma
    (AWQ, GPTQ as stored) or per-group zero points from 256, the rs GEMM's
    specs from 2048 (every float16 decoding since they all ran on the
    device; w4a16_sym's from 8192: its rs GEMM won 7 of 8 H200 records at
    4096), sub-byte codes widened for 8-bit activations past the largest
    bucket's M where their rs GEMM is a pick, the rest from 512."""
    s = spec(name)
    assert planner.predecode_from(s, planner.candidates(s, "sm_90", 1024, 8192, 8192), "sm_90") == start


def test_widened_codes_predecoded_from_2048_without_their_rs_gemm(monkeypatch):
    """Where the widened codes' rs GEMM is not a pick (its kernel not checked
    on the device) predecode takes over from 2048: it beat the cp.async
    widened GEMM at M = 4096 and tied it at 1024 (docs/performance.md#predecode)."""
    s = spec("w4a8_int8")
    cands = planner.candidates(s, "sm_90", 4096, 8192, 8192)
    monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, rs_verified=frozenset()))
    assert planner.predecode_from(s, cands, "sm_90") == 2048
    assert planner.heuristic(s, "sm_90", 4096, 8192, 8192).predecode
    assert not planner.heuristic(s, "sm_90", 1024, 8192, 8192).predecode
    monkeypatch.undo()
    assert planner.heuristic(s, "sm_90", 4096, 8192, 8192).rs


def test_sm_count_is_the_callers():
    """The device's SM count is passed in (the runtime asks the device);
    without one the arch's planned device's (hw.planned_device: the H200)."""
    s = spec("fp16")
    assert hw.planned_device("sm_90").sms == 132
    planned = planner.heuristic(s, "sm_90", 64, 4096, 4096, hw.planned_device("sm_90").sms)
    assert planner.heuristic(s, "sm_90", 64, 4096, 4096) == planned
    assert planner.heuristic(s, "sm_90", 64, 4096, 4096, sms=16) != planned


def test_excluded_configs_are_never_picked():
    s = spec("w4a16_sym_g128")
    first = planner.heuristic(s, "sm_90", 1, 4096, 4096)
    second = planner.heuristic(s, "sm_90", 1, 4096, 4096, exclude=frozenset([first]))
    assert second != first and second.family == first.family
    every = frozenset(planner.candidates(s, "sm_90", 1, 4096, 4096))
    with pytest.raises(planner.PlanError, match="excluded"):
        planner.heuristic(s, "sm_90", 1, 4096, 4096, exclude=every)


def test_8_bit_activation_gemvs_only_where_they_won(monkeypatch):
    """The GEMVs of 8-bit activations are candidates at every M (the tuner
    times and verifies them); the heuristic takes the int8 GEMV (int8
    activations, integer codes: int8 ones too) up to
    hw.Calibration.int8_gemv_max_m (M = 4 on the H200: it won every timed
    layer at M = 1-2, and at 4; from M = 2 only unsplit: split, the GEMMs
    won), the
    other GEMVs of sub-byte codes up to a8_gemv_max_m, none of fp8 codes,
    and none while those are 0."""
    for name in ("w4a8_int8_g128", "w4a8_int8", "bitnet_b158_a8", "int8_int4_int32", "w8a8_int8"):
        s = spec(name)
        for M in (1, 4, 8):
            assert any(c.family == "gemv" for c in planner.candidates(s, "sm_90", M, 4096, 4096))
        for N, K in ((8192, 8192), (1024, 4096), (28672, 8192), (4096, 14336)):
            for M in (1, 2, 4):
                gemvs = [c for c in planner.candidates(s, "sm_90", M, N, K) if c.family == "gemv"
                         and not c.tc and (M == 1 or c.split_k == 1)]
                pick = planner.heuristic(s, "sm_90", M, N, K)
                if gemvs:
                    assert pick in gemvs and planner.plan(s, pick, "sm_90").kind == "gemv_int8", \
                        (name, N, K, M, pick.name)
                else:   # (rows that need split-K from M = 2; an int32 output's take none)
                    assert pick.family == "gemm", (name, N, K, M, pick.name)
            assert planner.heuristic(s, "sm_90", 8, N, K).family == "gemm", (name, N, K)
        monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, int8_gemv_max_m=0))
        assert planner.heuristic(s, "sm_90", 1, 8192, 8192).family == "gemm", name
        monkeypatch.undo()
    # e4m3 activations: the fp16-staged GEMV of sub-byte codes at M = 1 only,
    # none of fp8 codes
    fp8 = spec("w4a8_fp8")
    pick = planner.heuristic(fp8, "sm_90", 1, 8192, 8192)
    assert pick.family == "gemv" and planner.plan(fp8, pick, "sm_90").kind == "gemv_row"
    assert planner.heuristic(fp8, "sm_90", 2, 8192, 8192).family == "gemm"
    monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, a8_gemv_max_m=0))
    assert planner.heuristic(fp8, "sm_90", 1, 8192, 8192).family == "gemm"
    monkeypatch.undo()
    assert planner.heuristic(spec("fp8_e4m3_w8a8"), "sm_90", 1, 4096, 4096).family == "gemm"


def test_inflight_sums_where_verified(monkeypatch):
    """fp8's in-flight sums kernels: the heuristic's picks once they have
    been checked and timed on the device (hw.Calibration.inflight_sums_verified:
    on the H200), else the one-set kernels, at the same tile."""
    s = spec("fp8_e4m3_w8a8")
    picks = {M: planner.heuristic(s, "sm_90", M, 8192, 8192) for M in (64, 1024, 4096)}
    assert any(c.inflight_sums for c in picks.values())
    monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, inflight_sums_verified=False))
    for M, c in picks.items():
        assert any(c.inflight_sums for c in planner.candidates(s, "sm_90", M, 8192, 8192))
        plain = planner.heuristic(s, "sm_90", M, 8192, 8192)
        assert not plain.inflight_sums and (plain.BM, plain.BN) == (c.BM, c.BN), (M, plain.name)


def test_shallow_rings_where_verified(monkeypatch):
    """The rs GEMM's 3-deep rings (1-bit codes' 256-row tiles, where no
    4-deep ring fits): candidates the tuner times, the heuristic's picks only
    for a decoding in hw.Calibration.rs_shallow_rings (checked and timed on
    the device)."""
    s = planner.execution_spec(spec("w1a16_g128"), "sm_90")
    kind = planner.rs.kernel_class(s, "sm_90")
    for M in (256, 1024):
        assert any(c.rs and c.stages < planner.rs.RS_FULL_RING for c in planner.candidates(s, "sm_90", M, 8192, 8192))
        monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, rs_shallow_rings=frozenset()))
        assert planner.heuristic(s, "sm_90", M, 8192, 8192).stages >= planner.rs.RS_FULL_RING
        monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, rs_shallow_rings=frozenset({kind})))
        c = planner.heuristic(s, "sm_90", M, 8192, 8192)
        assert c.rs and c.BM == 256 and c.stages < planner.rs.RS_FULL_RING, c.name
        monkeypatch.undo()


def test_pair_tables_where_verified(monkeypatch):
    """NF4's and MXFP4's pair-table rs GEMMs: the heuristic takes one for
    a decoding listed in hw.Calibration.rs_pair_tables (checked and timed
    faster on the device: both, on the H200) up to the M listed (NF4 256,
    MXFP4 64), at the tile it picks without them; not listed, the
    code-by-code kernel (the tuner times both)."""
    for name, upto in (("bnb_nf4", 256), ("mxfp4", 64)):
        s = spec(name)
        picks = {M: planner.heuristic(s, "sm_90", M, 8192, 8192) for M in (16, 32, 64, 256, 512)}
        assert all(c.rs and c.pair_table == (M <= upto) for M, c in picks.items()), name
        monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, rs_pair_tables={}))
        for M, c in picks.items():
            assert any(c.pair_table for c in planner.candidates(s, "sm_90", M, 8192, 8192))
            plain = planner.heuristic(s, "sm_90", M, 8192, 8192)
            assert not plain.pair_table and (plain.BM, plain.BN) == (c.BM, c.BN), (name, M, plain.name)
        monkeypatch.undo()


@pytest.mark.parametrize("name", ["w4a8_int8", "bitnet_b158_a8", "w4a8_fp8"])
def test_widened_codes_take_the_tuned_winners_tiles(name, monkeypatch):
    """Sub-byte codes widened for 8-bit activations (H100 tuning on an empty
    DB, hw.H200.widened_waves_max_m): from M = 17 the whole-K wgmma tile by
    waves (64 x 64 where it fills a wave, 64 x 128 and 128 x 256 on the
    28672-row layer, 128 x 128 at 8192^2, M = 256), split along K only on
    grids of at most half a wave with 24+ k-tiles a slice (4096 x 14336);
    at M = 2-16 the whole K where the 16-row tiles fill the device, else
    split-K; with the rules off, the split-K GEMMs of decoded weights.
    (int8 activations: the rules where their rs GEMM is not verified,
    test_widened_codes_take_their_rs_gemm.)"""
    s = planner.execution_spec(load_spec(shipped_specs()[name]), "sm_90")
    verified = frozenset(k for k in hw.H200.rs_verified if not k.startswith("widen"))
    monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, rs_verified=verified))
    want = {(8192, 8192, 64): "gemm_64x64x128_w64x64_p5_s1_wg",
            (4096, 4096, 128): "gemm_64x64x128_w64x64_p5_s1_wg",
            (8192, 8192, 256): "gemm_128x128x128_w64x128_p5_s1_wg",
            (28672, 8192, 64): "gemm_64x128x128_w64x128_p5_s1_wg",
            (28672, 8192, 128): "gemm_128x256x128_w64x256_p5_s1_wg",
            (4096, 14336, 64): "gemm_64x64x128_w64x64_p5_s4_wg",
            (4096, 4096, 32): "gemm_64x64x128_w64x64_p5_s1_wg",
            (28672, 8192, 16): "gemm_16x128x128_w16x32_p5_s1"}
    for (N, K, M), config in want.items():
        if config in {c.name for c in planner.candidates(s, "sm_90", M, N, K)}:   # (e4m3: no 128 x 256)
            assert planner.heuristic(s, "sm_90", M, N, K).name == config, (N, K, M)
    assert planner.heuristic(s, "sm_90", 16, 8192, 8192).split_k > 1
    monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, widened_waves_max_m=0,
                                                                     rs_verified=verified))
    assert planner.heuristic(s, "sm_90", 64, 8192, 8192).split_k > 1
    assert planner.heuristic(s, "sm_90", 16, 28672, 8192).split_k > 1


def test_widened_group_kernel_takes_64_row_tiles_up_to_256(monkeypatch):
    """The widened codes' group kernel (w4a8_int8_g128): 64 weight rows up
    to M = 256 (hw.H200.rs_rows64_max_m), the picks of its H100 winners at
    28672 x 8192 and 8192^2, where the score alone took 128-row tiles
    (docs/performance.md#heuristic); from M = 1024 the score's tiles; the
    channel-scaled kernel keeps the score's 128-row tiles."""
    s = planner.execution_spec(load_spec(shipped_specs()["w4a8_int8_g128"]), "sm_90")
    want = {(28672, 8192, 32): "gemm_32x64x128_w64x32_p8_s1_wg_tma_rs2",
            (28672, 8192, 128): "gemm_128x64x128_w64x128_p6_s1_wg_tma_rs2",
            (8192, 8192, 256): "gemm_128x64x128_w64x128_p6_s1_wg_tma_rs2"}
    for (N, K, M), config in want.items():
        assert planner.heuristic(s, "sm_90", M, N, K).name == config, (N, K, M)
    for N, K in ((4096, 4096), (6144, 4096), (4096, 14336), (8192, 8192), (28672, 8192)):
        for M in (16, 64, 256):
            assert planner.heuristic(s, "sm_90", M, N, K).BN == 64, (N, K, M)
    assert planner.heuristic(s, "sm_90", 1024, 8192, 8192).BN == 128
    monkeypatch.setitem(hw.CALIBRATION, "H200", dataclasses.replace(hw.H200, rs_rows64_max_m={}))
    assert planner.heuristic(s, "sm_90", 128, 28672, 8192).BN == 128
    monkeypatch.undo()
    w4a8 = planner.execution_spec(load_spec(shipped_specs()["w4a8_int8"]), "sm_90")
    assert planner.heuristic(w4a8, "sm_90", 128, 28672, 8192).BN == 128


@pytest.mark.parametrize("name", ["w4a8_int8", "bitnet_b158_a8", "w4a8_int8_g128", "int8_int4_int32"])
def test_widened_codes_take_their_rs_gemm(name):
    """Sub-byte codes with int8 activations on sm_90 from M = 9 to the
    predecode threshold: the rs GEMM (codes widened into the int8 wgmma's
    registers), on every layer, its tile by the rs rules, four k-groups of
    12 stages on grids under a wave as the H100 winners (empty DB, five
    shapes, M = 16-1024: docs/performance.md#heuristic) and at the largest
    bucket's M = 4096, where it beat predecode in 7 of 8 H100 tuned records
    (not W4A8 at 28672 x 8192: docs/performance.md#predecode); predecode
    from M = 16384 where there is one; M = 1 and 2-8 as before."""
    s = planner.execution_spec(load_spec(shipped_specs()[name]), "sm_90")
    for N, K in ((1024, 4096), (4096, 4096), (4096, 14336), (8192, 8192), (28672, 8192)):
        for M in (16, 32, 128, 512, 1024):
            assert planner.heuristic(s, "sm_90", M, N, K).rs, (N, K, M)
    assert planner.heuristic(s, "sm_90", 16, 4096, 4096).name == "gemm_16x64x128_w64x16_p12_s1_wg_tma_rs4"
    assert planner.heuristic(s, "sm_90", 32, 4096, 14336).name == "gemm_16x64x128_w64x16_p12_s1_wg_tma_rs4"
    if name != "w4a8_int8_g128":
        assert planner.heuristic(s, "sm_90", 1024, 4096, 4096).name == "gemm_256x128x128_w64x256_p4_s1_wg_tma_rs"
    for N, K in ((4096, 4096), (4096, 14336), (6144, 4096), (8192, 8192), (28672, 8192)):
        assert planner.heuristic(s, "sm_90", 4096, N, K).rs, (N, K)
    if name != "w4a8_int8_g128":     # 128 weight rows, as the winners (hw.H200.rs_staging_rows)
        assert planner.heuristic(s, "sm_90", 4096, 28672, 8192).name == \
            "gemm_256x128x128_w64x256_p4_s1_wg_tma_rs"
    big = planner.heuristic(s, "sm_90", 16384, 8192, 8192)      # (group scales, int32 out: no predecode)
    assert big.predecode == (name in ("w4a8_int8", "bitnet_b158_a8")) and (big.predecode or big.rs)
    assert not planner.heuristic(s, "sm_90", 8, 8192, 8192).rs
    assert not planner.heuristic(s, "sm_90", 16, 8192, 8192, sms=132).tc
