"""What a kernel configuration is (Config), the sizes every kernel relies
on (check_shape: alignment and the reach of 32-bit indexing), and the error
for what cannot run (PlanError)."""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, fields
from typing import List, Tuple

from ..errors import UserError
from ..lower import weight_layout
from ..spec import CONTAINER_BITS, WEIGHT_CODES, Spec

# Alignment rules every kernel relies on (documented in docs/spec.md).
K_ALIGN = 32     # K % 32 == 0: 16-byte rows for every packed format
N_ALIGN = 8      # N % 8 == 0: output pairs and one mma n-tile
QUANTIZE_K_ALIGN = 8   # op quantize: K % 8 == 0, rows read 16 bytes and written 8 codes at a time

# What the kernels' 32-bit index arithmetic holds (templates/*.j2): M, N, K are
# `int` arguments, and so are a tile's origin plus the tile, offsets along k and
# into a row of weights, and the index of a scale or zero point (decode.cuh.j2's
# scale_index: (k / group) * N + n); a row times its stride is `long`. Hence each
# size below SIZE_LIMIT (a size plus a tile, or a row of 2-byte elements in bytes,
# then stays below 2^31), and a scale (zero-point) table of fewer than INDEX_LIMIT
# entries.
SIZE_LIMIT = 1 << 30
INDEX_LIMIT = 1 << 31


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
    rs: bool = False       # gemm (tma, 4-bit codes): the rs GEMM, operands swapped, D[n, m] =
                           # W . A^T: the weights are wgmma's register operand, decoded by the
                           # MMA warps straight into fragments (no shared-memory round trip),
                           # the activations its shared-memory one (BM = the m-tile = wgmma's N)
    kgroups: int = 1       # gemm (rs): MMA warpgroups per 64 weight rows, taking turns by k-tile
                           # (one's decode and wgmma latency hide behind the others'), summed
                           # in shared memory at the end
    inflight_sums: bool = False  # gemm (tma, wgmma whose sums are added up per k-tile: fp8):
                                 # two k-tiles issued back to back into two sets of sums, the
                                 # first added up while the second runs (the one-set kernel
                                 # waits for each tile's before it issues the next)
    pair_table: bool = False  # gemm (rs, 4-bit codebook or e2m1 codes whose pairs are bytes):
                              # each byte's two values looked up at once in a shared table of
                              # value pairs (one copy per lane: 32 KiB), not code by code

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
        ins = "_is" if self.inflight_sums else ""
        pt = "_pt" if self.pair_table else ""
        return (f"gemm_{self.BM}x{self.BN}x{self.BK}_w{self.WM}x{self.WN}"
                f"_p{self.stages}_s{self.split_k}{occ}{wg}{tma}{cl}{ra}{rs}{pt}{ins}{pd}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def shape_problems(spec: Spec, N=None, K=None, M=None) -> List[Tuple[str, str]]:
    """The size rule every kernel relies on, stated once, as (dimension,
    problem) pairs for the sizes given (None: not known yet, its rules are
    skipped): what check_shape raises, and what `opgen check` reports at
    shape.N / shape.K for the sizes a spec fixes."""
    out: List[Tuple[str, str]] = []
    sizes = {"M": M, "N": N, "K": K}
    for dim, v in sizes.items():
        if v is None:
            continue
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            out.append((dim, f"{dim}={v!r} must be an integer"))
            sizes[dim] = None
        elif v >= SIZE_LIMIT:
            out.append((dim, f"{dim}={v} is out of range (allowed: 1..{SIZE_LIMIT - 1}: the "
                             "kernels index with 32-bit int)"))
            sizes[dim] = None
        elif v <= 0 and not (spec.op == "quantize" and dim == "K"):   # (its rule says positive)
            out.append((dim, f"{dim}={v} must be positive"))
            sizes[dim] = None
    N, K = sizes["N"], sizes["K"]
    for dim, want, got in (("N", spec.shape.N, N), ("K", spec.shape.K, K)):
        if want is not None and got is not None and want != got:
            out.append((dim, f"{dim}={got} but the spec fixes {dim}={want}"))
    w = spec.b
    if spec.op == "quantize":
        if K is not None and (K <= 0 or K % QUANTIZE_K_ALIGN):
            out.append(("K", f"K={K} must be a positive multiple of {QUANTIZE_K_ALIGN} "
                             "(16-byte row loads)"))
        return out
    if K is not None and K % K_ALIGN:
        out.append(("K", f"K={K} must be a multiple of {K_ALIGN}"))
    if N is not None and N % N_ALIGN:
        out.append(("N", f"N={N} must be a multiple of {N_ALIGN}"))
    scale = w.scale if w is not None else None
    group = scale.group if scale is not None and scale.granularity == "group" else None
    if K is not None and group and K % group:
        out.append(("K", f"K={K} must be a multiple of the scale group {group}"))
    if N is not None and w is not None and w.pack is not None and w.pack.axis == "n":
        P = weight_layout(spec).P
        if N % P:
            out.append(("N", f"N={N} must be a multiple of {P} (codes per word, packed along n)"))
    if w is not None:
        out += _packed_zero_problems(w, N, K)
    if N is not None and w is not None:
        lay = weight_layout(spec)
        # Weights stored [K, N]: tiles are copied in 16-byte chunks from each row.
        unit = 16 * lay.col_div // lay.elem_bytes
        if lay.row_axis == "k" and N % unit:
            out.append(("N", f"N={N} must be a multiple of {unit} (weights stored [K, N] need "
                             "16-byte rows)"))
    if N is not None and K is not None and group and N * (K // group) >= INDEX_LIMIT:
        out.append(("K", f"N * K / group = {N * (K // group)} scales is too many for the kernels' "
                         f"32-bit index (allowed: below {INDEX_LIMIT})"))
    return out


def _packed_zero_problems(w, N, K) -> List[Tuple[str, str]]:
    """Int zero points packed Pz to a word fill whole words: N along n,
    K / group along k (else the stored zeros lose their last partial word,
    e.g. K = 512, group 128, 8 per int32: shape (0, N))."""
    z = w.zero
    if z.kind != "int" or z.pack is None or w.scale is None:
        return []
    Pz = CONTAINER_BITS[z.pack.container] // WEIGHT_CODES[z.dtype].bits
    packed = f"{Pz} zero points per {z.pack.container}, packed along {z.pack.axis}"
    if z.pack.axis == "n" and N is not None and N % Pz:
        return [("N", f"N={N} must be a multiple of {Pz} ({packed})")]
    group = w.scale.group if w.scale.granularity == "group" else None
    if z.pack.axis == "k" and group and K is not None and K % group == 0 and (K // group) % Pz:
        return [("K", f"K={K} must be a multiple of {group * Pz} (group {group}, {packed})")]
    return []


def check_shape(spec: Spec, N=None, K=None, M=None) -> None:
    """Raises PlanError naming every way the sizes break the rule (shape_problems)."""
    problems = shape_problems(spec, N, K, M)
    if problems:
        raise PlanError("; ".join(p for _, p in problems))
