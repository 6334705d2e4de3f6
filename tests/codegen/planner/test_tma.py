"""planner/tma.py: the warp-specialized TMA GEMM."""
import dataclasses

import pytest

from opgen.codegen import planner
from opgen.codegen.planner import tma as tma_family
from opgen.codegen.resolve import load_spec, shipped_specs


def spec(name):
    return load_spec(shipped_specs()[name])


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
        consumer = tma_family.consumer_regs(producer)
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


def test_widened_codes_on_the_tma_gemm():
    """8-bit activations with sub-byte codes: the producer warpgroup widens
    them into an int8 B tile of 128-byte rows (the int8 wgmma's), for
    channel and tensor scales; group scales and the int32 output stay on the
    cp.async GEMM, which scales each group's sums / stores the raw sums."""
    cfg = planner.Config("gemm", 128, 128, 128, 64, 128, 4, 1, wgmma=True, tma=True)
    for name in ("w4a8_int8", "bitnet_b158_a8"):
        s = planner.execution_spec(spec(name), "sm_90")
        g = planner.geometry(s, cfg, "sm_90")
        assert not g["dense"] and g["acc_int"] and g["bs_rowb"] == 128 and g["rowb"] == 128, name
    for name, why in (("w4a8_int8_g128", "group scales"), ("int8_int4_int32", "int32")):
        with pytest.raises(planner.PlanError, match=why):
            planner.geometry(planner.execution_spec(spec(name), "sm_90"), cfg, "sm_90")


def test_inflight_sums_only_where_wgmma_sums_are_added_up_per_k_tile():
    """Config.inflight_sums: a TMA GEMM of fp8 operands (whose wgmma sums are
    added up per k-tile) with three sets of WN / 2 accumulators in the MMA
    warps' registers; no other kernel, no other operand type."""
    ins = lambda BM, BN, WN, **kw: planner.Config("gemm", BM, BN, 128, 64, WN, 4, 1, wgmma=True, tma=True,
                                                   inflight_sums=True, **kw)
    fp8 = spec("fp8_e4m3_w8a8")
    for cfg in (ins(128, 128, 128), ins(64, 64, 64), ins(128, 128, 128, cluster=2)):
        g = planner.geometry(fp8, cfg, "sm_90")
        assert g["promote"] and g["inflight_sums"] and cfg.name.endswith("_is")
    assert 3 * 128 // 2 + tma_family.INFLIGHT_SUMS_SPARE <= tma_family.TMA_CONSUMER_REGS
    for s, cfg, why in ((spec("w8a8_int8"), ins(128, 128, 128), "fp8"),
                        (fp8, ins(128, 256, 256), "WN 64 or 128"),
                        (fp8, dataclasses.replace(ins(128, 128, 128), tma=False), "TMA GEMM"),
                        (fp8, dataclasses.replace(ins(128, 128, 128), predecode=True), "need decoding"),
                        (spec("w4a16_sym_g128"), dataclasses.replace(ins(64, 64, 64), rs=True), "in-flight")):
        with pytest.raises(planner.PlanError, match=why):
            planner.geometry(s, cfg, "sm_90")
    # candidates: fp8's TMA tiles of WN <= 128 both ways; none elsewhere
    cands = planner.candidates(fp8, "sm_90", 4096, 8192, 8192)
    inflight = {dataclasses.replace(c, inflight_sums=False) for c in cands if c.inflight_sums}
    assert inflight and inflight <= set(cands)
    assert not any(c.inflight_sums for c in planner.candidates(spec("w8a8_int8"), "sm_90", 4096, 8192, 8192))
