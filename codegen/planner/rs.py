"""The rs GEMM (gemm_rs.cu.j2): sub-byte and 8-bit weights decoded straight
into wgmma's register operand (its register-sourced form), the activations
its shared-memory one, both TMA-loaded into a ring; sm_90a."""
from __future__ import annotations

from typing import Dict, Optional

from .. import hw
from ..lower import (PAIR_TABLE_BYTES, Decode, Layout, Numerics, decode_plan, numerics, pair_table_ok,
                     rs_byte_pairs, rs_pairs, rs_pairs_are_interleaved4, rs_pairs_in_halves, weight_layout,
                     zero_sub_bits)
from ..spec import WEIGHT_CODES, Spec
from .config import Config, PlanError
from .gemm import check_byte_lanes, grid
from .launch import Family
from .tiles import STATIC_SMEM_RESERVE
from .tma import TMA_PRODUCER_REGS, boxes, consumer_regs, stored_rows_ok

# The rs GEMM's m-tiles (wgmma N) and n-tiles (64 weight rows per MMA warpgroup).
RS_TILES_M = (16, 32, 64, 128, 256)
RS_TILES_N = (64, 128)
RS_TILES_K = (64, 128)       # 256 measured slower than 128 at M = 16 / 64 / 128 (docs/performance.md#rs-gemm)
RS_STAGES = (3, 4, 6, 8, 12)
# Rings shallower than this only where it does not fit in shared memory
# (1-bit codes' 128-deep, 256-row tiles: 64 KiB of activations a stage;
# docs/performance.md#rs-gemm).
RS_FULL_RING = 4
# How the rs GEMM turns a lane's pair of codes into a fragment register
# (lower.decode_plan's methods it has).
RS_DECODES = ("magic", "fp4", "table", "pair_table", "e4m3", "e5m2")
# Registers an MMA thread takes, by rs_kernel and (BK, BM), as measured (hw.Calibration).
RS_REGS = hw.calibration("sm_90").rs_regs


def rs_kernel(num: Numerics, dec: Decode, int_zero: bool, pairs) -> str:
    """"decode/fetch", the name of an rs GEMM kernel's decoding in
    hw.Calibration.rs_regs and .rs_verified. decode: the method, with
    integer zero points and with scales to convert marked; fetch "halves":
    each lane's pair in a word's two halves (the interleaved int32 orders of
    the execution layouts: planner.execution), "pairs": any other layout
    lower.rs_pairs reads."""
    decode = dec.method + ("_int_zero" if int_zero else "_float_zero" if num.zero_kind == "float" else "")
    if dec.method == "pair_table" and num.code_kind != "table":
        decode += "_" + num.code_kind              # (e2m1's e8m0 scales per 32: more registers)
    if num.formula != "(q - z) * s" and num.zero_kind != "none":
        decode += "_minus_z"                       # q * s - z
    if not (num.scale_native or num.scale_gran is None):
        decode += "_cvt_scale"
    return f"{decode}/{'halves' if rs_pairs_in_halves(pairs) else 'pairs'}"


def _int_zero(num: Numerics, dec: Decode) -> bool:
    """Integer zero points that join the magic number's subtract."""
    return num.zero_kind == "int" and zero_sub_bits(num, dec, WEIGHT_CODES[num.zero_dtype].bits) is not None


def _decode(lay: Layout, num: Numerics, pairs, pair_table: bool) -> Optional[Decode]:
    """The rs GEMM's decoding of these pairs (pair_table: by a table of value
    pairs, Config.pair_table); None where a pair table does not apply (codes
    that are not 4-bit codebook or e2m1 ones, pairs that are not bytes)."""
    if not pair_table:
        return decode_plan(lay, num)
    high_first = rs_byte_pairs(pairs)
    if not pair_table_ok(lay, num) or high_first is None:
        return None
    return decode_plan(lay, num, pair_table=True, high_first=high_first)


def kernel_class(spec: Spec, arch: str, pair_table: bool = False) -> Optional[str]:
    """"decode/fetch/type" of spec's rs GEMM on arch (rs_kernel and the
    activations' type: what hw.Calibration.rs_verified lists), with its
    pairs looked up in a table of value pairs where pair_table
    (Config.pair_table); None when it has none. Codes widened for int8
    activations: "widen[_int_zero][_group]/bytes/int8" (_widened)."""
    a = hw.arch(arch)
    if not a.wgmma:
        return None
    num, lay = numerics(spec, fp8_mma=a.fp8_mma), weight_layout(spec)
    if num.widen:
        try:
            return f"{_widened_kernel(num, lay)}/{num.mma}"
        except PlanError:
            return None
    pairs = rs_pairs(lay, RS_TILES_K[-1])
    if num.dense or pairs is None:
        return None
    dec = _decode(lay, num, pairs, pair_table)
    if dec is None:
        return None
    return f"{rs_kernel(num, dec, _int_zero(num, dec), pairs)}/{num.mma}"


def _decoded(cfg: Config, num: Numerics, lay: Layout) -> Dict:
    """16-bit activations: each lane's pairs of codes decoded into fp16 /
    bf16 fragment registers (lower.rs_pairs finds them in the stored words)."""
    pairs = rs_pairs(lay, cfg.BK)
    if pairs is None:
        raise PlanError("the rs GEMM needs codes stored [N, K] packed along k, each lane's pair "
                        "(k = 2q, 2q + 1) in one word, the lanes a fixed step apart "
                        "(e.g. 4-bit codes in the order 0, 2, 4, 6, 1, 3, 5, 7)")
    w_rowb = cfg.BK * lay.bits // 8
    if w_rowb % 16:
        raise PlanError(f"a {cfg.BK}-deep k-tile of {lay.bits}-bit codes is {w_rowb} bytes a row; "
                        "the rs GEMM loads rows in 16-byte pieces")
    dec = _decode(lay, num, pairs, cfg.pair_table)
    if dec is None:
        raise PlanError("a pair table is for 4-bit codebook or e2m1 codes whose lanes' pairs are "
                        "bytes (a byte's two nibbles)")
    int_zero = _int_zero(num, dec)
    float_zero = num.zero_kind == "float" and dec.method == "magic"
    zero_ok = num.zero_kind in ("none", "const") or int_zero or float_zero
    formula_ok = num.formula == "(q - z) * s" or num.zero_kind in ("none", "float")
    if dec.method not in RS_DECODES or not formula_ok or not zero_ok:
        raise PlanError("the rs GEMM decodes codes by the magic number (the zero point a "
                        "constant, an integer that joins the subtract as an integer add, or "
                        "a float), e2m1 or fp8 bits or a 16-entry table")
    # Scale groups of whole k-tiles, or of whole k16 steps that tile a
    # k-tile (spt per row and tile: MXFP4's 32), outside the 4-bit
    # interleaved kernels (their one scale per unit is what ran on the device).
    spt = 1
    if num.scale_gran == "group" and num.group % cfg.BK:
        if rs_pairs_are_interleaved4(pairs) or num.group % 16 or cfg.BK % num.group \
                or num.zero_kind in ("int", "float"):        # (zero points: one per unit)
            raise PlanError(f"scale groups of {num.group} split a {cfg.BK}-deep k-tile")
        spt = cfg.BK // num.group
    # One-byte (e8m0) scales stored [N, K / group]: a row's spt scales of a
    # k-tile are consecutive bytes, loaded as one word and held in one slot
    # register (docs/performance.md#rs-gemm).
    scale_words = spt > 1 and num.scale_dtype == "e8m0" and num.scale_layout == "nk"
    return dict(dec=dec, kernel=rs_kernel(num, dec, int_zero, pairs), pairs=pairs,
                interleaved4=rs_pairs_are_interleaved4(pairs), w_rowb=w_rowb, spt=spt,
                scale_words=scale_words, ce=2,
                widen=False, flush=False, flush_scaled=False, acc_int=False)


def _widened_kernel(num: Numerics, lay: Layout) -> str:
    """The rs_regs name of the widened kernel for these numerics:
    "widen[_e4m3][_int_zero][_group]/bytes" (e4m3 activations; integer zero
    points per group; sums flushed per group: group scales, and e4m3's fp32
    sums, which the fp8 wgmma does not keep in full), or PlanError where
    codes cannot be widened."""
    check_byte_lanes(lay)
    if num.mma not in ("int8", "float8_e4m3"):
        raise PlanError("the rs GEMM widens codes for int8 and e4m3 activations")
    if num.zero_kind not in ("none", "const", "int"):
        raise PlanError("widened codes take no, constant or integer zero points")
    e4m3 = num.mma == "float8_e4m3"
    return ("widen" + ("_e4m3" if e4m3 else "") + ("_int_zero" if num.zero_kind == "int" else "")
            + ("_group" if _flushed(num) else "") + "/bytes")


def _flushed(num: Numerics) -> bool:
    """Whether the widened kernel flushes its sums into fp32 once per unit of
    k-tiles: group scales (each group's sum scaled apart), and the fp8
    wgmma, whose sums lose precision over K (hw.Wgmma.exact_acc; its units
    are then single k-tiles: one scale group or none)."""
    return num.scale_gran == "group" or not hw.WGMMAS[num.mma].exact_acc


def _widened(cfg: Config, num: Numerics, lay: Layout) -> Dict:
    """8-bit activations: sub-byte integer codes widened to int8 (e4m3)
    q - z in the 8-bit wgmma's fragment registers. In the byte-lanes words
    (lower's widen decode) a fragment register's four codes (k = 4q .. 4q +
    3 of one half of a k32 step) are one shift and mask apart, and with the
    row's bias one add and one xor make them int8 (e4m3x4 makes them e4m3;
    widen_frag in gemm_rs.cu.j2). Channel and tensor scales apply to the
    whole sum (the epilogue); group scales to each group's sum, flushed into
    fp32 once its last k-tile is done (every k-tile waits for its wgmma in
    this kernel anyway; e4m3's sums are flushed every k-tile: _flushed)."""
    kernel = _widened_kernel(num, lay)
    if cfg.BK != 128 or cfg.pair_table:
        raise PlanError("widened codes take 128-deep k-tiles (one 128-byte swizzle atom of "
                        "8-bit activations a row), no pair tables")
    group = num.scale_gran == "group"
    if group and num.group % cfg.BK:
        raise PlanError(f"group scales of 8-bit products need whole k-tiles per group "
                        f"(BK {cfg.BK} does not divide {num.group})")
    exact = hw.WGMMAS[num.mma].exact_acc
    if group and not exact and num.group != cfg.BK:
        raise PlanError(f"e4m3 sums are flushed every k-tile: scale groups of {cfg.BK}, not {num.group}")
    return dict(dec=decode_plan(lay, num), kernel=kernel, pairs=None, interleaved4=False,
                w_rowb=cfg.BK * lay.bits // 8, spt=1, scale_words=False, ce=1, widen=True, flush=_flushed(num),
                flush_scaled=group, acc_int=hw.MMAS[num.mma].acc == "s32")


def geometry(spec: Spec, cfg: Config, a: hw.Arch, num: Numerics, lay: Layout) -> Dict:
    """The rs GEMM (gemm_rs.cu.j2): one producer warp (a warpgroup that
    hands registers over by setmaxnreg, where the MMA threads need more than
    the launch allows) TMA-loads the activation tile (BK x BM, in boxes of
    one 128-byte swizzle atom a row: wgmma's B operand from shared memory)
    and the stored words of BN weight rows into a STAGES-deep ring. Each MMA
    warpgroup owns 64 weight rows, and each lane decodes exactly the codes of
    its own A fragments from the stored words: for 16-bit activations
    (_decoded) rows g and g + 8 of its warp's 16, k = 2q, 2q + 1 and 2q + 8,
    2q + 9 of every k16 step, which the interleaved pack order 0, 2, 4, 6,
    1, 3, 5, 7 puts at bits 4q and 16 + 4q of a word, so one shift, one lop3
    with the magic number, one subtract (of the magic number, with integer
    zero points its row's zero too) and one scale per pair; for int8 ones
    (_widened) four codes a register, widened to int8."""
    if not cfg.rs:
        raise PlanError("k-groups and pair tables are for rs configs (the rs GEMM)")
    if not (a.tma and a.wgmma and cfg.tma and cfg.wgmma):
        raise PlanError(f"the rs GEMM is a tma wgmma config on sm_90a (target {a.name})")
    if num.dense:
        raise PlanError("the rs GEMM decodes weights (dense ones take the TMA GEMM)")
    d = _widened(cfg, num, lay) if num.widen else _decoded(cfg, num, lay)
    if cfg.BK not in RS_TILES_K or cfg.WM != 64 or cfg.WN != cfg.BM or cfg.BM not in RS_TILES_M \
            or cfg.BN not in RS_TILES_N:
        raise PlanError(f"rs GEMM tiles: BK in {RS_TILES_K}, BM (wgmma N) in {RS_TILES_M}, "
                        f"BN in {RS_TILES_N}")
    if cfg.cluster != 1 or cfg.raster or cfg.inflight_sums or cfg.min_blocks != 1 or cfg.stages < 2:
        raise PlanError("the rs GEMM: no cluster, raster or in-flight sums, min_blocks 1, 2+ stages")
    if cfg.split_k != 1:
        # Measured: split-K 2 took 1.8x the unsplit time at M = 64 with an
        # identical main loop (docs/performance.md#rs-gemm); k-groups split k
        # inside the block.
        raise PlanError("the rs GEMM splits k between k-groups, not blocks (split_k 1)")
    if cfg.kgroups not in (1, 2, 4):
        raise PlanError("1, 2 or 4 k-groups of MMA warpgroups")
    if cfg.stages % cfg.kgroups:
        # Slot s must always serve the same k-group: one that ran a round
        # ahead would read a slot's next-but-one phase as complete (the
        # mbarrier parity aliases; p6 with 4 k-groups faulted:
        # docs/performance.md#rs-gemm).
        raise PlanError(f"{cfg.stages} stages do not split evenly between {cfg.kgroups} k-groups")
    a_tile = cfg.BM * cfg.BK * d["ce"]                      # (swizzled boxes of BM x 128 bytes)
    w_tile = -(-cfg.BN * d["w_rowb"] // 1024) * 1024
    # The k-groups' partial sums meet in shared memory once the ring is drained.
    red = (cfg.kgroups - 1) * (cfg.BN // 64) * 128 * (cfg.BM // 2) * 4
    def ring(stages: int) -> int:
        return max(stages * (a_tile + w_tile), red) + 1024
    smem = ring(cfg.stages)
    table = PAIR_TABLE_BYTES if cfg.pair_table else 0      # (static, beside the dynamic part)
    if smem + table + STATIC_SMEM_RESERVE > a.smem_per_block:
        raise PlanError(f"{smem + table} bytes of shared memory > {a.smem_per_block} on {a.name}")
    if cfg.stages < RS_FULL_RING and ring(RS_FULL_RING) + table + STATIC_SMEM_RESERVE <= a.smem_per_block:
        raise PlanError(f"rings shallower than {RS_FULL_RING} stages only for tiles whose "
                        f"{RS_FULL_RING}-deep ring does not fit")
    consumers = cfg.BN // 64 * cfg.kgroups
    cal = hw.calibration(a.name)
    need = cal.rs_regs.get(d["kernel"], {}).get((cfg.BK, cfg.BM))
    if need is None:
        raise PlanError(f"no measured register need of the rs GEMM's {d['kernel']} decode at "
                        f"BK {cfg.BK}, BM {cfg.BM}")
    threads, regs = 128 * consumers + 32, None
    if threads > hw.MAX_THREADS_PER_BLOCK:
        raise PlanError(f"{consumers} MMA warpgroups: {threads} threads per block")
    if need > a.launch_reg_cap(threads):
        # A producer warpgroup instead of a warp: it hands registers back
        # (setmaxnreg) for the MMA warpgroups to take.
        threads = 128 * (consumers + 1)
        up = consumer_regs(TMA_PRODUCER_REGS, consumers)
        if need > up:
            raise PlanError(f"{need} registers per thread > {up} for {consumers} MMA warpgroups")
        regs = (TMA_PRODUCER_REGS, up)
    mma = hw.MMAS[num.mma]
    # k-tiles of one scale group that a k-group takes in a row (one scale and
    # zero load for all of them), where the ring's slots still each serve
    # one k-group.
    tpg = num.group // cfg.BK if num.scale_gran == "group" and d["spt"] == 1 else 1
    if cfg.kgroups > 1 and cfg.stages % (cfg.kgroups * tpg):
        if d["flush"]:
            # (a group's sums must be one k-group's, flushed at its unit's end)
            raise PlanError(f"{cfg.stages} stages do not hold whole {tpg}-tile scale groups "
                            f"for each of {cfg.kgroups} k-groups")
        tpg = 1
    return dict(d, threads=threads, consumers=consumers, regs=regs, tpg=tpg, a_bytes=d["ce"],
                a_decode=False, dense=False, tma=True, rs=True, wgmma=True, stored=lay,
                b_rows=cfg.BN, b_rowb=d["w_rowb"], a_tile=a_tile, w_tile=w_tile, smem=smem,
                grid_tiles=(cfg.BN, cfg.BM), mma_ptx=mma.ptx, inflight=1,
                target=hw.WGMMA_TARGET[a.name], wgmma_types=hw.WGMMAS[num.mma].types,
                wgmma_k=hw.WGMMAS[num.mma].k, wgmma_tail=hw.WGMMAS[num.mma].tail, words=d["w_rowb"] // 4)


def shape_ok(g: Dict, cfg: Config, N: int, K: int) -> bool:
    """stored_rows_ok; with scale words, rows of whole ones: K a multiple of
    the k-tile."""
    return stored_rows_ok(g, cfg, N, K) and (not g["scale_words"] or K % cfg.BK == 0)


FAMILY = Family("rs", geometry, kind=lambda cfg, g: "gemm_rs", grid=grid, shape_ok=shape_ok,
                tma=boxes)
