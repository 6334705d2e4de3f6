"""The tensor-core GEMM (gemm.cu.j2): a cp.async ring of activation and
weight tiles, decoded weights through a swizzled shared-memory tile, mma.sync
warps or (sm_90a) wgmma warpgroups. Also the grid every GEMM shares and the
wgmma operand rules the TMA GEMM shares."""
from __future__ import annotations

from typing import Dict

from .. import hw
from ..lower import Layout, Numerics
from ..spec import Spec
from .config import Config, PlanError
from .launch import Axis, Family, GridRule
from .tiles import STATIC_SMEM_RESERVE, decoded_tile, k_major


def check_wgmma(cfg: Config, a: hw.Arch, num: Numerics, lay: Layout, ce: int) -> None:
    """What the wgmma path needs: sm_90a, one warpgroup per 64 x WN tile,
    both operands K-major in 128-byte swizzled rows (one swizzle atom per row)."""
    if not a.wgmma:
        raise PlanError(f"wgmma needs sm_90a (target {a.name})")
    if cfg.WM != 64 or cfg.WN not in (64, 128, 256):
        raise PlanError("a wgmma warpgroup tile is 64 x 64/128/256")
    if cfg.BK * ce != 128:
        raise PlanError("wgmma tiles have 128-byte rows (BK = 64 for 16-bit, 128 for 8-bit operands)")
    if num.a_decode:
        raise PlanError("wgmma reads A as stored: no widened fp8 activations")
    if not k_major(lay):
        raise PlanError("wgmma here takes K-major weights (decoded or stored [N, K])")


def geometry(spec: Spec, cfg: Config, a: hw.Arch, num: Numerics, lay: Layout) -> Dict:
    mma = hw.MMAS[num.mma]
    ce = mma.a_bytes
    BM, BN, BK, WM, WN = cfg.BM, cfg.BN, cfg.BK, cfg.WM, cfg.WN
    if BM % WM or BN % WN or WM % 16 or WN % 16:
        raise PlanError("warp tile must divide the block tile, in multiples of 16")
    if (BK * ce) % 128:
        raise PlanError("BK * operand bytes must be a multiple of 128 (swizzled rows)")
    threads = (BM // WM) * (BN // WN) * (128 if cfg.wgmma else 32)
    if cfg.wgmma:
        check_wgmma(cfg, a, num, lay, ce)
    if threads > 256 or threads < 64:
        raise PlanError(f"{threads} threads per block")
    a_bytes = hw.MMAS[spec.a.dtype].a_bytes     # stored activation bytes (1 when widened)
    g = dict(threads=threads, ce=ce, a_bytes=a_bytes, a_decode=num.a_decode,
             mma_ptx=mma.ptx, acc_int=mma.acc == "s32", dense=num.dense)
    if num.dense:
        if lay.row_axis == "n":
            g.update(b_kmajor=True, b_rows=BN, b_rowb=BK * ce)
        else:
            if ce != 2:
                raise PlanError("8-bit weights must be stored nt ([N, K]) for the int8/fp8 mma")
            if (BN * ce) % 128:
                raise PlanError("BN * 2 must be a multiple of 128 for nn weights")
            g.update(b_kmajor=False, b_rows=BK, b_rowb=BN * ce)
        b_stage = g["b_rows"] * g["b_rowb"]
        bs = 0
    else:
        if ce != 2:
            raise PlanError("decoded weights need float16/bfloat16 activations")
        g.update(decoded_tile(lay, num, BN, BK, k_major(lay)))
        b_stage = g["b_rows"] * g["b_rowb"]
        bs = 2 * g["bs_rows"] * g["bs_rowb"]     # decoded tiles, double-buffered
    # Stages the pipeline needs (gemm.cu.j2): one more for a decoded tile, one
    # more for the wgmma group kept in flight.
    inflight = int(cfg.wgmma and num.dense)
    need = 2 + (0 if num.dense else 1) + inflight
    if cfg.stages < need:
        raise PlanError(f"this pipeline needs at least {need} stages")
    a_dec = 2 * BM * BK * ce if num.a_decode else 0     # widened A, double-buffered
    stage = BM * BK * a_bytes + b_stage
    if cfg.wgmma:
        # wgmma tiles start on 1024-byte boundaries (the 128-byte swizzle is a
        # function of address bits 7-9): padded stages plus slack to align the base.
        stage = -(-stage // 1024) * 1024
        g.update(stage_bytes=stage, target=hw.WGMMA_TARGET[a.name], wgmma_types=hw.WGMMAS[num.mma].types,
                 wgmma_tail=hw.WGMMAS[num.mma].tail)
    smem = cfg.stages * stage + bs + a_dec + (1024 if cfg.wgmma else 0)
    if smem + STATIC_SMEM_RESERVE > a.smem_per_block:
        raise PlanError(f"{smem} bytes of shared memory > {a.smem_per_block} on {a.name}")
    if cfg.min_blocks > 1 and cfg.min_blocks * (smem + STATIC_SMEM_RESERVE) > a.smem_per_sm:
        raise PlanError(f"{cfg.min_blocks} blocks of {smem} bytes do not fit one SM")
    if cfg.wgmma:
        acc_regs, most = WN // 2, 128          # a 64 x WN fp32 tile over 128 threads
    else:
        acc_regs = (WM // 16) * (WN // 8) * 4
        # fp8 mma.sync on sm_90 runs as two f16 HMMAs plus conversions: fewer accumulators.
        most = 32 if num.mma == "float8_e4m3" else 64
    if acc_regs > most:
        raise PlanError(f"{acc_regs} accumulator registers per thread")
    g.update(smem=smem, grid_tiles=(BN, BM), wgmma=cfg.wgmma, inflight=inflight)
    return g


def grid(spec: Spec, cfg: Config) -> GridRule:
    """Every GEMM's grid: (n-tiles, m-tiles in whole clusters -- the extra
    tile stores nothing --, split-K slices)."""
    return GridRule(Axis("N", cfg.BN), Axis("M", cfg.BM, cfg.cluster), Axis("", cfg.split_k))


FAMILY = Family("gemm", geometry, kind=lambda cfg, g: "gemm", grid=grid)
