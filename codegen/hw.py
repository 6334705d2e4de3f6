"""Hardware facts as data: per-arch limits and the tensor-core shapes we use.

Everything the planner and the templates need to know about a GPU lives here,
so that supporting a new arch means adding a row, not branches in code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


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


WGMMAS = {
    "float16": Wgmma("f32.f16.f16", 16, ", 1, 1, 0, 0"),
    "bfloat16": Wgmma("f32.bf16.bf16", 16, ", 1, 1, 0, 0"),
    "int8": Wgmma("s32.s8.s8", 32, ""),
    "float8_e4m3": Wgmma("f32.e4m3.e4m3", 32, ", 1, 1"),
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
