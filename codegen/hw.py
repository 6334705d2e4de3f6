"""Hardware facts and measured calibration as data: per-arch limits, the
tensor-core shapes we use, the devices we plan for and what was measured on
them.

Everything the planner and the templates need to know about a GPU lives here,
so that supporting a new arch or device means adding a row, not branches in
code. Each measured constant names where its evidence is told
(docs/performance.md, by section).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import FrozenSet, Mapping, Tuple

# The most registers ptxas gives one thread, and threads one block may have.
MAX_REGS_PER_THREAD = 255
MAX_THREADS_PER_BLOCK = 1024


@dataclass(frozen=True)
class Arch:
    name: str                 # "sm_90"
    cc: int                   # 90
    smem_per_block: int       # max dynamic shared memory per block (opt-in), bytes
    smem_per_sm: int
    regs_per_sm: int
    max_threads_per_sm: int
    fp8_mma: bool             # mma.sync ...e4m3 exists (sm_89+)
    wgmma: bool = False       # warpgroup MMA from shared memory (sm_90a)
    tma: bool = False         # TMA tensor copies, mbarrier tx counts, clusters (sm_90a)

    def launch_reg_cap(self, threads: int) -> int:
        """ptxas's register cap per thread under __launch_bounds__(threads, 1):
        the register file over whole warpgroups, in steps of 8 (measured: 288
        threads -> 168. Source: docs/performance.md#tma-gemm)."""
        return min(MAX_REGS_PER_THREAD, self.regs_per_sm // (-(-threads // 128) * 128) // 8 * 8)


ARCHS = {
    "sm_80": Arch("sm_80", 80, 163 * 1024, 164 * 1024, 65536, 2048, False),
    "sm_86": Arch("sm_86", 86, 99 * 1024, 100 * 1024, 65536, 1536, False),
    "sm_89": Arch("sm_89", 89, 99 * 1024, 100 * 1024, 65536, 1536, True),
    "sm_90": Arch("sm_90", 90, 227 * 1024, 228 * 1024, 65536, 2048, True, wgmma=True, tma=True),
}


@dataclass(frozen=True)
class Mma:
    """One mma.sync shape. Fragment layouts follow the PTX ISA figures for
    m16n8k16 (16-bit) and m16n8k32 (8-bit): A row-major, B column-major, and
    for B each lane holds k = lane%4 * (k_per_reg) + i, n = lane/4."""
    ptx: str                  # the instruction
    m: int
    n: int
    k: int
    a_bytes: int              # bytes per A/B element
    acc: str                  # "f32" | "s32"
    min_cc: int


MMAS = {
    "float16": Mma("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 16, 8, 16, 2, "f32", 80),
    "bfloat16": Mma("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 16, 8, 16, 2, "f32", 80),
    "int8": Mma("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", 16, 8, 32, 1, "s32", 80),
    "float8_e4m3": Mma("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", 16, 8, 32, 1, "f32", 89),
}

@dataclass(frozen=True)
class Wgmma:
    """One warpgroup MMA (wgmma.mma_async, sm_90a): D[64 x N] += A[64 x k] .
    B[N x k]^T, both operands K-major in shared memory, read through matrix
    descriptors. One k step is always 32 bytes of K (16 16-bit or 32 8-bit
    elements); the accumulator fragment of each warp is the m16n8 one of
    mma.sync repeated over N / 8 columns."""
    types: str                # ".f32.f16.f16" part of the instruction
    k: int
    tail: str                 # operands after scale-d (scale/transpose immediates)
    # Whether D keeps a full fp32 sum. fp8 wgmma on sm_90 does not: its error
    # grows with K (fp8_e4m3_w8a8 on the H200: 2.2e-3 at K = 4096, 9.6e-3 at
    # 28672, 1.9e-2 at 57344, where the mma.sync kernels stay at 1.7e-3), so
    # its kernels sum each k-tile apart and add it up in fp32 registers
    # (planner.gemm.wgmma_promotes).
    exact_acc: bool = True


WGMMAS = {
    "float16": Wgmma("f32.f16.f16", 16, ", 1, 1, 0, 0"),
    "bfloat16": Wgmma("f32.bf16.bf16", 16, ", 1, 1, 0, 0"),
    "int8": Wgmma("s32.s8.s8", 32, ""),
    "float8_e4m3": Wgmma("f32.e4m3.e4m3", 32, ", 1, 1", exact_acc=False),
}
# The arch-specific target wgmma needs (its PTX does not exist for plain sm_90).
WGMMA_TARGET = {"sm_90": "sm_90a"}

# Widest global access a thread makes (bytes): one 128-bit vector.
VECTOR_BYTES = 16
# Rows of the XOR swizzle on 128-byte shared-memory rows (8 chunks of 16 bytes).
SWIZZLE_CHUNKS = 8


def arch(name: str) -> Arch:
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"unknown arch {name!r} (allowed: {', '.join(ARCHS)})") from None


def arch_from_cc(major: int, minor: int) -> Arch:
    """The closest arch we know at or below the device's compute capability."""
    cc = major * 10 + minor
    known = sorted((a for a in ARCHS.values() if a.cc <= cc), key=lambda a: a.cc)
    if not known:
        raise ValueError(f"compute capability {major}.{minor} is too old (need sm_80+)")
    return known[-1]


@dataclass(frozen=True)
class Device:
    """One GPU model: what the planner's launch-size rules need of it (the
    runtime asks the device itself: runtime/device.sm_count())."""
    name: str
    arch: str
    sms: int                  # streaming multiprocessors


DEVICES = {"H200": Device("H200", "sm_90", 132)}
# The device each arch is planned for where no GPU is asked (`opgen build`):
# the H200, the one device measured, for every arch (the calibration below is
# its; SM counts of other devices would change the older arches' picks).
PLANNED_DEVICE = {name: "H200" for name in ARCHS}


def planned_device(arch: str) -> Device:
    """The device `arch` is planned for without a GPU to ask (PLANNED_DEVICE)."""
    try:
        return DEVICES[PLANNED_DEVICE[arch]]
    except KeyError:
        raise ValueError(f"unknown arch {arch!r} (allowed: {', '.join(PLANNED_DEVICE)})") from None


@dataclass(frozen=True)
class Calibration:
    """Constants the planner's rules take from measurements on one device."""
    # Bytes of weights each GEMV thread keeps in flight.
    gemv_bytes_in_flight: int
    # Relative per-SM speed of the TMA GEMM's tile shapes (BM, BN).
    tma_tile_speed: Mapping[Tuple[int, int], float]
    # M from which the heuristic takes a predecode config, by what the fused
    # GEMM pays per decoded tile (planner.heuristic.predecode_from).
    predecode_m: Mapping[str, int]
    # Registers an MMA thread of the rs GEMM takes, by its decoding
    # (planner.rs.rs_kernel: "decode/fetch") and (BK, BM).
    rs_regs: Mapping[str, Mapping[Tuple[int, int], int]]
    # The rs GEMM kernels (planner.rs.kernel_class: decoding and activation type) checked
    # against the reference on this device: the heuristic picks no other
    # (the tuner times every one, and keeps only those it verified).
    rs_verified: FrozenSet[str]
    # The kernels of 8-bit activations checked against the reference on this
    # device, by kind and activation dtype: "predecode/int8" (sub-byte codes
    # widened once into int8 ones for int8 activations). The heuristic picks
    # no other (the tuner times every one, and keeps only those it verified).
    a8_verified: FrozenSet[str] = frozenset()
    # Up to which M the heuristic takes the int8 GEMV (planner.gemv.int_dot:
    # int8 activations, integer codes), checked against the reference and
    # timed on this device; 0: none (the tuner's to time).
    int8_gemv_max_m: int = 0
    # The same for the GEMVs that stage 8-bit activations as fp16 values
    # (e4m3 activations; the tensor-core GEMV's int8 ones), sub-byte codes.
    a8_gemv_max_m: int = 0
    # Whether the TMA GEMM's in-flight sums (Config.inflight_sums) were
    # checked against the reference and timed faster than the one-set
    # kernel on this device: until then the heuristic picks the one-set
    # kernel (the tuner times both, and keeps only verified winners).
    inflight_sums_verified: bool = False
    # The rs GEMM decodings (planner.rs.kernel_class) whose pair-table kernel
    # (Config.pair_table: each byte's two values looked up at once) was
    # checked against the reference and timed faster than theirs on this
    # device, each with the largest M where it was: the heuristic takes it
    # for them up to there (the tuner times both, and keeps only verified
    # winners).
    rs_pair_tables: Mapping[str, int] = field(default_factory=dict)
    # What decoding one weight row costs an rs GEMM block, in rows of M it
    # multiplies that row by (planner.heuristic's rs tile score).
    rs_decode_rows: int = 64
    # What staging one activation row costs such a block, in weight rows
    # multiplied by it (the widest tile's fewer blocks stage fewer rows).
    rs_staging_rows: int = 0
    # The rs GEMM kernels (planner.rs.kernel_class) the heuristic takes from
    # M = 9 instead of the tensor-core GEMV on layers wide enough to fill the
    # SMs with 64-row blocks.
    rs_from_m9: FrozenSet[str] = frozenset()
    # The share of the SMs those 64-row blocks must fill (one m-tile).
    rs_from_m9_fill: float = 0.85
    # rs_from_m9_fill of the kernels whose share differs (0: any layer).
    rs_from_m9_fill_of: Mapping[str, float] = field(default_factory=dict)
    # rs_from_m9_fill of these kernels where K <= rs_from_m9_short_k (a
    # short k-loop per block: fewer blocks than SMs still beat the
    # tensor-core GEMV).
    rs_from_m9_short_k_fill_of: Mapping[str, float] = field(default_factory=dict)
    rs_from_m9_short_k: int = 0
    # rs_decode_rows of the rs GEMM kernels (planner.rs.kernel_class) whose
    # decode costs otherwise.
    rs_decode_rows_of: Mapping[str, int] = field(default_factory=dict)
    # The rs GEMM kernels whose blocks of 64 weight rows and at most 64 rows
    # of M take four k-groups of 12 stages on a grid under one wave.
    rs_deep_kgroups: FrozenSet[str] = frozenset()
    # By rs GEMM kernel (planner.rs.kernel_class): the share of the SMs its
    # blocks must fill at M = 17-64, below which it gives way to a split-K
    # GEMM (narrow layers).
    rs_min_fill: Mapping[str, float] = field(default_factory=dict)
    # predecode_m["rs_gemm"] of the rs GEMM kernels (planner.rs.kernel_class)
    # whose threshold differs.
    rs_predecode_m_of: Mapping[str, int] = field(default_factory=dict)
    # The rs GEMM kernels whose pair-table kernel takes 128-deep k-tiles at
    # 16 rows of M (else 64-deep, as at every other m-tile).
    rs_pair_tables_128_deep: FrozenSet[str] = frozenset()
    # The rs GEMM kernels (planner.rs.kernel_class) whose rings shallower
    # than planner.rs.RS_FULL_RING (the tiles no full ring fits) matched the
    # reference on this device and won where timed: the heuristic picks no
    # other's (the tuner times and checks every one).
    rs_shallow_rings: FrozenSet[str] = frozenset()
    # By rs GEMM kernel (planner.rs.kernel_class): up to which M the
    # heuristic takes its 64-row weight tiles only.
    rs_rows64_max_m: Mapping[str, int] = field(default_factory=dict)
    # Warps per SM up to which a split-K GEMV's grid counts as filling the
    # device: splitting pays a reduction, so it only wins where the whole-K
    # grid leaves the SMs with fewer warps than this.
    gemv_split_fill_warps: int = 12
    # Code kinds (lower.Numerics.code_kind) whose row GEMV runs faster
    # without prefetching its next run of 16-byte vectors.
    gemv_no_prefetch: FrozenSet[str] = frozenset()
    # Codes a tensor-core GEMV's weight vector must hold for the heuristic
    # to take it at M = 9-16 (narrower vectors: the mma.sync GEMM); 0: any.
    tc_gemv_min_codes: int = 0
    # Code kinds (lower.Numerics.code_kind) whose tensor-core GEMV the
    # heuristic takes with 8 warps a block where those make about one
    # block per SM (rather than more, smaller blocks).
    tc_gemv_eight_warps: FrozenSet[str] = frozenset()
    # Sub-byte codes widened for 8-bit activations (lower.Numerics.widen),
    # on wgmma arches: from M = 17 up to this M the heuristic takes the
    # whole-K GEMM tile by waves x a block's work, and at M = 2-16 whole-K
    # 16-row tiles where they fill the SMs, as the tuned winners had them
    # (planner.heuristic); 0: neither (the decoded-weight GEMM rules).
    widened_waves_max_m: int = 0
    # What widening one weight row costs such a block, in rows of M it
    # multiplies that row by.
    widened_decode_rows: int = 64


H200 = Calibration(
    # 8 x 16-byte loads: at the ~16 resident warps per SM of a one-wave grid,
    # 64 KB per SM, about twice what Little's law asks of HBM3e (4.3 TB/s x
    # ~1 us / 132 SMs). Source: docs/performance.md#gemv
    gemv_bytes_in_flight=128,
    # Larger tiles move fewer bytes per flop; fitted by hand so that the
    # heuristic's TMA score picks the tuned winners' tile in most records of the
    # five bench shapes. Source: docs/performance.md#tma-gemm
    tma_tile_speed={(128, 256): 1.0, (128, 128): 0.9, (64, 256): 0.85, (64, 128): 0.75, (64, 64): 0.6},
    # Without a fused wgmma path (AWQ's [K, N] words) and with zero points
    # loaded per group (GPTQ, w1a16) predecode wins from M = 256; for the
    # other decoded formats the fused GEMM still wins at 256 and predecode
    # from 512; the rs GEMM (4-bit codes in the interleaved order) beat
    # predecode at M = 1024 at all five bench shapes; sub-byte codes widened
    # to int8 for int8 activations (w4a8_int8, bitnet_b158_a8, 8192^2, H100):
    # the predecode TMA GEMM 141.7 / 433.7 us and 133.8 / 424.0 against the
    # widened GEMM's 148.2 / 577.9 and 133.5 / 495.3 at M = 1024 / 4096: a
    # tie at 1024, so from the bucket above it (the runtime asks a bucket's
    # largest M: 1024 would take M = 513-1024 too). Their rs GEMM beat
    # predecode at M = 4096 (the largest bucket's M) in 7 of 8 tuned records
    # (W4A8, BitNet A8 x four LLM shapes, H100: 1.01-1.18x over the old
    # heuristic's predecode pick; predecode won W4A8 at 28672 x 8192), and at
    # M = 8192 on 8192^2 (the best of each, swept: 832.5 / 839.9 us W4A8,
    # 759.1 / 796.5 BitNet A8; W4A8's margin 1.03x at 4096, 1.01x there):
    # with it predecode starts at 16384 (untimed). The runtime asks the
    # largest bucket at 4096, so without a tuned record it never predecodes.
    # Source: docs/performance.md#predecode
    predecode_m={"no_fused_wgmma": 256, "zero_points": 256, "other": 512, "rs_gemm": 2048,
                 "widened_a8": 2048, "rs_widened_a8": 16384},
    # The most ptxas gave w4a16_sym over blocks, ring depths and k-groups
    # (tests/codegen/test_compiler.py keeps these upper bounds true; 2-bit
    # codes in their execution layout, of the same class, took up to 3 more
    # at (64, 128), (128, 64) and (128, 128), under the same launch caps).
    # Source: docs/performance.md#rs-gemm
    rs_regs={
        "magic/halves": {(64, 16): 72, (64, 32): 82, (64, 64): 96, (64, 128): 125, (64, 256): 185,
                         (128, 16): 95, (128, 32): 96, (128, 64): 124, (128, 128): 159},
        # The GPTQ *_repacked specs (two more items in flight per row, their
        # addresses): the most ptxas took under the caps of one and two MMA
        # warpgroups, except at (128, 16), where every config fits four
        # warpgroups' cap of 96 without spilling (it takes up to 117 where it may).
        # Four 128-deep k-groups of 32 rows and up do not fit. Source: docs/performance.md#rs-gemm
        "magic_int_zero/halves": {(64, 16): 91, (64, 32): 93, (64, 64): 107, (64, 128): 140, (64, 256): 205,
                                  (128, 16): 96, (128, 32): 127, (128, 64): 128, (128, 128): 167},
        # The decodings of pairs (lower.rs_pairs), measured on the stored
        # forms, whose pairs are moved into a word's halves first: the most
        # ptxas took over the configs without setmaxnreg, planned with the
        # tables above (none spilled): w2a16_g128 (2-bit pairs), bitnet_b158
        # (ternary, a float32 tensor scale) and bnb_nf4 (the 16-entry table,
        # float32 scales per 64: 64-deep tiles only). The 2-bit execution
        # layout (each pair already in a word's halves) compiles within
        # magic/halves' table and is planned by it.
        # Source: docs/performance.md#rs-gemm
        "magic/pairs": {(64, 16): 71, (64, 32): 79, (64, 64): 93, (64, 128): 127, (64, 256): 187,
                        (128, 16): 95, (128, 32): 95, (128, 64): 127, (128, 128): 161},
        "magic_cvt_scale/pairs": {(64, 16): 56, (64, 32): 64, (64, 64): 79, (64, 128): 119, (64, 256): 179,
                                  (128, 16): 79, (128, 32): 89, (128, 64): 105, (128, 128): 155},
        # The ternary and 1-bit execution layouts (each pair in a word's
        # halves; planner.execution): the same measure, 2026-12-07, but at
        # ternary's (128, 64) and 1-bit's (128, 32) the stored forms' figure
        # (105, 125: ptxas took 96 at both), which keeps four 128-deep MMA
        # warpgroups there out of the plan, as when the GPU checked them.
        "magic_cvt_scale/halves": {(64, 16): 55, (64, 32): 63, (64, 64): 78, (64, 128): 115, (64, 256): 174,
                                   (128, 16): 76, (128, 32): 80, (128, 64): 105, (128, 128): 128},
        # w1a16_g128 (1-bit, float zero points, q * s - z; 128-deep tiles:
        # 16 bytes a row): as at magic_int_zero's (128, 16), every config
        # fits four warpgroups' cap of 96 (it takes 117 where it may).
        "magic_float_zero_minus_z/pairs": {(128, 16): 96, (128, 32): 125, (128, 64): 127, (128, 128): 167},
        # Its execution layout; its 256-row tiles (a 3-deep ring:
        # planner.rs.RS_STAGES) take 235 in one MMA warpgroup, where nothing
        # caps it; two fit the producer warpgroup's split (232 each) without spills.
        "magic_float_zero_minus_z/halves": {(128, 16): 95, (128, 32): 125, (128, 64): 127, (128, 128): 167,
                                            (128, 256): 232},
        # fp8_e4m3_w8a16 (one code a byte: lanes 0-1 in one word, 2-3 in the next).
        "e4m3_cvt_scale/pairs": {(64, 16): 69, (64, 32): 79, (64, 64): 90, (64, 128): 122, (64, 256): 185,
                                 (128, 16): 95, (128, 32): 96, (128, 64): 117, (128, 128): 144},
        # mxfp4 (e2m1, e8m0 scales per 32: two or four a row and k-tile, one
        # word of them a row held as loaded until a unit converts them;
        # 2026-12-07).
        "fp4_cvt_scale/pairs": {(64, 16): 66, (64, 32): 72, (64, 64): 89, (64, 128): 120, (64, 256): 183,
                                (128, 16): 85, (128, 32): 88, (128, 64): 104, (128, 128): 140},
        "table_cvt_scale/pairs": {(64, 16): 80, (64, 32): 95, (64, 64): 96, (64, 128): 128, (64, 256): 220},
        # NF4 and MXFP4 with each byte's pair looked up at once (Config.pair_table):
        # the most ptxas took over both where no cap bound it (none spilled).
        # NF4 at (128, 16): the cap of four MMA warpgroups (96; 86-96 taken
        # in every ring, no spills), where w4a16_sym's 128-deep tiles won M =
        # 16. MXFP4 likewise (96 in one MMA warpgroup) since its four e8m0
        # scales a row and 128-deep tile are one word (four slot registers
        # before: 128 at (128, 16), spilling under that cap). Both with their scales held as
        # loaded until a unit converts them (2026-12-07).
        "pair_table_cvt_scale/pairs": {(64, 16): 72, (64, 32): 80, (64, 64): 96, (64, 128): 127,
                                       (64, 256): 190, (128, 16): 96, (128, 32): 128, (128, 64): 128,
                                       (128, 128): 168},
        "pair_table_fp4_cvt_scale/pairs": {(64, 16): 72, (64, 32): 80, (64, 64): 95, (64, 128): 125,
                                           (64, 256): 189, (128, 16): 96, (128, 32): 124, (128, 64): 128,
                                           (128, 128): 168},
        # Sub-byte codes widened to int8 for int8 activations (w4a8_int8,
        # bitnet_b158_a8, int8_int4_int32; w4a8_int8_g128: integer zero
        # points and group scales, its sums flushed per group into a second
        # set): the most ptxas took without setmaxnreg over the four specs'
        # configs (NVRTC 12.9; none spilled; the group kernel's 256-wide
        # m-tile spills at 255). Source: docs/performance.md#rs-gemm
        "widen/bytes": {(128, 16): 56, (128, 32): 64, (128, 64): 90, (128, 128): 124, (128, 256): 190},
        "widen_int_zero_group/bytes": {(128, 16): 93, (128, 32): 106, (128, 64): 130, (128, 128): 193},
        # w4a8_fp8 (e4m3 activations: widened codes through e4m3x4, fp32 sums
        # flushed every k-tile with their group scale): the same measure.
        "widen_e4m3_group/bytes": {(128, 16): 77, (128, 32): 88, (128, 64): 116, (128, 128): 180},
    },
    # Every config of each against the reference on the H200 at odd M, N, K
    # (test_kernel.py::test_rs_matches_reference; docs/performance.md#rs-gemm).
    rs_verified=frozenset({"magic/halves/float16", "magic_int_zero/halves/float16",
                           "magic/pairs/float16", "magic_cvt_scale/pairs/float16",
                           "table_cvt_scale/pairs/float16", "magic_float_zero_minus_z/pairs/float16",
                           "e4m3_cvt_scale/pairs/float16", "fp4_cvt_scale/pairs/float16",
                           # codes widened for int8 activations: every config of the four
                           # specs at odd M, N, K on an H100 (docs/performance.md#rs-gemm);
                           # for e4m3 ones (w4a8_fp8) likewise
                           "widen/bytes/int8", "widen_int_zero_group/bytes/int8",
                           "widen_e4m3_group/bytes/float8_e4m3",
                           # ternary and 1-bit codes in their execution layouts: every
                           # config at odd M, N, K on an H100 (docs/performance.md#execution-layouts)
                           "magic_cvt_scale/halves/float16", "magic_float_zero_minus_z/halves/float16"}),
    # Fitted to the tuned records (the rs specs at the bench's and
    # Llama-3-8B's shapes): with it the heuristic's rs tile is the winner's
    # in 132 of the shipped DB's 143 rs records; 32-256 do nearly as well, 0
    # (waves x tile area alone) much worse. Source: docs/performance.md#heuristic
    rs_decode_rows=64,
    # At M = 4096 on 28672 x 8192 (H100) 128-row tiles beat 64-row ones by
    # 1.15x (int8 x int4, 256-row m-tiles) and 1.14x (W4A8 fp8, 128; the
    # records' heuristic_us), where waves x BN x (64 + BM) alone took the 64-row ones
    # (55 waves against 28 at 256-row m-tiles, 109 against 55 at 128); any
    # of 4-16 picks those, and of the rs records it changes no other tile
    # pick but one (w4a8_int8_g128 there, whose 128 x 64 won); 0 and 32 lose
    # records. Source: docs/performance.md#heuristic
    rs_staging_rows=8,
    # The 4-bit interleaved decodings: at M = 9-16 their rs GEMM won 13 of
    # 15 records where N / 64 >= 0.85 x the SMs (1.22-2.17x over the
    # heuristic's tensor-core GEMV). The other decodings won 1 of 40 there.
    # Source: docs/performance.md#heuristic
    # On an H100 at 8192^2, M = 16, NF4's, MXFP4's, fp8 weights' and
    # 1-bit's rs GEMM (12-stage rings, four k-groups) took 36.0, 31.8, 30.7
    # and 27.5 us against their tensor-core GEMV's 40.3, 49.8, 60.1 and 36.7;
    # on the H200 2-bit's and ternary's 25.7 and 25.1 against the tuned
    # GEMVs' 27.4 and 27.1. Source: docs/performance.md#heuristic
    # Codes widened for int8 activations (H100, empty DB, M = 16, five
    # shapes): their rs GEMM won 15 of 20 records, 1.07-2.44x over the
    # heuristic's 16-row GEMMs; split-K mma.sync won twice at 4096 x 14336
    # (BitNet A8 1.13x over the rs GEMM) and the tensor-core GEMV three
    # times at 1024 x 4096 (not a pick for them past M = 1: a8_gemv_max_m).
    # Source: docs/performance.md#heuristic
    rs_from_m9=frozenset({"magic/halves/float16", "magic_int_zero/halves/float16",
                          "table_cvt_scale/pairs/float16", "fp4_cvt_scale/pairs/float16",
                          "e4m3_cvt_scale/pairs/float16", "magic_float_zero_minus_z/pairs/float16",
                          "magic/pairs/float16", "magic_cvt_scale/pairs/float16",
                          "magic_cvt_scale/halves/float16", "magic_float_zero_minus_z/halves/float16",
                          "widen/bytes/int8", "widen_int_zero_group/bytes/int8",
                          "widen_e4m3_group/bytes/float8_e4m3"}),
    # They won at N = 5120 too (0.61 x the SMs: Qwen2.5-14B, tuned on an
    # H100) by 1.25x and 1.58x, and at N = 4608 (0.55 x: Qwen2.5-7B's fused
    # q / k / v, H100) by 1.35x, 1.45x and 1.65x (w4a16_sym, NF4, MXFP4);
    # at N = 4096 and 1024 (0.48 x and below) the GEMV won 2 of 3 (the
    # third, at 4096^2, went to the rs GEMM by 1.09x: since K <= 4096 there,
    # rs_from_m9_short_k_fill_of below takes it). Source:
    # docs/performance.md#heuristic
    rs_from_m9_fill=0.5,
    # Where K <= 4096, from 0.4 x the SMs for the integer and table
    # decodings: at N = K = 4096 and 3584 (0.48 and 0.42 x) their rs GEMM
    # won 10 of 11 records (w4a16_sym, GPTQ, NF4, MXFP4, and W2, W1,
    # ternary in their execution layouts; H200 and H100) and an H100 sweep
    # at M = 16 by 1.08-1.18x over the tensor-core GEMV; at K = 14336 and
    # 18944 on the same rows the GEMV or a split-K GEMM won by 1.1-1.2x.
    # fp8 weights' GEMV won there (H200). Source: docs/performance.md#heuristic
    rs_from_m9_short_k_fill_of={k: 0.4 for k in (
        "magic/halves/float16", "magic_int_zero/halves/float16", "table_cvt_scale/pairs/float16",
        "fp4_cvt_scale/pairs/float16", "magic_float_zero_minus_z/pairs/float16",
        "magic/pairs/float16", "magic_cvt_scale/pairs/float16", "magic_cvt_scale/halves/float16",
        "magic_float_zero_minus_z/halves/float16")},
    rs_from_m9_short_k=4096,
    # The widened codes' rs GEMM on every layer (above: where it lost, by
    # up to 1.13x, to kernels the rules would not pick). e4m3 activations
    # (w4a8_fp8, H100, empty DB, 8192^2): it won at M = 16, 128 and 1024,
    # 1.61-1.91x over the picks before. Source: docs/performance.md#heuristic
    rs_from_m9_fill_of={"widen/bytes/int8": 0.0, "widen_int_zero_group/bytes/int8": 0.0,
                        "widen_e4m3_group/bytes/float8_e4m3": 0.0},
    # NF4 on 1024-row layers at M = 17-64 (0.24-0.48 x the SMs in rs
    # blocks): split-K GEMMs beat its rs GEMM by 1.65x and 1.75x at 17-32
    # (mma.sync), 1.37x and 1.66x at 33-64 (wgmma) (H100, H200); the 4-bit
    # interleaved decodings' rs GEMM held there. MXFP4 at M = 33-64 (H200,
    # H100): split-K GEMMs won on 1024 x 4096, 1024 x 8192 (Qwen2.5-72B's
    # k / v, never tuned before) and 512 x 3584, 1.20-1.56x over its rs GEMM.
    # Source: docs/performance.md#heuristic
    rs_min_fill={"table_cvt_scale/pairs/float16": 0.5, "fp4_cvt_scale/pairs/float16": 0.5},
    # The widened codes' group kernel (its second set of sums, flushed per
    # scale group): 64-row weight tiles won all 25 of its records at M =
    # 16-256 (H100, five shapes), 1.07-1.53x over the 128-row tiles the
    # score took at 28672 x 8192 (M = 16-128), 8192^2 and 6144 x 4096 (M =
    # 256); from M = 1024 128-row tiles won 7 of 10.
    # Source: docs/performance.md#heuristic
    rs_rows64_max_m={"widen_int_zero_group/bytes/int8": 256},
    # NF4 at M = 9-16: of its 12 records where 128-deep pair-table tiles
    # were candidates (four MMA warpgroups since c7daba1, one or two
    # before), they won the 9 on grids of up to two waves (8192^2, 4096^2,
    # 8192 x 28672 / 29568, 10240 to 29568 rows; 1.03-1.24x over the
    # 64-deep picks, H200) and 64-deep ones the 3 wider (18944, 37888,
    # 59136 rows: 2.2-7 waves of 64-row blocks). MXFP4's 64-deep tiles won
    # at 16 rows. Source: docs/performance.md#heuristic
    rs_pair_tables_128_deep=frozenset({"table_cvt_scale/pairs/float16"}),
    # W1's 256-row tiles in 3-deep rings (no 4-deep ring fits them) matched
    # the reference on an H100 and won its M = 1024 records at all five bench
    # shapes (1.09-1.20x over the 128-row picks), M = 256 at 28672 x 8192 and
    # 14336 x 57344 (1.19x, 1.21x). Source: docs/performance.md#rs-gemm
    rs_shallow_rings=frozenset({"magic_float_zero_minus_z/halves/float16"}),
    # NF4's table decode costs about twice the 4-bit magic one per weight
    # row: at M = 257-512 on 5120-row layers its winners were 256 x 128
    # tiles (one wave), 1.22x and 1.34x over the 128 x 64 ones (three
    # waves) that 64 rows of decode cost pick.
    # Source: docs/performance.md#heuristic
    rs_decode_rows_of={"table_cvt_scale/pairs/float16": 128},
    # w4a16_sym's rs GEMM (magic/halves) won 7 of its 8 H200 records at M =
    # 4096, 1.01-1.21x over the heuristic's predecode pick (median 1.09x;
    # predecode won 14336 x 57344); GPTQ's (magic_int_zero/halves) 6 of 10,
    # the stored forms' other decodings none: from 8192 for it (the
    # runtime's bucket M never reaches it), 2048 for them. In their
    # execution layouts 2-bit codes (magic/halves too) and ternary ones won
    # all 5 of their H100 records each at M = 4096 (five shapes; 1.01-1.13x
    # and 1.06-1.11x over predecode), 1-bit codes none.
    # Source: docs/performance.md#predecode
    rs_predecode_m_of={"magic/halves/float16": 8192, "magic_cvt_scale/halves/float16": 8192},
    # NF4's blocks of 64 weight rows and <= 64 rows of M on grids under one
    # wave: four k-groups won all 13 such records (12 stages in 9, 8 in 4),
    # 1.10-1.17x over the two of 8 picked before where the H100 timed both;
    # on wider grids two k-groups won (4 of 4). MXFP4's pair-table kernel
    # too (8192^2, M = 64: 34.3 vs 36.9 us, H200; its code-by-code kernel
    # 39.7 either way). The widened codes' with a channel or tensor scale
    # (H100, empty DB, five shapes, M = 16-1024): four of 12 won 33 of 40
    # such records; the group kernel's (its second set of sums) 32- and
    # 64-row tiles took two of 6-8 in all 7, four up to 1.59x their time.
    # Source: docs/performance.md#heuristic
    rs_deep_kgroups=frozenset({"table_cvt_scale/pairs/float16", "fp4_cvt_scale/pairs/float16",
                               "widen/bytes/int8"}),
    # At M = 1 on 1024-row layers (6-8 warps per SM unsplit) the whole-K GEMV
    # beat the split-in-two one by 1.49-1.56x (4 records: H200 and H100), and
    # on 512-row ones (about 4 warps per SM) by 1.42-1.66x (5 records, four
    # formats, H100: Qwen2.5-7B's k / v and gpt-oss-20b's): a split-K row
    # GEMV's warps count up to 3 per SM. Source: docs/performance.md#heuristic
    gemv_split_fill_warps=3,
    # NF4 (codebook lookups) at M = 1: w8 c4 v16 s1 23.5 us without
    # prefetch, 27.5 with (13824 x 5120, H100); the H200's NF4 winners at
    # M = 1 all without it (7 shapes).
    # Source: docs/performance.md#gemv
    gemv_no_prefetch=frozenset({"table"}),
    # At M = 9-16, where a scale group (MXFP4's 32 codes) or the layer's K
    # (3584 x 18944) leaves the tensor-core GEMV 4-byte vectors of 4-bit
    # codes (8 a load), the GEMV was the pick in 8 records: the split-K
    # mma.sync GEMM (16 x 64 or 16 x 128 tiles, 8 ways) won 6 of them,
    # NF4's rs GEMM one, the GEMV one (MXFP4 1024 x 8192, with 8 warps where
    # the pick had 4). Where the record timed today's GEMV pick it took
    # 1.13-1.30x the winner's time (MXFP4 512 x 3584, 1024 x 5120, 1024 x
    # 8192, 3584 x 18944; NF4 3584 x 18944). Source: docs/performance.md#heuristic
    tc_gemv_min_codes=16,
    # NF4's tensor-core GEMV on 1024-row layers at M = 8-16: 8-warp blocks
    # (128, split 16 ways) won all 4 records (H200 1024 x 4096 M = 8, 16,
    # 1024 x 8192; H100 1024 x 5120), the 4-warp pick (256 blocks) took
    # 1.18x their time in the two that timed it; every NF4 tensor-core GEMV
    # winner of both DBs has 8 warps. Source: docs/performance.md#heuristic
    tc_gemv_eight_warps=frozenset({"table"}),
    # The int8 GEMV, H100 (132 SMs, as the H200), empty DB: at M = 1 and 2
    # it won all 50 buckets of w4a8_int8, its g128 form, bitnet_b158_a8,
    # w8a8_int8 and int8_int4_int32 at 8192^2, 4096^2, 1024 x 4096, 28672 x
    # 8192 and 4096 x 14336 (M = 2: 1.08-4.4x over the GEMMs picked before;
    # M = 1: the fp16-staged GEMV it replaced took 1.2-1.7x its time at
    # 8192^2); at M = 4 (8192^2) 1.07-1.40x; at M = 8 it lost wherever mmax
    # 8 needs split-K (8192^2 and up). At M = 2-4 only
    # unsplit (heuristic.a8_pickable): where mmax 4 needs split-K (K >=
    # 13824) the GEMM or the tensor-core GEMV won all 10 such records
    # (1.14-1.69x over the split int8 GEMV); at M = 1 the split one held.
    # Source: docs/performance.md#widened-codes-8-bit-activations
    int8_gemv_max_m=4,
    # 8192^2 (H200): at M = 1 the fp16-staged row GEMV beat the best GEMM by
    # 1.16x (w4a8_int8 16.7 vs 19.3 us, before the int8 GEMV) and 1.07x
    # (bitnet_b158_a8 15.3 vs 16.4); at M = 4 the GEMMs won 2 of 2 against
    # the row GEMV (1.29-1.44x) and 1 of 2 against the tensor-core one. Its
    # e4m3 activations run the same GEMV, untimed.
    # Source: docs/performance.md#widened-codes-8-bit-activations
    a8_gemv_max_m=1,
    # w4a8_int8 and bitnet_b158_a8 at 4096^2, 8192^2 and 28672 x 8192, M =
    # 16-256, tuned on an empty DB (H100, same SM count): the winners were
    # whole-K tiles at every M from 17 (wgmma ones in 11 of 12 buckets to
    # 64), 64 x 64 where it fills a wave and taller or wider tiles where
    # they fill as many; the split-K GEMMs picked before took a median
    # 1.53x their time, worst 2.42x (4096^2, M = 128: 38.9 vs 16.1 us).
    # At M = 2-16 the 16-row tiles over the whole K where they fill 0.8 of
    # a wave (28672 x 8192: split two ways before, 1.6x the winner's time at
    # M = 16). Timed as picked (105 buckets, five shapes, three specs):
    # median 1.00x at M = 17-256, worst 1.25x. Source: docs/performance.md#heuristic
    widened_waves_max_m=256,
    # Those records' tiles follow from any cost of 22 rows and more (below,
    # 28672 x 8192 at M = 128 took 64-row tiles, where 128-row ones won);
    # as the rs GEMM's. Source: docs/performance.md#heuristic
    widened_decode_rows=64,
    # A8 predecode of int8 activations matched the reference at M = 300 /
    # 1000 with tails (H100) and in every sweep and bench row; timed:
    # predecode_m["widened_a8"]. (e4m3 activations: neither checked nor timed.)
    # Source: docs/performance.md#widened-codes-8-bit-activations
    a8_verified=frozenset({"predecode/int8"}),
    # fp8 W8A8 (H200, 8192^2, M = 4096): 471 vs 530 us (1.12x); H100 1.07x
    # and 1.16x at M = 1024 and 4096; bit for bit the one-set kernel's output.
    # (Untimed below M = 1024: a block's k-loop is the same at any M.)
    # Source: docs/performance.md#tma-gemm
    inflight_sums_verified=True,
    # H200, 8192^2: NF4's pair tables 1.29x, 1.23x, 1.09x at M = 16, 64,
    # 256; MXFP4's 1.02x, 1.16x, and 0.96x at 256. Bit for bit the
    # code-by-code kernel's output. Source: docs/performance.md#rs-gemm
    rs_pair_tables={"table_cvt_scale/pairs/float16": 256, "fp4_cvt_scale/pairs/float16": 64},
)
CALIBRATION = {"H200": H200}


def calibration(arch: str) -> Calibration:
    """What the planner's rules for `arch` were measured on (its planned device)."""
    return CALIBRATION[planned_device(arch).name]
