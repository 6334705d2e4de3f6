"""The configuration space: every config the planner knows (all_configs),
and those worth timing for one problem (candidates)."""
from __future__ import annotations

from typing import List, Optional

from .. import hw
from ..spec import Spec
from .config import Config, PlanError, check_shape
from .registry import geometry, shape_ok
from .rs import RS_STAGES, RS_TILES_K, RS_TILES_M, RS_TILES_N

# Block tiles (BM, BN, BK, WM, WN) the planner tries: at most 8 warps and 64
# fp32 accumulators per thread, so that none spills at 255 registers.
GEMM_TILES = [
    (16, 64, 64, 16, 16), (16, 128, 64, 16, 32), (16, 256, 64, 16, 64),
    (32, 128, 64, 32, 32), (32, 256, 64, 32, 64),
    (64, 128, 64, 32, 64), (64, 256, 64, 32, 64), (128, 64, 64, 64, 32),
    (128, 128, 64, 64, 32),
    # 128-byte rows of 8-bit operands (int8 / fp8 activations)
    (16, 128, 128, 16, 32), (32, 128, 128, 32, 32), (64, 128, 128, 32, 64),
    (64, 128, 128, 32, 32), (128, 64, 128, 32, 32), (128, 128, 128, 64, 32),
]
# wgmma tiles (BM, BN, WN): warpgroups of 64 x WN, at most two per block.
# (64, 64, 64): twice the blocks of 64 x 128 where M = 33-64 leaves SMs idle.
WGMMA_TILES = [(64, 64, 64), (64, 128, 128), (64, 256, 256), (64, 256, 128), (128, 128, 128),
               (128, 256, 256)]
STAGES = (3, 4, 5)
# The tma ring holds whole stages of A and B; deeper rings for the small tiles.
TMA_STAGES = (3, 4, 6, 8)
TMA_RASTERS = (0, 8)
# Predecode writes and re-reads 2 bytes per weight (N x K x 2 scratch): worth
# trying only where the fused GEMM decodes every weight M / BM >= 2 times.
PREDECODE_MIN_M = 256
SPLITS = (1, 2, 4, 8)
# GEMV column blocks are 32 vectors wide (512-1024 columns for AWQ): narrow N
# needs deeper split-K to fill the SMs.
GEMV_SPLITS = (1, 2, 4, 8, 16)


def all_configs() -> List[Config]:
    """Every config of every family, valid or not for a given spec (geometry
    says which are)."""
    out = []
    for (BM, BN, BK, WM, WN) in GEMM_TILES:
        for stages in STAGES:
            for sk in SPLITS:
                out.append(Config("gemm", BM, BN, BK, WM, WN, stages, sk))
                if BM >= 64:   # two resident blocks: 128 registers for 256 threads
                    out.append(Config("gemm", BM, BN, BK, WM, WN, stages, sk, min_blocks=2))
    for (BM, BN, WN) in WGMMA_TILES:
        for BK in (64, 128):            # 128-byte rows of 16-bit or 8-bit operands
            for stages in STAGES:
                for sk in SPLITS:
                    out.append(Config("gemm", BM, BN, BK, 64, WN, stages, sk, wgmma=True))
    # Predecode: the dense GEMM's tall tiles (the decode is paid once, not per m-tile).
    for (BM, BN, BK, WM, WN) in GEMM_TILES:
        if BM >= 64 and BK == 64:
            for stages in STAGES:
                out.append(Config("gemm", BM, BN, BK, WM, WN, stages, 1, predecode=True))
    for (BM, BN, WN) in WGMMA_TILES:
        if BM == 128:
            for BK in (64, 128):        # (128: 8-bit dense codes, predecode of 8-bit activations)
                for stages in STAGES:
                    out.append(Config("gemm", BM, BN, BK, 64, WN, stages, 1, wgmma=True, predecode=True))
    for (BM, BN, WN) in WGMMA_TILES:
        for BK in (64, 128):
            for stages in TMA_STAGES:
                for cl in (1, 2):
                    for ra in TMA_RASTERS:
                        out.append(Config("gemm", BM, BN, BK, 64, WN, stages, 1, wgmma=True, tma=True,
                                          cluster=cl, raster=ra))
                        out.append(Config("gemm", BM, BN, BK, 64, WN, stages, 1, wgmma=True, tma=True,
                                          cluster=cl, raster=ra, inflight_sums=True))   # (fp8: geometry)
                        if BM == 128 and stages <= 4:
                            out.append(Config("gemm", BM, BN, BK, 64, WN, stages, 1, wgmma=True,
                                              tma=True, cluster=cl, raster=ra, predecode=True))
                # Split-K for decoded weights (geometry refuses dense ones); at
                # BN 256 the reduction of 128 accumulators spills.
                if BM == 64 and BK == 64 and BN <= 128:
                    for sk in (2, 4):
                        out.append(Config("gemm", BM, BN, BK, 64, WN, stages, sk, wgmma=True, tma=True))
    for BM in RS_TILES_M:
        for BN in RS_TILES_N:
            for BK in RS_TILES_K:
                for stages in RS_STAGES:
                    for kg in (1, 2, 4):
                        for pt in (False, True):       # (pair tables: geometry)
                            out.append(Config("gemm", BM, BN, BK, 64, BM, stages, 1, wgmma=True, tma=True,
                                              rs=True, kgroups=kg, pair_table=pt))
    for mmax in (1, 2, 4, 8):
        for warps in (4, 8):
            for cols in (1, 2, 4):
                for vb in (16, 8, 4):
                    for sk in GEMV_SPLITS:
                        # prefetch: only unsplit or 2-way (split-K shortens each
                        # warp's k-range, so there is less to overlap)
                        for pf in ((False, True) if sk <= 2 else (False,)):
                            out.append(Config("gemv", warps=warps, vbytes=vb, split_k=sk, mmax=mmax,
                                              cols=cols, prefetch=pf))
    # The tensor-core GEMV also takes 9-16 rows: two m-tiles per k-block.
    for mmax in (1, 2, 4, 8, 16):
        for warps in (4, 8):
            for vb in (16, 8, 4):
                for sk in GEMV_SPLITS:
                    out.append(Config("gemv", warps=warps, vbytes=vb, split_k=sk, mmax=mmax, tc=True))
    return out


def candidates(spec: Spec, arch: str, M: int, N: int, K: int, sms: Optional[int] = None) -> List[Config]:
    """Valid configurations worth timing for this problem size: GEMV only for
    M <= 16 (above 8 the tensor-core one) and with the smallest mmax >= M;
    GEMM tiles between M/4 (at most 64) and 2M rows; predecode from M = 256;
    split-K only while the grid stays under 8 waves and slices keep 4 k-tiles.
    sms: the device's SM count (runtime: device.sm_count(); None: the arch's
    planned device, hw.planned_device)."""
    check_shape(spec, N, K)
    sms = sms or hw.planned_device(arch).sms
    out, why = [], {}
    for cfg in all_configs():
        if cfg.family == "gemv" and (M > cfg.mmax or (cfg.mmax > 1 and cfg.mmax >= 2 * M)):
            continue
        if cfg.predecode and M < PREDECODE_MIN_M:
            continue
        if cfg.family == "gemm":
            # Tiles no taller than 2M (padding), and no shorter than a quarter
            # of M up to 64 rows (each m-tile re-reads all the weights).
            # (wgmma tiles are 64 rows at least: worth trying from M = 9 on.)
            tallest = max(64 if cfg.wgmma and M > 8 else 16, 2 * M)
            if cfg.BM > tallest or cfg.BM < min(64, M // 4) or (cfg.wgmma and M <= 8):
                continue
            if cfg.cluster > 1 and M <= cfg.BM:
                continue        # one m-tile: nobody to share the weight tile with
            if cfg.raster and M <= cfg.BM * cfg.cluster:
                continue        # one band of m-tiles: the same order as without
            tiles = -(-N // cfg.BN) * -(-M // cfg.BM)
            if cfg.split_k > 1 and (tiles * cfg.split_k > 8 * sms or K // cfg.split_k < 4 * cfg.BK):
                continue
        try:
            g = geometry(spec, cfg, arch)
        except PlanError as e:
            why[str(e)] = why.get(str(e), 0) + 1
            continue
        if shape_ok(g, cfg, N, K):
            out.append(cfg)
    if not out:
        # The reasons the most configs were refused for, most common first.
        top = sorted(why, key=why.get, reverse=True)[:3]
        reason = (": " + "; ".join(top)) if top else ""
        raise PlanError(f"no kernel configuration fits {spec.name} on {arch} at N={N}, K={K}{reason}")
    return out
