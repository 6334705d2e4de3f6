"""The tensor-core GEMM (gemm.cu.j2): a cp.async ring of activation and
weight tiles, decoded weights through a swizzled shared-memory tile, mma.sync
warps or (sm_90a) wgmma warpgroups. Also the grid every GEMM shares and the
wgmma operand rules the TMA GEMM shares."""
from __future__ import annotations

from typing import Dict

from .. import hw
from ..lower import Layout, Numerics
from ..spec import INT_OUT_DTYPES, Spec
from .config import Config, PlanError
from .execution import byte_lanes
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


def wgmma_promotes(cfg: Config, num: Numerics) -> bool:
    """Whether the config's wgmma sums each k-tile apart (scale-d 0) and adds
    it into a second set of fp32 accumulators: where the tensor cores do not
    keep a full fp32 sum (hw.Wgmma.exact_acc), this bounds the error at one
    k-tile's, whatever K. Twice the accumulator registers."""
    return cfg.wgmma and not hw.WGMMAS[num.mma].exact_acc


def check_byte_lanes(lay: Layout) -> None:
    """What widening codes to int8 needs: int32 words of codes along k in the
    byte-lanes order (the execution layout: planner.execution.byte_lanes)."""
    if not (lay.row_axis == "n" and lay.pack_axis == "k" and lay.elem_bytes == 4
            and lay.order == byte_lanes(lay.P)):
        raise PlanError("8-bit activations read sub-byte codes as int32 words along k in the "
                        "byte-lanes order: the execution spec (planner.execution_spec) stores "
                        "them so where each scale group holds whole int32 words of codes")


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
        if ce != 2 and not num.widen:
            raise PlanError("decoded weights need float16/bfloat16 activations")
        if num.widen:
            check_byte_lanes(lay)
        g.update(decoded_tile(lay, num, BN, BK, k_major(lay), ce))
        b_stage = g["b_rows"] * g["b_rowb"]
        bs = 2 * g["bs_rows"] * g["bs_rowb"]     # decoded tiles, double-buffered
    # Group scales of widened codes: each group's integer sums are scaled into
    # a second (fp32) accumulator when its last k-tile is done.
    flush = num.widen and num.scale_gran == "group"
    promote = wgmma_promotes(cfg, num)
    if flush and num.group % BK:
        raise PlanError(f"group scales of 8-bit products need whole k-tiles per group "
                        f"(BK {BK} does not divide {num.group})")
    int_out = spec.out.dtype in INT_OUT_DTYPES
    if int_out and cfg.split_k != 1:
        raise PlanError(f"split-K sums in fp32: no {spec.out.dtype} output")
    # Stages the pipeline needs (gemm.cu.j2): one more for a decoded tile, one
    # more for the wgmma group kept in flight (none when each tile's sums are
    # added up as soon as they are done).
    inflight = int(cfg.wgmma and num.dense and not promote)
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
    if acc_regs * (1 + (flush or promote)) > most:
        raise PlanError(f"{acc_regs * (1 + (flush or promote))} accumulator registers per thread")
    if num.widen and cfg.min_blocks > 1 and acc_regs > 32:
        # ptxas: 64 accumulators and the widening decode spill 8-16 bytes under
        # two blocks' 128-register cap (tests/codegen/test_compiler.py).
        raise PlanError("widened codes: two resident blocks leave too few registers for "
                        f"{acc_regs} accumulators")
    if num.widen and cfg.wgmma and cfg.split_k > 1 and acc_regs > 64:
        # ptxas: 128 accumulators, the split-K reduction and 2-bit codes'
        # widening spill 8 bytes at 255 registers (the same test).
        raise PlanError(f"widened codes: split-K of {acc_regs} wgmma accumulators per thread")
    g.update(smem=smem, grid_tiles=(BN, BM), wgmma=cfg.wgmma, inflight=inflight, flush=flush,
             promote=promote, int_out=int_out)
    return g


def grid(spec: Spec, cfg: Config) -> GridRule:
    """Every GEMM's grid: (n-tiles, m-tiles in whole clusters -- the extra
    tile stores nothing --, split-K slices)."""
    return GridRule(Axis("N", cfg.BN), Axis("M", cfg.BM, cfg.cluster), Axis("", cfg.split_k))


FAMILY = Family("gemm", geometry, kind=lambda cfg, g: "gemm", grid=grid)
