"""The warp-specialized TMA GEMM (gemm_tma.cu.j2): a producer warpgroup
TMA-loads (and for decoded weights decodes) tiles into an mbarrier ring, one
or two wgmma warpgroups compute; sm_90a. Also the register split of
warp-specialized kernels (setmaxnreg) and the tensor-map boxes, which the rs
GEMM shares."""
from __future__ import annotations

from typing import Dict, Tuple

from .. import hw
from ..lower import Layout, Numerics
from ..spec import Spec
from .config import Config, PlanError
from .gemm import check_byte_lanes, check_wgmma, grid, wgmma_promotes
from .launch import Family, TmaBoxes
from .tiles import STATIC_SMEM_RESERVE, decoded_tile, k_major

_SM90 = hw.arch("sm_90")          # the one arch with TMA and setmaxnreg
# Registers per thread after setmaxnreg (a producer warpgroup beside MMA
# warpgroups). setmaxnreg.inc only takes what the block's other warps gave
# back: the split must fit the block's launch allocation (two MMA warpgroups:
# 384 threads x 168 = 64512), or the MMA warps wait forever (a 96 / 208
# split, 256 registers over, hung on the H200: docs/performance.md#tma-gemm).
TMA_BLOCK_REGS = 384 * _SM90.launch_reg_cap(384)


def consumer_regs(producer: int, consumers: int = 2) -> int:
    """Registers per MMA thread once a producer warpgroup of `producer` per
    thread has handed the rest of the launch's allocation over."""
    threads = 128 * (consumers + 1)
    return min(256, (threads * _SM90.launch_reg_cap(threads) - 128 * producer) // (128 * consumers) // 8 * 8)


TMA_PRODUCER_REGS = 40                                   # the producer only issues TMA
TMA_CONSUMER_REGS = consumer_regs(TMA_PRODUCER_REGS)     # 232
# ... when the producer warpgroup also decodes the weights: 96 / 200.
TMA_DECODE_REGS = (96, consumer_regs(96))
# Registers an MMA thread of the in-flight sums kernel needs beside its three
# sets of accumulators (Config.inflight_sums): descriptors, loop state, barriers.
INFLIGHT_SUMS_SPARE = 40


def geometry(spec: Spec, cfg: Config, a: hw.Arch, num: Numerics, lay: Layout) -> Dict:
    """The warp-specialized GEMM (gemm_tma.cu.j2): dense K-major operands, one
    producer warpgroup issuing TMA loads into a STAGES-deep mbarrier ring, one
    or two MMA warpgroups, optional multicast of the weight tile to a cluster
    of blocks along M."""
    if not cfg.tma:
        raise PlanError("clusters, in-flight sums and rasters are for tma configs (the TMA GEMM)")
    if not (a.tma and cfg.wgmma):
        raise PlanError(f"tma configs are wgmma configs on sm_90a (target {a.name})")
    if not k_major(lay) or (num.dense and lay.row_axis != "n"):
        raise PlanError("tma configs take dense weights stored [N, K], or codes packed along k")
    mma = hw.MMAS[num.mma]
    ce = mma.a_bytes
    check_wgmma(cfg, a, num, lay, ce)
    dt, raw = {}, 0
    if not num.dense:
        # Decoded weights: the producer warpgroup TMA-loads the raw tile into
        # the stage and decodes it into the stage's B tile for the MMA warps.
        if cfg.cluster != 1:
            raise PlanError("tma configs on decoded weights load their own tiles (cluster 1)")
        if num.widen:
            # Codes widened to 8-bit q - z for the 8-bit wgmma: their scales
            # apply to the whole sum, in the epilogue; group scales need the
            # MMA warps to scale each group's sums (the cp.async GEMM's flush).
            check_byte_lanes(lay)
            if num.scale_gran == "group":
                raise PlanError("widened codes with group scales run on the cp.async GEMM "
                                "(each group's sums scaled apart)")
        dt = decoded_tile(lay, num, cfg.BN, cfg.BK, kmajor=True, ce=ce)
        if dt["b_rowb"] % 16:
            raise PlanError(f"raw weight tile rows of {dt['b_rowb']} bytes (TMA boxes need 16+)")
        raw = -(-dt["b_rows"] * dt["b_rowb"] // 1024) * 1024
        dt.update(stored=lay, dec_warps=decode_group_warps(dt))    # stored: the TMA map's layout
    if cfg.min_blocks != 1:
        raise PlanError("tma configs take min_blocks 1")
    if cfg.split_k != 1 and (num.dense or cfg.cluster != 1):
        # Decoded weights: more blocks, so more warps decode (M = 64 has 128 tiles of 64 x 64).
        raise PlanError("split-K tma configs are for decoded weights, cluster 1")
    if cfg.cluster not in (1, 2):
        raise PlanError("clusters of 1 or 2 blocks")
    if cfg.stages < 2:
        raise PlanError("the tma ring needs at least 2 stages")
    consumers = (cfg.BM // 64) * (cfg.BN // cfg.WN)
    if consumers > 2:
        raise PlanError(f"{consumers} MMA warpgroups (at most 2)")
    promote = wgmma_promotes(cfg, num)
    if promote and cfg.WN > 128:
        # The tile's sums and the running ones: WN registers per thread, and
        # 256 leave none of the MMA warps' 232 for anything else.
        raise PlanError(f"wgmma sums added up per k-tile: two sets of {cfg.WN // 2} accumulators "
                        "per thread (WN 64 or 128)")
    regs = (TMA_PRODUCER_REGS, TMA_CONSUMER_REGS) if num.dense else TMA_DECODE_REGS
    if cfg.inflight_sums:
        if not promote:
            raise PlanError("in-flight sums are for wgmma whose sums are added up per k-tile "
                            "(hw.Wgmma.exact_acc false: fp8)")
        # Two tiles' sums and the running ones, plus the loop's addresses and
        # barriers (INFLIGHT_SUMS_SPARE) within the MMA warps' registers.
        if 3 * (cfg.WN // 2) + INFLIGHT_SUMS_SPARE > regs[1]:
            raise PlanError(f"in-flight sums: three sets of {cfg.WN // 2} accumulators per thread "
                            f"and {INFLIGHT_SUMS_SPARE} more do not fit the MMA warps' {regs[1]} registers")
    rowb = cfg.BK * ce                                  # 128: one swizzle atom per row
    stage = (cfg.BM + cfg.BN) * rowb + raw              # multiples of 1024 bytes
    smem = cfg.stages * stage + 1024                    # + slack to align the base
    if smem + STATIC_SMEM_RESERVE > a.smem_per_block:
        raise PlanError(f"{smem} bytes of shared memory > {a.smem_per_block} on {a.name}")
    return dict(dt, threads=128 * (consumers + 1), consumers=consumers, ce=ce, a_bytes=ce,
                a_decode=False, mma_ptx=mma.ptx, acc_int=mma.acc == "s32", dense=num.dense,
                b_kmajor=True, rowb=rowb, stage_bytes=stage, raw_bytes=raw, smem=smem,
                grid_tiles=(cfg.BN, cfg.BM), wgmma=True, tma=True, inflight=1, promote=promote,
                inflight_sums=cfg.inflight_sums,
                target=hw.WGMMA_TARGET[a.name],
                wgmma_types=hw.WGMMAS[num.mma].types, wgmma_tail=hw.WGMMAS[num.mma].tail,
                regs=regs if consumers == 2 else None)


def decode_group_warps(dt: Dict) -> int:
    """Warps per decoding group of the TMA GEMM's producer warpgroup (whose 4
    warps take turns by k-tile in 4 / this groups). More groups overlap more
    tiles, but each lane decodes its share of a tile unrolled: as few warps as
    keep that at 8 vectors and 256 weights or fewer (16 vectors of 32 weights
    spilled under 168 registers)."""
    vec = dt["vec"]
    nvec = dt["b_rows"] * (dt["b_rowb"] // vec.vbytes)
    # a lane's load in one-warp groups, in units of those limits (rounded down)
    load = max(nvec // (32 * 8), nvec * vec.nrows * vec.ncols // (32 * 256))
    return 1 if load <= 1 else 2 if load <= 2 else 4


def tma_box_a(cfg: Config, ce: int) -> Tuple[int, int]:
    """The activations' TMA box (rows, elements of k): one 128-byte swizzle
    atom of k per box; a deeper k-tile (the rs GEMM's 128) takes several."""
    return cfg.BM, min(cfg.BK, 128 // ce)


def boxes(cfg: Config, g: Dict) -> TmaBoxes:
    """The tensor maps' boxes: A one block's rows; dense B each block of a
    cluster its share of the tile's rows (multicast to the others); stored
    words the raw tile, rows of 4-byte elements."""
    if g["dense"]:
        return TmaBoxes(g["ce"], tma_box_a(cfg, g["ce"]), (cfg.BN // cfg.cluster, cfg.BK), cfg.cluster)
    return TmaBoxes(g["ce"], tma_box_a(cfg, g["ce"]), (g["b_rows"], g["b_rowb"] // 4), cfg.cluster,
                    stored=g["stored"])


def stored_rows_ok(g: Dict, cfg: Config, N: int, K: int) -> bool:
    """The TMA map of stored words takes rows of whole 16-byte units."""
    return not g.get("stored") or g["stored"].storage(N, K)[1] % 16 == 0


FAMILY = Family("tma", geometry, kind=lambda cfg, g: "gemm_tma", grid=grid, shape_ok=stored_rows_ok,
                tma=boxes)
