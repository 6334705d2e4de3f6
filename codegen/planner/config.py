"""What a kernel configuration is (Config), the alignment every kernel relies
on (check_shape), and the error for what cannot run (PlanError)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..errors import UserError
from ..lower import weight_layout
from ..spec import Spec

# Alignment rules every kernel relies on (documented in docs/spec.md).
K_ALIGN = 32     # K % 32 == 0: 16-byte rows for every packed format
N_ALIGN = 8      # N % 8 == 0: output pairs and one mma n-tile


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
