"""Tile planner: which kernel configurations are valid for a spec on an arch,
and a heuristic pick for shapes never tuned.

A `Config` is everything the templates need beyond the spec; `geometry()`
derives the template constants from (spec, config) and rejects what cannot
work, with the reason. `candidates()` enumerates the valid ones for a shape.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict, dataclass, fields
from typing import Dict, List, Optional, Tuple

from . import hw
from .lower import (MAC_RUN, Layout, Numerics, Vector, decode_plan, gemv_mac, numerics,
                    pair_table_ok, vector, weight_layout, zero_sub_bits)
from .errors import UserError
from .spec import WEIGHT_CODES, Shape, Spec, Weight

# Alignment rules every kernel relies on (documented in docs/spec.md).
K_ALIGN = 32     # K % 32 == 0: 16-byte rows for every packed format
N_ALIGN = 8      # N % 8 == 0: output pairs and one mma n-tile
STATIC_SMEM_RESERVE = 1024


class PlanError(UserError):
    """A configuration (or shape) the kernels cannot run, with the reason."""


@dataclass(frozen=True)
class Config:
    family: str            # "gemm" | "gemv" | "dequant" (the first stage of a predecode config)
    BM: int = 16
    BN: int = 128
    BK: int = 64
    WM: int = 16
    WN: int = 32
    stages: int = 4
    split_k: int = 1
    warps: int = 4         # gemv: warps per block
    vbytes: int = 16       # gemv: bytes per weight vector load
    mmax: int = 8          # gemv: most rows of a it handles (M <= mmax)
    cols: int = 1          # gemv (weights [N, K]): output columns per warp, sharing activations
    tc: bool = False       # gemv (weights [N, K]): mma.sync on 16 columns per warp, M <= 16
    prefetch: bool = False  # gemv (row SIMT): two register buffers of runs, the next
                            # run's loads in flight while this one is decoded
    min_blocks: int = 1    # gemm: blocks per SM asked of ptxas (__launch_bounds__)
    wgmma: bool = False    # gemm: warpgroup MMA (sm_90a) instead of mma.sync; WM = 64
    predecode: bool = False  # gemm: weights decoded once into a dense [N, K] scratch tensor
                             # (a "dequant" launch), then the dense GEMM on it (large M)
    tma: bool = False      # gemm (wgmma, dense operands): tiles loaded by TMA from a producer
                           # warp into an mbarrier ring, MMA warpgroups only compute
    cluster: int = 1       # gemm (tma): blocks of consecutive m-tiles sharing each weight
                           # tile, which TMA multicasts to all of them (halves its L2 reads)
    raster: int = 0        # gemm (tma): 0 = blocks in row order; G = bands of G m-tiles,
                           # walked down before moving along n (L2 reuse between blocks)
    rs: bool = False       # gemm (tma, 4-bit codes): operands swapped, D[n, m] = W . A^T: the
                           # weights are wgmma's register operand, decoded by the MMA warps
                           # straight into fragments (no shared-memory round trip), the
                           # activations its shared-memory one (BM = the m-tile = wgmma's N)
    kgroups: int = 1       # gemm (rs): MMA warpgroups per 64 weight rows, taking turns by k-tile
                           # (one's decode and wgmma latency hide behind the others'), summed
                           # in shared memory at the end

    @property
    def name(self) -> str:
        if self.family == "dequant":
            return f"dequant_{self.BN}x{self.BK}"
        if self.family == "gemv":
            cols = f"_c{self.cols}" if self.cols != 1 else ""
            tc = "_tc" if self.tc else ""
            pf = "_pf" if self.prefetch else ""
            return f"gemv_m{self.mmax}_w{self.warps}{cols}_v{self.vbytes}_s{self.split_k}{tc}{pf}"
        occ = f"_o{self.min_blocks}" if self.min_blocks != 1 else ""
        wg = "_wg" if self.wgmma else ""
        pd = "_pd" if self.predecode else ""
        tma = "_tma" if self.tma else ""
        cl = f"_x{self.cluster}" if self.cluster != 1 else ""
        ra = f"_r{self.raster}" if self.raster else ""
        rs = (f"_rs{self.kgroups}" if self.kgroups != 1 else "_rs") if self.rs else ""
        return (f"gemm_{self.BM}x{self.BN}x{self.BK}_w{self.WM}x{self.WN}"
                f"_p{self.stages}_s{self.split_k}{occ}{wg}{tma}{cl}{ra}{rs}{pd}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def check_shape(spec: Spec, N: int, K: int) -> None:
    """The alignment rule, stated once; raises PlanError naming it."""
    w = spec.b
    problems = []
    if K % K_ALIGN:
        problems.append(f"K={K} must be a multiple of {K_ALIGN}")
    if N % N_ALIGN:
        problems.append(f"N={N} must be a multiple of {N_ALIGN}")
    if w is not None and w.scale is not None and w.scale.granularity == "group" and K % w.scale.group:
        problems.append(f"K={K} must be a multiple of the scale group {w.scale.group}")
    if w is not None and w.pack is not None and w.pack.axis == "n":
        P = weight_layout(spec).P
        if N % P:
            problems.append(f"N={N} must be a multiple of {P} (codes per word, packed along n)")
    if w is not None:
        lay = weight_layout(spec)
        # Weights stored [K, N]: tiles are copied in 16-byte chunks from each row.
        unit = 16 * lay.col_div // lay.elem_bytes
        if lay.row_axis == "k" and N % unit:
            problems.append(f"N={N} must be a multiple of {unit} (weights stored [K, N] need "
                            "16-byte rows)")
    for dim, want, got in (("N", spec.shape.N, N), ("K", spec.shape.K, K)):
        if want is not None and want != got:
            problems.append(f"{dim}={got} but the spec fixes {dim}={want}")
    if problems:
        raise PlanError("; ".join(problems))


def _vector_bytes(lay: Layout, rowb: int, group: int, k_extent_max: int) -> Optional[int]:
    """The widest weight vector that fits the tile row and one scale group,
    preferring those spanning at most 8 columns n (each needs its own scale and
    zero in registers)."""
    fits = []
    for vb in (16, 8, 4):
        if rowb % vb or vb % lay.elem_bytes:
            continue
        v = vector(lay, vb)
        if v.k_extent > k_extent_max or (group and group % v.k_extent):
            continue
        fits.append((v.n_extent > 8, vb))
    return min(fits, key=lambda f: (f[0], -f[1]))[1] if fits else None


def geometry(spec: Spec, cfg: Config, arch: str) -> Dict:
    """Template constants for (spec, cfg, arch), or PlanError saying why not."""
    a = hw.arch(arch)
    num = numerics(spec, fp8_mma=a.fp8_mma)
    mma = hw.MMAS[num.mma]
    if mma.min_cc > a.cc:
        raise PlanError(f"{num.mma} activations need sm_{mma.min_cc}+ tensor cores (target {arch})")
    lay = weight_layout(spec)
    if cfg.family == "gemv":
        return _gemv_geometry(spec, cfg, a, num, lay)
    if cfg.family == "dequant":
        return _dequant_geometry(spec, cfg, num, lay)
    if cfg.predecode:
        if num.dense:
            raise PlanError("predecode is for weights that need decoding")
        _dequant_geometry(spec, DEQUANT, num, lay)       # the first stage must fit too
        dense = geometry(dense_twin(spec), dataclasses.replace(cfg, predecode=False), arch)
        return dict(dense, predecode=True)
    ce = mma.a_bytes
    if cfg.rs:
        return _rs_geometry(cfg, a, num, lay)
    if cfg.tma or cfg.cluster != 1 or cfg.raster:
        return _tma_geometry(cfg, a, num, lay, mma)
    BM, BN, BK, WM, WN = cfg.BM, cfg.BN, cfg.BK, cfg.WM, cfg.WN
    if BM % WM or BN % WN or WM % 16 or WN % 16:
        raise PlanError("warp tile must divide the block tile, in multiples of 16")
    if (BK * ce) % 128:
        raise PlanError("BK * operand bytes must be a multiple of 128 (swizzled rows)")
    threads = (BM // WM) * (BN // WN) * (128 if cfg.wgmma else 32)
    if cfg.wgmma:
        _check_wgmma(cfg, a, num, lay, ce)
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
        g.update(_decoded_tile(lay, num, BN, BK, _k_major(lay)))
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
    # Static shared memory (codebook, split-K flag) shares the opt-in limit.
    if smem + STATIC_SMEM_RESERVE > a.smem_per_block:
        raise PlanError(f"{smem} bytes of shared memory > {a.smem_per_block} on {arch}")
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


def tma_box_a(cfg: Config, ce: int) -> Tuple[int, int]:
    """The activations' TMA box (rows, elements of k): one 128-byte swizzle
    atom of k per box; a deeper k-tile (the swapped GEMM's 128) takes several."""
    return cfg.BM, min(cfg.BK, 128 // ce)


def _launch_cap(threads: int) -> int:
    """ptxas's register cap per thread under __launch_bounds__(threads, 1):
    the register file over whole warpgroups (measured: 288 threads -> 168)."""
    return min(255, 65536 // (-(-threads // 128) * 128) // 8 * 8)


# Registers per thread after setmaxnreg (a producer warpgroup beside MMA
# warpgroups). setmaxnreg.inc only takes what the block's other warps gave
# back: the split must fit the block's launch allocation (two MMA warpgroups:
# 384 threads x 168 = 64512), or the MMA warps wait forever (a 96 / 208
# split, 256 registers over, hung on the H200).
TMA_BLOCK_REGS = 384 * _launch_cap(384)


def _consumer_regs(producer: int, consumers: int = 2) -> int:
    threads = 128 * (consumers + 1)
    return min(256, (threads * _launch_cap(threads) - 128 * producer) // (128 * consumers) // 8 * 8)


TMA_PRODUCER_REGS = 40                                   # the producer only issues TMA
TMA_CONSUMER_REGS = _consumer_regs(TMA_PRODUCER_REGS)    # 232
# ... when the producer warpgroup also decodes the weights: 96 / 200.
TMA_DECODE_REGS = (96, _consumer_regs(96))


def _tma_geometry(cfg: Config, a: hw.Arch, num: Numerics, lay: Layout, mma: hw.Mma) -> Dict:
    """The warp-specialized GEMM (gemm_tma.cu.j2): dense K-major operands, one
    producer warpgroup issuing TMA loads into a STAGES-deep mbarrier ring, one
    or two MMA warpgroups, optional multicast of the weight tile to a cluster
    of blocks along M."""
    if not cfg.tma:
        raise PlanError("clusters and rasters are for tma configs")
    if not (a.tma and cfg.wgmma):
        raise PlanError(f"tma configs are wgmma configs on sm_90a (target {a.name})")
    if not _k_major(lay) or (num.dense and lay.row_axis != "n"):
        raise PlanError("tma configs take dense weights stored [N, K], or codes packed along k")
    ce = mma.a_bytes
    _check_wgmma(cfg, a, num, lay, ce)
    dt, raw = {}, 0
    if not num.dense:
        # Decoded weights: the producer warpgroup TMA-loads the raw tile into
        # the stage and decodes it into the stage's B tile for the MMA warps.
        if cfg.cluster != 1:
            raise PlanError("tma configs on decoded weights load their own tiles (cluster 1)")
        dt = _decoded_tile(lay, num, cfg.BN, cfg.BK, kmajor=True)
        if dt["b_rowb"] % 16:
            raise PlanError(f"raw weight tile rows of {dt['b_rowb']} bytes (TMA boxes need 16+)")
        raw = -(-dt["b_rows"] * dt["b_rowb"] // 1024) * 1024
        dt.update(stored=lay, dec_warps=_decode_group_warps(dt))    # stored: the TMA map's layout
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
    regs = (TMA_PRODUCER_REGS, TMA_CONSUMER_REGS) if num.dense else TMA_DECODE_REGS
    rowb = cfg.BK * ce                                  # 128: one swizzle atom per row
    stage = (cfg.BM + cfg.BN) * rowb + raw              # multiples of 1024 bytes
    smem = cfg.stages * stage + 1024                    # + slack to align the base
    if smem + STATIC_SMEM_RESERVE > a.smem_per_block:
        raise PlanError(f"{smem} bytes of shared memory > {a.smem_per_block} on sm_90")
    return dict(dt, threads=128 * (consumers + 1), consumers=consumers, ce=ce, a_bytes=ce,
                a_decode=False, mma_ptx=mma.ptx, acc_int=mma.acc == "s32", dense=num.dense,
                b_kmajor=True, rowb=rowb, stage_bytes=stage, raw_bytes=raw, smem=smem,
                grid_tiles=(cfg.BN, cfg.BM), wgmma=True, tma=True, inflight=1,
                target=hw.WGMMA_TARGET[a.name],
                wgmma_types=hw.WGMMAS[num.mma].types, wgmma_tail=hw.WGMMAS[num.mma].tail,
                regs=regs if consumers == 2 else None)


# The swapped GEMM's m-tiles (wgmma N) and n-tiles (64 weight rows per MMA warpgroup).
RS_TILES_M = (16, 32, 64, 128, 256)
RS_TILES_N = (64, 128)
RS_TILES_K = (64, 128)       # measured (run12): 256 slower than 128 at M = 16 / 64 / 128
RS_STAGES = (4, 6, 8, 12)
# Registers an MMA thread of the swapped GEMM takes, by (BK, BM): the most
# ptxas gave w4a16_sym over blocks, ring depths and k-groups (tests/runtime/
# test_compiler.py keeps these upper bounds true).
RS_REGS = {(64, 16): 72, (64, 32): 82, (64, 64): 96, (64, 128): 125, (64, 256): 185,
           (128, 16): 95, (128, 32): 96, (128, 64): 124, (128, 128): 159}
# ... with integer zero points (the GPTQ *_repacked specs: two more items in
# flight per row, their addresses): the most ptxas took under the caps of
# one and two MMA warpgroups, except at (128, 16), where every config fits
# four warpgroups' cap of 96 without spilling (it takes up to 117 where it
# may). Four 128-deep k-groups of 32 rows and up do not fit.
RS_REGS_INT_ZERO = {(64, 16): 91, (64, 32): 93, (64, 64): 107, (64, 128): 140, (64, 256): 205,
                    (128, 16): 96, (128, 32): 127, (128, 64): 128, (128, 128): 167}


def _rs_geometry(cfg: Config, a: hw.Arch, num: Numerics, lay: Layout) -> Dict:
    """The swapped GEMM (gemm_rs.cu.j2): one producer warp (a warpgroup that
    hands registers over by setmaxnreg, where the MMA threads need more than
    the launch allows) TMA-loads the activation tile (BK / 64 boxes of
    BM x 64, the 128-byte swizzle: wgmma's B operand from shared memory) and
    the stored words of BN weight rows (BK / 2 bytes each) into a STAGES-deep
    ring. Each MMA warpgroup owns 64 weight rows, and each lane decodes
    exactly the codes of its own A fragments (rows g and g + 8 of its warp's
    16, k = 2q, 2q + 1 and 2q + 8, 2q + 9 of every k16 step) from the stored
    words: pair q of every 32-bit word, which the interleaved pack order
    0, 2, 4, 6, 1, 3, 5, 7 puts at bits 4q and 16 + 4q, so one shift, one lop3
    with the magic number, one subtract (of the magic number, with integer
    zero points its row's zero too) and one scale per pair."""
    if not (a.tma and a.wgmma and cfg.tma and cfg.wgmma):
        raise PlanError(f"the swapped GEMM is a tma wgmma config on sm_90a (target {a.name})")
    if num.dense or lay.bits != 4 or lay.row_axis != "n" or lay.pack_axis != "k":
        raise PlanError("the swapped GEMM takes 4-bit codes stored [N, K], packed along k")
    word = vector(lay, 4)
    if [(word.dk[p.ia], word.dk[p.ib], p.shift) for p in word.pairs] != \
            [(2 * q, 2 * q + 1, 4 * q) for q in range(4)]:
        raise PlanError("the swapped GEMM needs the pack order 0, 2, 4, 6, 1, 3, 5, 7 "
                        "(pair q of a word = k 2q, 2q + 1 at bits 4q, 16 + 4q)")
    dec = decode_plan(lay, num)
    int_zero = num.zero_kind == "int" and \
        zero_sub_bits(num, dec, WEIGHT_CODES[num.zero_dtype].bits) is not None
    if dec.method != "magic" or num.formula != "(q - z) * s" \
            or not (num.zero_kind in ("none", "const") or int_zero):
        raise PlanError("the swapped GEMM decodes (q - z) * s codes by the magic number, the zero "
                        "point a constant or an integer that joins the subtract as an integer add")
    if num.scale_gran != "group" or not num.scale_native:
        raise PlanError("the swapped GEMM takes group scales stored as the activations' type")
    if num.group % cfg.BK:
        raise PlanError(f"scale groups of {num.group} split a {cfg.BK}-deep k-tile")
    if cfg.BK not in RS_TILES_K or cfg.WM != 64 or cfg.WN != cfg.BM or cfg.BM not in RS_TILES_M \
            or cfg.BN not in RS_TILES_N:
        raise PlanError(f"swapped tiles: BK in {RS_TILES_K}, BM (wgmma N) in {RS_TILES_M}, "
                        f"BN in {RS_TILES_N}")
    if cfg.cluster != 1 or cfg.raster or cfg.min_blocks != 1 or cfg.stages < 2:
        raise PlanError("the swapped GEMM: no cluster or raster, min_blocks 1, 2+ stages")
    if cfg.split_k != 1:
        # Measured: split-K 2 took 1.8x the unsplit time at M = 64 with an
        # identical main loop (run9/rs1_*); k-groups split k inside the block.
        raise PlanError("the swapped GEMM splits k between k-groups, not blocks (split_k 1)")
    if cfg.kgroups not in (1, 2, 4):
        raise PlanError("1, 2 or 4 k-groups of MMA warpgroups")
    if cfg.stages % cfg.kgroups:
        # Slot s must always serve the same k-group: one that ran a round
        # ahead would read a slot's next-but-one phase as complete (the
        # mbarrier parity aliases; p6 with 4 k-groups faulted, run12).
        raise PlanError(f"{cfg.stages} stages do not split evenly between {cfg.kgroups} k-groups")
    a_tile, w_rowb = cfg.BM * cfg.BK * 2, cfg.BK // 2      # (BK / 64 swizzled boxes of BM x 64)
    w_tile = -(-cfg.BN * w_rowb // 1024) * 1024
    # The k-groups' partial sums meet in shared memory once the ring is drained.
    red = (cfg.kgroups - 1) * (cfg.BN // 64) * 128 * (cfg.BM // 2) * 4
    smem = max(cfg.stages * (a_tile + w_tile), red) + 1024
    if smem + STATIC_SMEM_RESERVE > a.smem_per_block:
        raise PlanError(f"{smem} bytes of shared memory > {a.smem_per_block} on sm_90")
    consumers = cfg.BN // 64 * cfg.kgroups
    need = (RS_REGS_INT_ZERO if int_zero else RS_REGS)[cfg.BK, cfg.BM]   # (every tile that fits)
    threads, regs = 128 * consumers + 32, None
    if threads > 1024:
        raise PlanError(f"{consumers} MMA warpgroups: {threads} threads per block")
    if need > _launch_cap(threads):
        # A producer warpgroup instead of a warp: it hands registers back
        # (setmaxnreg) for the MMA warpgroups to take.
        threads = 128 * (consumers + 1)
        up = _consumer_regs(TMA_PRODUCER_REGS, consumers)
        if need > up:
            raise PlanError(f"{need} registers per thread > {up} for {consumers} MMA warpgroups")
        regs = (TMA_PRODUCER_REGS, up)
    mma = hw.MMAS[num.mma]
    # k-tiles of one scale group that a k-group takes in a row (one scale and
    # zero load for all of them), where the ring's slots still each serve
    # one k-group.
    tpg = num.group // cfg.BK
    if cfg.kgroups > 1 and cfg.stages % (cfg.kgroups * tpg):
        tpg = 1
    return dict(threads=threads, consumers=consumers, regs=regs, tpg=tpg, ce=2, a_bytes=2, a_decode=False,
                dense=False, tma=True, rs=True, wgmma=True, stored=lay, b_rows=cfg.BN,
                b_rowb=w_rowb, a_tile=a_tile, w_tile=w_tile, smem=smem,
                grid_tiles=(cfg.BN, cfg.BM), acc_int=False, mma_ptx=mma.ptx, inflight=1,
                target=hw.WGMMA_TARGET[a.name], wgmma_types=hw.WGMMAS[num.mma].types)


def _decode_group_warps(dt: Dict) -> int:
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


def _decoded_tile(lay: Layout, num: Numerics, BN: int, BK: int, kmajor: bool) -> Dict:
    """A BN x BK tile of stored weight words (b_rows x b_rowb bytes, copied in
    b_chunk pieces) and the swizzled compute tile it decodes into (bs_rows x
    bs_rowb bytes; K-major: BN rows of BK elements), vector by vector."""
    extent = {"n": BN, "k": BK}
    rows = extent[lay.row_axis] // lay.row_div
    rowb = extent[lay.col_axis] // lay.col_div * lay.elem_bytes
    if extent[lay.row_axis] % lay.row_div or extent[lay.col_axis] % lay.col_div or rowb < 4:
        raise PlanError("tile does not hold whole weight words")
    chunk = next((c for c in (16, 8, 4) if rowb % c == 0), None)
    group = num.group
    vb = _vector_bytes(lay, rowb, group, BK)
    if vb is None:
        raise PlanError(f"no 4/8/16-byte weight vector lies inside one scale group of {group} "
                        f"and one {BN}x{BK} tile" if group else
                        f"no 4/8/16-byte weight vector fits one {BN}x{BK} tile")
    vec = vector(lay, vb)
    bs_rows, bs_rowb = (BN, BK * 2) if kmajor else (BK, BN * 2)
    if bs_rowb % 128:
        raise PlanError("decoded tile rows must be a multiple of 128 bytes")
    return dict(b_kmajor=kmajor, b_rows=rows, b_rowb=rowb, b_chunk=chunk,
                bs_rows=bs_rows, bs_rowb=bs_rowb, vec=vec, stores=_stores(vec, kmajor))


# The dequant stage of every predecode config: one 128 x 64 tile per block.
DEQUANT = Config("dequant", BN=128, BK=64)
DEQUANT_THREADS = 256
DEQUANT_KSPLIT = 16          # blocks along k (each walks every 16th k-tile of its rows)


def _dequant_geometry(spec: Spec, cfg: Config, num: Numerics, lay: Layout) -> Dict:
    """The dequant kernel: a tile of stored words -> the K-major decoded tile
    (the GEMM's decode, shared) -> dense [N, K] rows in global memory."""
    if num.dense:
        raise PlanError("dense weights need no dequant stage")
    if spec.a.dtype not in ("float16", "bfloat16"):
        raise PlanError("predecoded weights are float16/bfloat16 (the activation dtype)")
    g = _decoded_tile(lay, num, cfg.BN, cfg.BK, kmajor=True)
    smem = g["b_rows"] * g["b_rowb"] + g["bs_rows"] * g["bs_rowb"]
    return dict(g, threads=DEQUANT_THREADS, smem=smem, a_decode=False, dense=False)


@functools.lru_cache(maxsize=None)
def dense_twin(spec: Spec) -> Spec:
    """What the GEMM of a predecode config multiplies: the same op on dense
    weights of the activation dtype, stored [N, K], scales already applied."""
    # Named by what the dense kernel depends on, so formats share its kernels.
    epi = spec.epilogue
    name = "_".join(["dense", spec.a.dtype, spec.out.dtype] + (["bias"] if epi.bias else [])
                    + ([epi.activation] if epi.activation != "none" else []))
    return dataclasses.replace(spec, name=name, description="", shape=Shape(),
                               b=Weight(dtype=spec.a.dtype, layout="nt"))


def stages(spec: Spec, cfg: Config) -> List[Tuple[Spec, Config]]:
    """The kernels one config launches, in order, each a (spec, config) that
    compiles on its own: the config itself, or for predecode the dequant
    stage of spec and then the dense GEMM of its twin."""
    if not cfg.predecode:
        return [(spec, cfg)]
    return [(spec, DEQUANT), (dense_twin(spec), dataclasses.replace(cfg, predecode=False))]


def _k_major(lay: Layout) -> bool:
    """Whether the weight tile the MMA reads is K-major: codes packed along k,
    or unpacked weights stored [N, K]."""
    return lay.pack_axis == "k" or (lay.pack_axis is None and lay.row_axis == "n")


def _check_wgmma(cfg: Config, a: hw.Arch, num: Numerics, lay: Layout, ce: int) -> None:
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
    if not _k_major(lay):
        raise PlanError("wgmma here takes K-major weights (decoded or stored [N, K])")


def _stores(vec: Vector, kmajor: bool) -> List[dict]:
    """Group a vector's elements into contiguous runs along the decoded tile's
    inner axis, cut into aligned 16/8/4/2-byte shared-memory stores."""
    lines: Dict[int, List[Tuple[int, int]]] = {}
    for e, (dn, dk) in enumerate(zip(vec.dn, vec.dk)):
        line, inner = (dn, dk) if kmajor else (dk, dn)
        lines.setdefault(line, []).append((inner, e))
    out = []
    vt = {8: "uint4", 4: "uint2", 2: "uint32_t", 1: "unsigned short"}
    for line, items in sorted(lines.items()):
        items.sort()
        inners = [i for i, _ in items]
        assert inners == list(range(inners[0], inners[0] + len(inners))), "non-contiguous run"
        pos = 0
        while pos < len(items):
            cnt = 8
            while cnt > 1 and (pos + cnt > len(items) or (items[pos][0] % cnt)):
                cnt //= 2
            out.append(dict(line=line, inner=items[pos][0], count=cnt, vec_t=vt[cnt],
                            elems=[e for _, e in items[pos:pos + cnt]]))
            pos += cnt
    return out


def _gemv_geometry(spec: Spec, cfg: Config, a: hw.Arch, num: Numerics, lay: Layout) -> Dict:
    if spec.a.dtype not in ("float16", "bfloat16"):
        raise PlanError("the GEMV family takes float16/bfloat16 activations")
    if lay.row_axis == "n" and lay.row_div != 1:
        raise PlanError("GEMV needs nt weights packed along k")
    vb = cfg.vbytes
    if vb % lay.elem_bytes or vb % 4:
        raise PlanError("vector bytes must hold whole words")
    # 4-bit codebooks: one table load per byte of codes (pairs of nibbles)
    pair_table = pair_table_ok(lay, num)
    vec = vector(lay, vb, byte_pairs=pair_table)
    if num.group and num.group % vec.k_extent:
        raise PlanError("weight vector crosses a scale group")
    scheme = "row" if lay.row_axis == "n" else "col"
    run = gemv_run(cfg, num, vec, scheme)
    if cfg.prefetch and (cfg.tc or lay.row_axis != "n"):
        raise PlanError("prefetch applies to the SIMT row GEMV (weights [N, K]; the "
                        "tensor-core one loads its first run early)")
    if scheme == "col":
        if cfg.tc:
            raise PlanError("the tensor-core GEMV takes weights stored [N, K]")
        if cfg.cols != 1:
            raise PlanError("columns per warp apply to the row GEMV (weights [N, K])")
        if vec.ncols % 2:
            raise PlanError("the column GEMV stores output pairs: a weight vector must span an "
                            "even number of columns n")
        # 16+ columns per lane (AWQ 8/16-byte vectors) take 240+ registers even at mmax 1.
        if cfg.mmax * vec.n_extent > 64 or vec.n_extent > 8:
            raise PlanError("too many accumulators per thread (mmax x vector width)")
    elif cfg.tc:
        _check_tc_gemv(cfg, num, vec)
    elif _row_gemv_regs(cfg, vec, run) > GEMV_REGS:
        raise PlanError(f"~{_row_gemv_regs(cfg, vec, run)} registers of live values per thread "
                        f"(limit {GEMV_REGS})")
    return dict(threads=cfg.warps * 32, scheme=scheme, vec=vec, dec=decode_plan(lay, num, pair_table),
                smem=GEMV_SMEM_CAP if scheme == "row" else 0, run=run, num_group=num.group,
                mac=gemv_mac(vec), mac_run=MAC_RUN)


# The row GEMV stages its rows of activations in shared memory, [mmax, K / split_k]
# (16 KiB at M = 1, K = 8192); slices past this cap need split-K.
GEMV_SMEM_CAP = 64 << 10
# Live values per GEMV thread the planner allows (ptxas has 255 registers;
# the rest go to addresses, loop state and the decode's temporaries).
GEMV_REGS = 160


def launch_smem(g: Dict, cfg: Config, K: int) -> int:
    """Dynamic shared memory of one launch: fixed per config, except the row
    GEMV's activation rows, which take K / split_k."""
    if cfg.family == "gemv" and g["scheme"] == "row":
        return cfg.mmax * -(-(K // cfg.split_k) * 2 // 128) * 128      # rows of whole lines
    return g.get("smem", 0)


# Bytes of weights each GEMV thread keeps in flight: 8 x 16-byte loads. At the
# ~16 resident warps per SM a one-wave grid gives, that is 64 KB per SM, about
# twice what Little's law asks of HBM3e (4.3 TB/s x ~1 us / 132 SMs).
GEMV_BYTES_IN_FLIGHT = 128


def _check_tc_gemv(cfg: Config, num: Numerics, vec: Vector) -> None:
    """The tensor-core GEMV: a warp's 16 weight rows are the A operand of
    m16n8k16 (each quad of lanes holds 4 consecutive vectors of a row), the
    staged activations the B operand (one m16n8k16 per 8 rows of M, M <= 16);
    fp32 sums of raw (q - z) [or q, and of a, for q * s - z] are scaled once
    per k-block of 4 vectors, which must therefore lie in one scale group."""
    if cfg.cols != 1:
        raise PlanError("the tensor-core GEMV has 16 columns per warp (cols 1)")
    if cfg.mmax > 16:
        raise PlanError("the tensor-core GEMV takes at most 16 rows of activations")
    if vec.k_extent % 8:
        raise PlanError("the tensor-core GEMV needs 8+ weights per vector (one k16 step per quad)")
    if num.group and num.group % (4 * vec.k_extent):
        raise PlanError("a quad's 4 vectors must lie in one scale group")


def _row_gemv_regs(cfg: Config, vec: Vector, run: int) -> int:
    """Live values per thread of the row GEMV: a run of raw words with their
    scales and zeros (two runs with prefetch), the activation pairs of every
    row, one decoded vector, the accumulators (fp32 + fp16x2 slots)."""
    mac = gemv_mac(vec)
    buffers = 2 if cfg.prefetch else 1
    return (buffers * run * cfg.cols * (vec.words + 2) + cfg.mmax * len(mac.apairs)
            + len(vec.pairs) + cfg.mmax * cfg.cols * (1 + len(mac.slots)))


def gemv_run(cfg: Config, num: Numerics, vec: Vector, scheme: str) -> int:
    """Vectors per thread per step (loaded together before any is decoded).
    Column scheme: consecutive rows inside one scale group, so the run shares
    one scale / zero load. Row scheme: as long as the registers allow."""
    # mmax >= 4 keeps 4x the accumulators: half the run (gptq at mmax 4 spilled).
    # Prefetch: the two buffers together hold what one run holds without it.
    run = max(1, GEMV_BYTES_IN_FLIGHT // (cfg.vbytes * cfg.cols) // (2 if cfg.mmax >= 4 else 1)
              // (2 if cfg.prefetch else 1))
    if scheme == "col" and num.group:
        while run > 1 and (num.group // vec.k_extent) % run:
            run //= 2
    if scheme == "row" and cfg.tc:
        # k-blocks in flight: two vectors each (rows g and g + 8), both decoded at once.
        return max(1, GEMV_BYTES_IN_FLIGHT // (2 * cfg.vbytes))
    if scheme == "row":
        while run > 1 and _row_gemv_regs(cfg, vec, run) > GEMV_REGS:
            run //= 2
    return run


def shape_ok(g: Dict, cfg: Config, N: int, K: int) -> bool:
    if g.get("stored"):
        # the TMA map of stored words: rows of whole 16-byte units
        return g["stored"].storage(N, K)[1] % 16 == 0
    if cfg.family == "gemv":
        vec = g["vec"]
        if g["scheme"] == "row":
            blk = vec.k_extent * (4 if cfg.tc else 1) * cfg.split_k     # tc: k-blocks of 4 vectors
            return K % blk == 0 and launch_smem(g, cfg, K) <= GEMV_SMEM_CAP
        if N % vec.n_extent or K % (vec.k_extent * cfg.split_k):
            return False
        # Runs stay inside one scale group only if every slice starts a group's run.
        return not g["num_group"] or (K // cfg.split_k) % (g["run"] * vec.k_extent) == 0
    return True


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
# Where the heuristic takes it, by what the fused GEMM pays per decoded tile.
# Tuner logs: run3 (all five bench shapes, cp.async dense GEMM) and run4
# (8192^2, the TMA dense GEMM behind the dequant). Without a fused wgmma path
# (AWQ's [K, N] words) and with zero points loaded per group (GPTQ, w1a16)
# predecode wins from M = 256 (run4: gptq_v2 122 vs 138 us, w1a16 115 vs
# 128); for the others (w4a16_sym, w2a16, bitnet, NF4, MXFP4, fp8 weights)
# the fused GEMM still wins at 256 and predecode from 512 (run4, M = 1024:
# 1.2-1.5x over the fused pick for every format). The swapped GEMM (4-bit
# codes in the interleaved order) beat predecode at M = 1024 at all five
# bench shapes and at M = 4096 at the two smallest (run14 tuning log,
# gptq_v2_w4a16_g128_repacked: 195 vs 249 us at 8192^2, M = 1024).
PREDECODE_M = {"no_fused_wgmma": PREDECODE_MIN_M, "zero_points": PREDECODE_MIN_M, "other": 512,
               "swapped_gemm": 2048}


def predecode_from(spec: Spec, cands: List[Config]) -> int:
    """The M from which the heuristic picks a predecode config (PREDECODE_M)."""
    if not any(c.wgmma and not c.predecode for c in cands):
        return PREDECODE_M["no_fused_wgmma"]
    if any(c.rs for c in cands):
        return PREDECODE_M["swapped_gemm"]
    if numerics(spec).zero_kind in ("int", "float"):
        return PREDECODE_M["zero_points"]
    return PREDECODE_M["other"]


SPLITS = (1, 2, 4, 8)
# GEMV column blocks are 32 vectors wide (512-1024 columns for AWQ): narrow N
# needs deeper split-K to fill the SMs.
GEMV_SPLITS = (1, 2, 4, 8, 16)


def all_configs() -> List[Config]:
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
            for stages in STAGES:
                out.append(Config("gemm", BM, BN, 64, 64, WN, stages, 1, wgmma=True, predecode=True))
    for (BM, BN, WN) in WGMMA_TILES:
        for BK in (64, 128):
            for stages in TMA_STAGES:
                for cl in (1, 2):
                    for ra in TMA_RASTERS:
                        out.append(Config("gemm", BM, BN, BK, 64, WN, stages, 1, wgmma=True, tma=True,
                                          cluster=cl, raster=ra))
                        if BM == 128 and BK == 64 and stages <= 4:
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
                        out.append(Config("gemm", BM, BN, BK, 64, BM, stages, 1, wgmma=True, tma=True,
                                          rs=True, kgroups=kg))
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


def candidates(spec: Spec, arch: str, M: int, N: int, K: int, sms: int = 132) -> List[Config]:
    """Valid configurations worth timing for this problem size: GEMV only for
    M <= 16 (above 8 the tensor-core one) and with the smallest mmax >= M;
    GEMM tiles between M/4 (at most 64) and 2M rows; predecode from M = 256;
    split-K only while the grid stays under 8 waves and slices keep 4 k-tiles."""
    check_shape(spec, N, K)
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


def grid(spec: Spec, cfg: Config, M: int, N: int) -> Tuple[int, int, int]:
    """The launch grid: GEMM tiles (n, m, split-K slice); GEMV blocks of output
    columns (`cols` columns per warp when weights are [N, K], one lane per
    weight vector when [K, N]) by split-K slice."""
    if cfg.family == "gemm":
        m_tiles = -(-M // cfg.BM)
        m_tiles += -m_tiles % cfg.cluster        # whole clusters (the extra tile stores nothing)
        return (-(-N // cfg.BN), m_tiles, cfg.split_k)
    if cfg.family == "dequant":
        return (-(-N // cfg.BN), DEQUANT_KSPLIT, 1)
    lay = weight_layout(spec)
    if lay.row_axis == "n":
        return (-(-N // (cfg.warps * (16 if cfg.tc else cfg.cols))), cfg.split_k, 1)
    n_per_block = 32 * vector(lay, cfg.vbytes).n_extent
    return (-(-N // n_per_block), cfg.split_k, 1)


def blocks(spec: Spec, cfg: Config, M: int, N: int) -> int:
    """Thread blocks one launch of cfg runs."""
    x, y, z = grid(spec, cfg, M, N)
    return x * y * z


def gemv_fill(spec: Spec, cfg: Config, M: int, N: int, K: int) -> Tuple[int, int]:
    """(resident-worthy warps of one launch, warps of a block left without a
    run of rows): the GEMV streams at copy speed only with ~12+ warps of
    8 loads in flight on every SM."""
    lay = weight_layout(spec)
    vec = vector(lay, cfg.vbytes)
    warps = blocks(spec, cfg, M, N) * cfg.warps
    if lay.row_axis == "n":
        return warps, 0
    num = numerics(spec)
    runs = (K // cfg.split_k) // vec.k_extent // gemv_run(cfg, num, vec, "col")
    return warps, max(0, cfg.warps - runs)


# Relative per-SM speed of the TMA GEMM's tile shapes (BM, BN): larger tiles
# move fewer bytes per flop. Fitted by hand to the run4 winners
# (bench/results/h200/run4/tuned_h200.json): with it `_tma_score` picks the
# winner's tile in most records of the five bench shapes.
TMA_TILE_SPEED = {(128, 256): 1.0, (128, 128): 0.9, (64, 256): 0.85, (64, 128): 0.75, (64, 64): 0.6}


def _tma_score(c: Config, M: int, N: int, sms: int) -> tuple:
    """Waves of tiles times the time of one tile, then: two MMA warpgroups
    where the tile has room, no cluster (multicast measured no faster:
    run4/sweep.txt), the grouped raster once there are two bands of m-tiles,
    the deepest ring."""
    tiles = -(-N // c.BN) * -(-M // c.BM)
    cost = -(-tiles // sms) * c.BM * c.BN / TMA_TILE_SPEED[(c.BM, c.BN)]
    return (round(cost), -(c.BM // 64) * (c.BN // c.WN), c.cluster != 1,
            c.raster != (8 if M > c.BM else 0), -c.stages)


def heuristic(spec: Spec, arch: str, M: int, N: int, K: int, sms: int = 132) -> Config:
    """A reasonable pick without tuning: for weights stored [N, K] and
    M = 2-16 the tensor-core GEMV; for decode (M <= 4) the GEMV whose
    grid puts 12+ warps on every SM (or as many as it can) with no idle warps,
    then the fewest split-K slices, the most columns per warp and the widest
    loads; decoded weights from `predecode_from` on a predecode config; for
    dense operands (predecode's too) on sm_90 from M = 9 the TMA GEMM
    (`_tma_score`); else a GEMM (wgmma on sm_90 above M = 32) with enough
    blocks (split-K up to ~2 per SM for M <= 64), the least padding of M, as
    tall and 128 (256 for M >= 1024 with wgmma) wide, the fewest split-K
    slices. The rules follow the sweeps and tuning logs in
    bench/results/h200; the tuner replaces them per shape."""
    cands = candidates(spec, arch, M, N, K, sms)
    tc = [c for c in cands if c.tc]
    if 2 <= M <= 16 and tc:
        # Measured (bench/results/h200/verify1, w4a16_sym 8192^2): M = 4 19.7 us,
        # M = 16 28.8 us (the mma.sync GEMM: 37 us). The widest vectors, 8
        # warps, split-K to ~2 blocks per SM.
        def tscore(c: Config):
            return (blocks(spec, c, M, N) < 15 * sms // 8, -c.vbytes, c.warps != 8, c.split_k)
        return min(tc, key=tscore)
    gemv = [c for c in cands if c.family == "gemv" and not c.tc]
    if M <= 4 and gemv:
        def gscore(c: Config):
            warps, idle = gemv_fill(spec, c, M, N, K)
            # Then: no split-K, the most columns per warp (activations read
            # once for all of them), the widest loads; prefetch with 16-byte
            # vectors (bench/results/h200/verify2: w8 c4 v16 s1 3-8 % faster
            # for every row spec; with 8-byte ones 1-bit codes took 255
            # registers and lost 24 %).
            return (-min(warps, 12 * sms), idle > 0, c.split_k, -c.cols, -c.vbytes, c.warps != 8,
                    c.prefetch != (c.vbytes == 16))
        return min(gemv, key=gscore)

    # Large M: decode the weights once, then the dense GEMM.
    pd = [c for c in cands if c.predecode]
    if pd and M >= predecode_from(spec, cands):
        cands = pd
    else:
        cands = [c for c in cands if not c.predecode]
    # The TMA GEMM (dense operands, and predecode's dense half; a candidate
    # from M = 9, where 64-row tiles are) won every bucket it was in in the
    # run4 tuning logs (1.1-2x over the cp.async wgmma pick): tiles as the
    # winners had them.
    # (Decoded weights on the TMA GEMM, without predecode, are the tuner's
    # to time: at M = 64 they ran 0.9-1.1x the cp.async kernels, NOTES v7.)
    dense_op = numerics(spec, fp8_mma=hw.arch(arch).fp8_mma).dense
    tma = [c for c in cands if c.tma and (dense_op or c.predecode)]
    if tma:
        return min(tma, key=lambda c: _tma_score(c, M, N, sms))
    # Measured on the H200: wgmma wins from M = 33 on, mma.sync below (dense
    # operands: sweep 3; decoded weights: the run3 tuning logs, where a wgmma
    # config won the M = 64 bucket in 48 of 60 records, 1.1-1.9x over the
    # mma.sync pick the heuristic then made).
    # The swapped GEMM (4-bit codes in the interleaved order) from M = 17,
    # where the tensor-core GEMV stops: at 8192^2 it beat every other kernel
    # at M = 32-256 (run9/rs2_sweep: 1.4-1.8x the cp.async wgmma GEMM). The
    # winners' shape (run12 sweeps): 64 weight rows per block, two k-groups,
    # the m-tile M rounded up; up to 128 rows 128-deep k-tiles in 8 stages
    # (6 at BM 128), above them one 256-row m-tile of 64-deep ones in 6;
    # past M = 256, 128 weight rows of one k-group in 4 (run14 tuning log:
    # the M = 1024 winner at four of the five shapes).
    rs = [c for c in cands if c.rs]
    if rs and M > 16:
        bm = next(t for t in RS_TILES_M if t >= min(M, RS_TILES_M[-1]))
        bn, bk, kgroups, stages = ((128, 64, 1, 4) if M > 256 else (64, 64, 2, 6) if bm > 128
                                   else (64, 128, 2, 6 if bm == 128 else 8))
        return min(rs, key=lambda c: (c.BM != bm, c.BN != bn, c.BK != bk, c.kgroups != kgroups,
                                      c.stages != stages))
    wg = [c for c in cands if c.wgmma and not c.rs]
    # (a predecode config's GEMM is a dense one)
    dense = dense_op or all(c.predecode for c in cands)
    on_wgmma = bool(wg) and M > 32
    if on_wgmma:
        cands = wg
    else:
        cands = [c for c in cands if not c.wgmma] or cands
    wide = 256 if M >= 1024 else 128
    # Decoded weights on wgmma above M = 64: every m-tile decodes all the
    # weights again, so 128-row tiles beat the least padding of M, and they
    # go 256 wide once those tiles fill most of a wave (run6 tuning logs: a
    # 128-row tile won the 129-256 bucket at every bench shape, 128 wide up
    # to N = 8192, 256 from 14336; at 6144^2, M = 192, the 64-row pick was
    # 1.2-1.3x slower). Not yet wave-aware: at 11008 x 4096, M = 192 (128-row
    # tiles 1.3 waves, 64-row ones 1.95) the 64-row tiles won by 1.3-1.5x (run7).
    tall = not dense and M > 64 and on_wgmma
    if tall:
        wide = 256 if -(-N // 256) * -(-M // 128) >= 0.8 * sms else 128

    # Enough blocks: up to M = 64 (memory-bound) about two per SM, split-K
    # until there (sweep 1: 256 blocks beat 128 and 512); above, split-K only
    # when the tiles leave half the SMs idle.
    want_blocks = 15 * sms // 8 if M <= 64 else sms // 2

    def score(c: Config):
        # Then: least padding of M (not for `tall`), tall tiles, 128 wide (256
        # for large M with wgmma), the fewest split-K slices (sweeps in
        # bench/results/h200/sweeps).
        if c.family != "gemm":
            return (True, 9.0, 0, True, 0, True, True)
        waste = 1.0 if tall else (-(-M // c.BM) * c.BM) / M
        # wgmma on dense operands keeps a group in flight: it wants the whole K
        # and deep pipelines (sweep 3, w8a8 M=64: p5 s1 34 us, p4 s4 54 us).
        deep = dense and c.wgmma
        return (blocks(spec, c, M, N) < want_blocks and not deep, round(waste, 1), -c.BM,
                c.BN != (wide if c.wgmma else 128), c.split_k, -c.stages if deep else c.stages != 4,
                c.min_blocks != 1)
    return min(cands, key=score)
