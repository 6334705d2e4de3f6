"""The heuristic: a reasonable config for a problem never tuned, from rules
fitted to measurements on the H200 (docs/performance.md#heuristic); the
tuner replaces its picks per shape."""
from __future__ import annotations

import dataclasses
from typing import FrozenSet, List, Optional, Tuple

from .. import hw
from ..lower import numerics, vector, weight_layout
from ..spec import A8_DTYPES, Spec, weight_code
from .config import Config, PlanError
from .gemv import gemv_run, int_dot
from .registry import blocks
from .rs import RS_FULL_RING, kernel_class
from .space import candidates


def rs_pickable(spec: Spec, arch: str) -> bool:
    """Whether the heuristic may pick spec's rs GEMM: only kernels checked
    against the reference on the device (hw.Calibration.rs_verified); the
    others are the tuner's to time, which keeps only verified winners."""
    return kernel_class(spec, arch) in hw.calibration(arch).rs_verified


def a8_pickable(spec: Spec, cfg: Config, arch: str, M: int, N: int, K: int) -> bool:
    """Whether the heuristic may pick cfg at M for its activations: for
    8-bit activations the int8 GEMV up to hw.Calibration.int8_gemv_max_m
    (from M = 2 unsplit: where its rows need split-K the GEMMs won), another
    GEMV of sub-byte codes up to hw.Calibration.a8_gemv_max_m (none
    of 8-bit codes: fp8's lost to the GEMM), a predecode config only once
    checked on the device (hw.Calibration.a8_verified); the others are the
    tuner's to time (docs/performance.md#widened-codes-8-bit-activations)."""
    if spec.a.dtype not in A8_DTYPES:
        return True
    cal = hw.calibration(arch)
    if cfg.family == "gemv":
        if int_dot(spec, cfg):
            return M <= cal.int8_gemv_max_m and (M == 1 or cfg.split_k == 1)
        return weight_code(spec.b).bits < 8 and M <= cal.a8_gemv_max_m
    return not cfg.predecode or f"predecode/{spec.a.dtype}" in cal.a8_verified


def predecode_from(spec: Spec, cands: List[Config], arch: str) -> int:
    """The M from which the heuristic picks a predecode config, by what the
    fused GEMM among cands pays per decoded tile (hw.Calibration.predecode_m);
    for 8-bit activations (sub-byte codes widened to 8-bit ones: the W8A8
    GEMMs after) their own thresholds, with and without their rs GEMM; an
    rs GEMM kernel class in hw.Calibration.rs_predecode_m_of its own."""
    at = hw.calibration(arch).predecode_m
    pick_rs = rs_pickable(spec, arch)
    rs = pick_rs and any(c.rs for c in cands)
    if spec.a.dtype in A8_DTYPES:
        return at["rs_widened_a8" if rs else "widened_a8"]
    if not any(c.wgmma and not c.predecode and (not c.rs or pick_rs) for c in cands):
        return at["no_fused_wgmma"]
    if rs:
        return hw.calibration(arch).rs_predecode_m_of.get(kernel_class(spec, arch), at["rs_gemm"])
    if numerics(spec).zero_kind in ("int", "float"):
        return at["zero_points"]
    return at["other"]


def gemv_fill(spec: Spec, cfg: Config, arch: str, M: int, N: int, K: int) -> Tuple[int, int]:
    """(resident-worthy warps of one launch, warps of a block left without a
    run of rows): the GEMV streams at copy speed only with ~12+ warps of
    8 loads in flight on every SM."""
    lay = weight_layout(spec)
    vec = vector(lay, cfg.vbytes)
    warps = blocks(spec, cfg, M, N) * cfg.warps
    if lay.row_axis == "n":
        return warps, 0
    num = numerics(spec)
    runs = (K // cfg.split_k) // vec.k_extent // gemv_run(cfg, hw.arch(arch), num, vec, "col")
    return warps, max(0, cfg.warps - runs)


def _tma_score(c: Config, M: int, N: int, sms: int, speed) -> tuple:
    """Waves of tiles times the time of one tile (`speed`: the tiles' measured
    relative speed, hw.Calibration.tma_tile_speed), then: two MMA warpgroups
    where the tile has room, no cluster (multicast measured no faster:
    docs/performance.md#tma-gemm), the grouped raster once there are two
    bands of m-tiles, the deepest ring, in-flight sums (candidates only once
    hw.Calibration.inflight_sums_verified)."""
    tiles = -(-N // c.BN) * -(-M // c.BM)
    cost = -(-tiles // sms) * c.BM * c.BN / speed[(c.BM, c.BN)]
    return (round(cost), -(c.BM // 64) * (c.BN // c.WN), c.cluster != 1,
            c.raster != (8 if M > c.BM else 0), -c.stages, not c.inflight_sums)


def _decoded_work(c: Config, M: int, N: int, sms: int, decode_rows: int,
                  staging_rows: int = 0) -> Tuple[int, int]:
    """(blocks of c's grid, waves of them times one block's work): BN weight
    rows, each decoded once (decode_rows: that cost in rows of M) and
    multiplied by BM activation rows, each staged once (staging_rows: that
    cost in weight rows). The rs GEMM's and the widened codes' tile scores
    start from it."""
    blocks = -(-N // c.BN) * -(-M // c.BM)
    return blocks, -(-blocks // sms) * (c.BN * (decode_rows + c.BM) + staging_rows * c.BM)


def _rs_score(c: Config, M: int, N: int, sms: int, decode_rows: int, staging_rows: int,
              deep: bool, pairs128: bool, widened: bool) -> tuple:
    """`_decoded_work` (decode_rows by decoding: `_rs_pick`); then the tallest,
    widest tile, the pair table (a candidate only where
    hw.Calibration.rs_pair_tables has it, up to its M: its 32 KiB may
    shorten the ring), and the depth, k-groups and ring the tuned winners had
    with it: 64-deep k-tiles at 256 rows (their registers) and with pair
    tables (their sweeps' winners at M = 16-256; at 16 rows on grids of up
    to two waves 128-deep with `pairs128`: hw.Calibration.rs_pair_tables_128_deep);
    at 16 rows of M on grids of one wave, 128 weight rows in two k-groups
    and 64 in four, of 12 stages, on wider grids one k-group of 6 (the
    widened codes: two of 12) and two of 6; at 64 rows of M on grids past
    one wave one k-group of 4 (pair tables' 64 weight rows: two of 6);
    else 128 weight rows in one k-group of 4 stages from 128 rows, else two
    of 8; 64 weight rows in two k-groups of 8 stages (6 from 128 rows);
    with `deep` (the decodings of hw.Calibration.rs_deep_kgroups on a grid
    under one wave) four k-groups of 12 stages up to 64 rows:
    docs/performance.md#heuristic."""
    blocks, work = _decoded_work(c, M, N, sms, decode_rows, staging_rows)
    pairs128 = pairs128 and c.BM == 16 and blocks <= 2 * sms
    bk = 64 if c.BM == 256 or (c.pair_table and not pairs128) else 128
    wide = blocks > sms
    if c.BN == 128:
        if c.BM == 16:
            kgroups, stages = (2, 12) if not wide or widened else (1, 6)
        else:
            kgroups, stages = (1, 4) if c.BM >= 128 or (wide and c.BM == 64) else (2, 8)
    elif c.BM == 16:
        kgroups, stages = (2, 6) if wide else (4, 12)
    elif deep and c.BM <= 64 and blocks < sms:
        kgroups, stages = 4, 12
    elif wide and c.BM == 64:
        kgroups, stages = (2, 6) if c.pair_table else (1, 4)
    else:
        kgroups, stages = (2, 6) if c.BM >= 128 else (2, 8)
    return (work, -c.BM, -c.BN, not c.pair_table, c.BK != bk, c.kgroups != kgroups, c.stages != stages)


def _widened_score(c: Config, M: int, N: int, sms: int, decode_rows: int) -> tuple:
    """Sub-byte codes widened for 8-bit activations, M = 17 up to
    hw.Calibration.widened_waves_max_m: `_decoded_work` (the rows widened);
    then the tallest tile and, of equal scores, the
    winners' tiles (H100 tuning, docs/performance.md#heuristic): at most two
    blocks per SM (3.4 waves of 64 x 64 lost to 1.7 of 64 x 128), 256 wide
    at 128 rows, the most blocks (two 64 x 64 per SM beat one 64 x 128);
    then the deepest ring and k-steps."""
    blocks, work = _decoded_work(c, M, N, sms, decode_rows)
    return (work, -c.BM, blocks > 2 * sms, c.BM == 128 and c.BN != 256, -blocks, -c.stages, -c.BK,
            c.min_blocks != 1)


def _widened_split(pick: Config, wg: List[Config], M: int, N: int, K: int, sms: int) -> Config:
    """pick split along K where its tiles fill at most half a wave: the most
    slices up to two blocks per SM, each slice at least 24 k-tiles deep
    (4096 x 14336, M = 32 / 64: 4-way splits won by 1.51x / 1.26x, H100;
    4096^2 kept the whole K, 32 k-tiles deep: docs/performance.md#heuristic)."""
    tiles = -(-N // pick.BN) * -(-M // pick.BM)
    if 2 * tiles > sms:
        return pick
    splits = [c for c in wg if c == dataclasses.replace(pick, split_k=c.split_k)
              and tiles * c.split_k <= 2 * sms and K // (c.BK * c.split_k) >= 24]
    return max(splits, key=lambda c: c.split_k, default=pick)


def _rs_pick(rs: List[Config], kind: str, widened: bool, M: int, N: int, sms: int,
             cal: hw.Calibration) -> Config:
    """The rs tile by `_rs_score`, with the calibration of its decoding
    (kind: planner.rs.kernel_class; widened: codes widened for 8-bit
    activations); only 64 weight rows up to the M of
    hw.Calibration.rs_rows64_max_m."""
    if M <= cal.rs_rows64_max_m.get(kind, 0):
        rs = [c for c in rs if c.BN == 64] or rs
    rows = cal.rs_decode_rows_of.get(kind, cal.rs_decode_rows)
    deep = kind in cal.rs_deep_kgroups
    pairs128 = kind in cal.rs_pair_tables_128_deep
    return min(rs, key=lambda c: _rs_score(c, M, N, sms, rows, cal.rs_staging_rows, deep, pairs128, widened))


def _rs_from_m9(kind: str, N: int, K: int, sms: int, cal: hw.Calibration) -> bool:
    """Whether the heuristic takes the rs GEMM at M = 9-16 instead of the
    tensor-core GEMV: for the decodings that won there (hw.Calibration.rs_from_m9),
    on layers whose 64-row blocks fill enough of the SMs in one m-tile
    (hw.Calibration.rs_from_m9_fill; where K <= rs_from_m9_short_k, the
    smaller share in rs_from_m9_short_k_fill_of)."""
    fill = cal.rs_from_m9_fill_of.get(kind, cal.rs_from_m9_fill)
    if K <= cal.rs_from_m9_short_k:
        fill = min(fill, cal.rs_from_m9_short_k_fill_of.get(kind, fill))
    return kind in cal.rs_from_m9 and -(-N // 64) >= fill * sms


def _rs_starved(c: Config, kind: str, M: int, N: int, sms: int, cal: hw.Calibration) -> bool:
    """Whether the rs GEMM c leaves too many SMs idle for its decoding, up
    to M = 64: the decodings with a minimum share of SMs
    (hw.Calibration.rs_min_fill: NF4's table lookups) on narrow layers,
    where a split-K GEMM keeps every SM decoding."""
    return M <= 64 and -(-N // c.BN) * -(-M // c.BM) < cal.rs_min_fill.get(kind, 0.0) * sms


def heuristic(spec: Spec, arch: str, M: int, N: int, K: int, sms: Optional[int] = None,
              exclude: FrozenSet[Config] = frozenset()) -> Config:
    """A reasonable pick without tuning: for weights stored [N, K] and
    M = 2-16 the tensor-core GEMV (where it cannot fill the SMs: at M = 2-4
    the row GEMV, else its most blocks; M = 9-16 on wide layers: the rs
    GEMM of the decodings in `rs_from_m9`, and where its vectors hold too
    few codes the GEMM rules: `tc_gemv_min_codes`; 8-warp blocks for the
    codes of `tc_gemv_eight_warps`; for dense operands the mma.sync GEMM's
    16-row tile, split-K by how much of a wave its tiles fill); for
    decode (M <= 4) the GEMV whose
    grid puts 12+ warps on every SM (or as many as it can) with no idle warps,
    then the fewest split-K slices, the most columns per warp and the widest
    loads; sub-byte codes widened for 8-bit activations (sm_90) at M = 2-16
    whole-K 16-row tiles where they fill the device, from M = 17 the
    whole-K wgmma tile by waves (`_widened_score`, `_widened_split`), and
    with int8 activations from M = 9 their rs GEMM (`_rs_pick`);
    decoded weights from `predecode_from` on a predecode config; for
    dense operands (predecode's too) on sm_90 from M = 17 the TMA GEMM
    (`_tma_score`); else a GEMM (wgmma on sm_90 above M = 32) with enough
    blocks (split-K up to ~2 per SM for M <= 64), the least padding of M, as
    tall and 128 (256 for M >= 1024 with wgmma) wide, the fewest split-K
    slices. The rules follow the sweeps and tuning logs told in
    docs/performance.md#heuristic; the tuner replaces them per shape.
    sms: the device's SM count (runtime: device.sm_count(); None: the arch's
    planned device, hw.planned_device). exclude: configs not to pick (those
    whose kernels ptxas spilled: compiler.default_config)."""
    sms = sms or hw.planned_device(arch).sms
    pick_rs = rs_pickable(spec, arch)
    cal = hw.calibration(arch)
    kind = kernel_class(spec, arch)
    # At M = 9-16 narrow vectors (a short scale group or K) starve the
    # tensor-core GEMV's loads: the mma.sync GEMM there (tc_gemv_min_codes).
    tc_min_bytes = cal.tc_gemv_min_codes * weight_layout(spec).bits / 8 if 9 <= M <= 16 else 0
    cands = [c for c in candidates(spec, arch, M, N, K, sms)
             if c not in exclude and (pick_rs or not c.rs) and a8_pickable(spec, c, arch, M, N, K)
             and (cal.inflight_sums_verified or not c.inflight_sums)
             and (not c.pair_table or M <= cal.rs_pair_tables.get(kind, 0))
             and (not c.rs or c.stages >= RS_FULL_RING or kind in cal.rs_shallow_rings)
             and (not c.tc or c.vbytes >= tc_min_bytes)]
    if not cands:
        raise PlanError(f"{spec.name}: no kernel configuration fits M={M} N={N} K={K} on {arch}"
                        + (f" besides the {len(exclude)} excluded" if exclude else ""))
    a = hw.arch(arch)
    num = numerics(spec, fp8_mma=a.fp8_mma)
    tc = [c for c in cands if c.tc]
    rs = [c for c in cands if c.rs]                 # (only where rs_pickable)
    if 9 <= M <= 16 and rs and _rs_from_m9(kind, N, K, sms, cal):
        return _rs_pick(rs, kind, num.widen, M, N, sms, cal)
    dense_op = num.dense
    # Sub-byte codes widened for 8-bit activations on sm_90 (the rules
    # measured there: hw.Calibration.widened_waves_max_m): at M = 2-16 the
    # whole K where 128-wide 16-row tiles fill 0.8 of a wave (else split-K
    # as for other decoded weights: at 8192^2, M = 16, the third-of-a-wave
    # whole K took 1.37x the 4-way split's time); M = 17 and up below.
    widened = num.widen and a.wgmma and cal.widened_waves_max_m > 0
    widened_whole_k = widened and M <= 16 and -(-N // 128) >= 0.8 * sms
    # Dense operands (fp16, int8, fp8) at M = 9-16: the mma.sync GEMM's
    # 16-row tiles, not the tensor-core GEMV nor the TMA GEMM's 64-row ones
    # (H200 tuning logs: it won 16 of 17 such records, 1.04-1.57x over the
    # pick of either: docs/performance.md#heuristic).
    mma_sync = ([c for c in cands if c.family == "gemm" and not (c.tma or c.wgmma)]
                if dense_op and 9 <= M <= 16 else [])
    gemv = [c for c in cands if c.family == "gemv" and not c.tc]
    want = 15 * sms // 8
    # At M = 2-4 on layers too narrow for ~2 tensor-core GEMV blocks per SM
    # the row GEMV below won 19 of 21 records (H100, empty DB: 512 x 3584
    # and gpt-oss-20b's K = 2880 layers, 1.1-3.4x over the tensor-core
    # GEMV; fp16's two 512-row layers took split-K GEMMs;
    # docs/performance.md#heuristic).
    tc_blocks = {c: blocks(spec, c, M, N) for c in tc}
    if num.code_kind in cal.tc_gemv_eight_warps:
        # Each block fills the codebook's table in shared memory first:
        # 8-warp blocks fill half as many, where they still make about one
        # block per SM (hw.Calibration.tc_gemv_eight_warps).
        tc = [c for c in tc if c.warps == 8 and tc_blocks[c] >= 0.8 * sms] or tc
    tc_starved = all(tc_blocks[c] < want for c in tc)
    if mma_sync:
        cands = mma_sync
    elif 2 <= M <= 16 and tc and not (M <= 4 and tc_starved and gemv):
        # Measured (w4a16_sym 8192^2): M = 4 19.7 us, M = 16 28.8 us (the
        # mma.sync GEMM: 37 us): docs/performance.md#tensor-core-gemv. The
        # widest vectors, 8 warps, split-K to ~2 blocks per SM. Where no
        # config has that many blocks (narrow layers), the most blocks of
        # 8-byte vectors or wider (where the code has them): on 512 x 3584
        # at M = 9-16 (H100) w4 v8 s8, 64 blocks, took 8.2 us where the
        # widest vectors' 8 blocks took 14.9 (docs/performance.md#heuristic).
        if tc_starved:
            wide = min(8, max(c.vbytes for c in tc))
            return min((c for c in tc if c.vbytes >= wide),
                       key=lambda c: (-tc_blocks[c], -c.vbytes, c.warps != 8, c.split_k))

        def tscore(c: Config):
            return (tc_blocks[c] < want, -c.vbytes, c.warps != 8, c.split_k)
        return min(tc, key=tscore)
    if M <= 4 and gemv:
        # A grid fills the device at 12 warps per SM (gemv_fill); a split-K
        # one's warps count only up to gemv_split_fill_warps per SM on [N, K]
        # weights (its reduction costs more than more warps bring above
        # that; the column GEMV of weights stored [K, N] splits K as before:
        # its tuned winners split it 2-16 ways).
        fill_warps = 12
        split_fill = cal.gemv_split_fill_warps if weight_layout(spec).row_axis == "n" else fill_warps
        prefetch = numerics(spec).code_kind not in cal.gemv_no_prefetch

        def gscore(c: Config):
            warps, idle = gemv_fill(spec, c, arch, M, N, K)
            # Then: no split-K, the most columns per warp (activations read
            # once for all of them), the widest loads; prefetch with 16-byte
            # vectors (w8 c4 v16 s1 3-8 % faster for every row spec; with
            # 8-byte ones 1-bit codes took 255 registers and lost 24 %:
            # docs/performance.md#gemv), but for the code kinds of
            # hw.Calibration.gemv_no_prefetch.
            fill = fill_warps if c.split_k == 1 else split_fill
            return (-min(warps, fill * sms), idle > 0, c.split_k, -c.cols, -c.vbytes, c.warps != 8,
                    c.prefetch != (c.vbytes == 16 and prefetch))
        return min(gemv, key=gscore)

    # Large M: decode the weights once, then the dense GEMM.
    pd = [c for c in cands if c.predecode]
    if pd and M >= predecode_from(spec, cands, arch):
        cands = pd
    else:
        cands = [c for c in cands if not c.predecode]
    # Sub-byte codes widened for 8-bit activations, M = 17 to
    # widened_waves_max_m: the cp.async wgmma GEMM over the whole K, its
    # tile by waves, as the tuned winners had it (the split-K picks of the
    # rules below lost to them: docs/performance.md#heuristic). Where their
    # rs GEMM is verified (int8 activations) it takes M = 9 and up instead.
    if widened and 16 < M <= cal.widened_waves_max_m and not rs:
        wg = [c for c in cands if c.wgmma and not (c.tma or c.rs or c.predecode)]
        whole = [c for c in wg if c.split_k == 1]
        if whole:
            pick = min(whole, key=lambda c: _widened_score(c, M, N, sms, cal.widened_decode_rows))
            return _widened_split(pick, wg, M, N, K, sms)
    # The TMA GEMM (dense operands, and predecode's dense half; a candidate
    # from M = 9, where 64-row tiles are) won every bucket it was in in the
    # tuning logs (1.1-2x over the cp.async wgmma pick): tiles as the
    # winners had them (docs/performance.md#tma-gemm).
    # (Decoded weights on the TMA GEMM, without predecode, are the tuner's
    # to time: at M = 64 they ran 0.9-1.1x the cp.async kernels.)
    tma = [c for c in cands if c.tma and (dense_op or c.predecode)]
    if tma:
        speed = cal.tma_tile_speed
        return min(tma, key=lambda c: _tma_score(c, M, N, sms, speed))
    # Measured on the H200: wgmma wins from M = 33 on, mma.sync below (dense
    # operands: a sweep; decoded weights: the tuning logs, where a wgmma
    # config won the M = 64 bucket in 48 of 60 records, 1.1-1.9x over the
    # mma.sync pick the heuristic then made): docs/performance.md#gemm.
    # The rs GEMM (its decodings checked on the device: rs_pickable) from
    # M = 17, where the tensor-core GEMV stops (from 9 on wide layers for
    # the 4-bit interleaved decodings: rs_from_m9): at 8192^2 it beat every other
    # kernel at M = 32-256 (1.4-1.8x the cp.async wgmma GEMM). Its tile by
    # waves x a block's work (`_rs_score`): at 8192^2 the sweeps' winners
    # (64 weight rows, the m-tile M rounded up; 128 weight rows past M = 256),
    # and for narrow layers the smaller m-tiles that fill a wave (Llama-3-8B's
    # 1024 x 4096 at M = 512: 64 x 64 tiles, 15.6 us, where a 256 x 128 one
    # took 46.7): docs/performance.md#heuristic.
    rs = [c for c in cands if c.rs]          # (cands: predecode's or not, above)
    if rs and M > 16:
        pick = _rs_pick(rs, kind, num.widen, M, N, sms, cal)
        if not _rs_starved(pick, kind, M, N, sms, cal):
            return pick
        cands = [c for c in cands if not c.rs]
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
    # go 256 wide once those tiles fill most of a wave (tuning logs: a
    # 128-row tile won the 129-256 bucket at every bench shape, 128 wide up
    # to N = 8192, 256 from 14336; at 6144^2, M = 192, the 64-row pick was
    # 1.2-1.3x slower). Not yet wave-aware: at 11008 x 4096, M = 192 (128-row
    # tiles 1.3 waves, 64-row ones 1.95) the 64-row tiles won by 1.3-1.5x
    # (docs/performance.md#gemm).
    tall = not dense and M > 64 and on_wgmma
    if tall:
        wide = 256 if -(-N // 256) * -(-M // 128) >= 0.8 * sms else 128

    # Enough blocks: up to M = 64 (memory-bound) about two per SM, split-K
    # until there (a sweep: 256 blocks beat 128 and 512,
    # docs/performance.md#gemm); above, split-K only
    # when the tiles leave half the SMs idle. Short of that many, the more
    # the better (NF4 on 1024-row layers, M = 33-64: 64 x 64 tiles split 8
    # ways won, where 64 x 128 whole-K ones were picked before).
    want_blocks = 15 * sms // 8 if M <= 64 else sms // 2

    def score(c: Config):
        # Then: least padding of M (not for `tall`), tall tiles, 128 wide (256
        # for large M with wgmma), the fewest split-K slices
        # (docs/performance.md#gemm).
        if c.family != "gemm":
            return (1, 9.0, 0, True, 0, 0, True, True)
        waste = 1.0 if tall else (-(-M // c.BM) * c.BM) / M
        # wgmma on dense operands keeps a group in flight: it wants the whole K
        # and deep pipelines (w8a8 M=64: p5 s1 34 us, p4 s4 54 us:
        # docs/performance.md#gemm).
        deep = dense and c.wgmma
        want, n_blocks = want_blocks, blocks(spec, c, M, N)
        # Dense operands up to M = 16 (mma.sync), and widened codes where
        # `widened_whole_k` (above): the whole K once the tiles
        # alone fill 0.8 of a wave, or (M = 2-16) a third of one with up to
        # 64 k-steps, else split-K to about two waves (M = 1) or one (0.8 of
        # one counts as full); the deepest pipeline over the widest k-steps.
        # Tuning logs (W8A8 / fp8 / fp16, M = 1 and 16): whole K at 14336
        # and 28672 rows up to 1.41x faster than split 2-4 ways (H200); at
        # M = 16 whole K on 48 and 64 tiles of 32-64 k-steps (1.41x over
        # 4-way at 6144 x 4096, H100), split two ways on 64 tiles of 224
        # (8192 x 28672, every dense spec); the winners' k-tiles 128 deep,
        # 4-5 stages: docs/performance.md#heuristic.
        small = M <= 16 and not c.wgmma and (dense or widened_whole_k)
        if small:
            # (one target for every candidate, so that a narrower tile that
            # fills the device ties with a 128-wide one and loses on BN)
            want = want_blocks if M == 1 else sms
            tiles = n_blocks // c.split_k
            short_k = K // c.BK <= 64
            if tiles >= 0.8 * sms or (M > 1 and (n_blocks >= 0.8 * sms or (tiles >= sms / 3 and short_k))):
                n_blocks = want
        return (0 if deep else -min(n_blocks, want), round(waste, 1), -c.BM,
                c.BN != (wide if c.wgmma else 128), c.split_k, -c.BK if small else 0,
                -c.stages if deep or small else c.stages != 4, c.min_blocks != 1)
    return min(cands, key=score)
