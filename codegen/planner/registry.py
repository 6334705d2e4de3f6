"""The kernel families behind one entry point: which family a config is
(family_of), its template constants (geometry) and its launch plan (plan),
and the launch facts read from them (grid, launch_smem, shape_ok)."""
from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

from .. import hw
from ..lower import numerics, weight_layout
from ..spec import A8_DTYPES, INT_OUT_DTYPES, Spec
from . import dequant, gemm, gemv, rs, tma
from .config import Config, PlanError
from .dequant import dense_twin
from .launch import Family, GridRule, Launch, staged_smem

FAMILIES: Dict[str, Family] = {f.name: f for f in (gemm.FAMILY, tma.FAMILY, rs.FAMILY, gemv.FAMILY,
                                                    dequant.FAMILY)}


def family_of(cfg: Config) -> Family:
    """The family whose kernel a config runs (a predecode config's: its GEMM's)."""
    if cfg.family in ("gemv", "dequant"):
        return FAMILIES[cfg.family]
    if cfg.rs or cfg.kgroups != 1 or cfg.pair_table:
        return FAMILIES["rs"]
    if cfg.tma or cfg.cluster != 1 or cfg.raster or cfg.inflight_sums:
        return FAMILIES["tma"]
    return FAMILIES["gemm"]


def kernel_numerics(spec: Spec, cfg: Config, arch: str):
    """The numerics (lower.Numerics) cfg's kernel computes in: the spec's,
    except that the GEMVs stage 8-bit activations as fp16 values (code x
    a_scale[m]) and decode the weights to fp16 (lower.numerics a_to_f16),
    but for the int8 GEMV (gemv.int_dot: int8 codes and int32 sums)."""
    return numerics(spec, fp8_mma=hw.arch(arch).fp8_mma,
                    a_to_f16=(cfg.family == "gemv" and spec.a.dtype in A8_DTYPES
                              and not gemv.int_dot(spec, cfg)))


def geometry(spec: Spec, cfg: Config, arch: str) -> Dict:
    """Template constants for (spec, cfg, arch), or PlanError saying why not.
    A predecode config's: its dense GEMM's, marked predecode."""
    a = hw.arch(arch)
    num = kernel_numerics(spec, cfg, arch)
    # Sub-byte codes with 8-bit activations: the cp.async GEMM widens them to
    # int8 / e4m3 in registers (gemm.cu.j2), on the 8-bit MMA; without an
    # e4m3 MMA (sm_80) both operands are widened to fp16 (a_decode). The TMA
    # GEMM's producer warpgroup widens them into the stage (channel or tensor
    # scales: planner.tma); the rs GEMM into its int8 fragment registers
    # (int8 activations: planner.rs). The int8 GEMV multiplies int8 codes
    # (gemv.int_dot), the other GEMVs take the activations as fp16 values
    # (kernel_numerics); predecode widens the codes once, for the dense 8-bit
    # GEMMs.
    int_out_ok = (family_of(cfg) in (FAMILIES["gemm"], FAMILIES["rs"]) and not cfg.predecode
                  or cfg.family == "gemv" and gemv.int_dot(spec, cfg))
    if spec.out.dtype in INT_OUT_DTYPES and not int_out_ok:
        raise PlanError(f"only the cp.async and rs GEMMs and the int8 GEMV write an "
                        f"{spec.out.dtype} output (the raw accumulator)")
    w = spec.b
    if w is not None and ((w.pack and w.pack.planes) or (w.zero.pack and w.zero.pack.planes)):
        # No kernel reads planes: opgen.load and build run the execution spec.
        raise PlanError(f"{spec.name}: no kernel reads codes packed in planes; its execution "
                        f"spec (planner.execution_spec) holds them packed in runs")
    mma = hw.MMAS[num.mma]
    if mma.min_cc > a.cc:
        raise PlanError(f"{num.mma} activations need sm_{mma.min_cc}+ tensor cores (target {arch})")
    lay = weight_layout(spec)
    if cfg.family == "gemm" and cfg.predecode:
        if num.dense:
            raise PlanError("predecode is for weights that need decoding")
        dequant.geometry(spec, dequant.dequant_config(spec), a, num, lay)   # the first stage must fit too
        dense = geometry(dense_twin(spec), dataclasses.replace(cfg, predecode=False), arch)
        return dict(dense, predecode=True)
    return family_of(cfg).geometry(spec, cfg, a, num, lay)


def plan(spec: Spec, cfg: Config, arch: str) -> Launch:
    """The launch plan of a single-kernel config (a predecode config is
    several kernels: plan each of its stages), or PlanError."""
    if cfg.predecode:
        raise ValueError(f"{cfg.name} launches several kernels: plan each of planner.stages")
    g = geometry(spec, cfg, arch)
    fam = family_of(cfg)
    return Launch(kind=fam.kind(cfg, g), threads=g["threads"], smem=g.get("smem", 0),
                  target=g.get("target", arch), grid=fam.grid(spec, cfg),
                  tma=fam.tma(cfg, g) if fam.tma else None,
                  staged_rows=fam.staged(cfg, g) if fam.staged else 0, k_split=cfg.split_k, consts=g)


def grid_rule(spec: Spec, cfg: Config) -> GridRule:
    return family_of(cfg).grid(spec, cfg)


def grid(spec: Spec, cfg: Config, M: int, N: int) -> Tuple[int, int, int]:
    """The launch grid of cfg's (last) kernel at M, N."""
    return grid_rule(spec, cfg)(M, N)


def blocks(spec: Spec, cfg: Config, M: int, N: int) -> int:
    """Thread blocks one launch of cfg runs."""
    x, y, z = grid(spec, cfg, M, N)
    return x * y * z


def launch_smem(g: Dict, cfg: Config, K: int) -> int:
    """Dynamic shared memory of one launch at K, from cfg's geometry (a
    predecode config's: its GEMM's); Launch.smem_at once planned."""
    fam = family_of(cfg)
    rows = fam.staged(cfg, g) if fam.staged else 0
    return staged_smem(rows, cfg.split_k, K) if rows else g.get("smem", 0)


def shape_ok(g: Dict, cfg: Config, N: int, K: int) -> bool:
    """Whether a config whose geometry is g runs at N, K."""
    return family_of(cfg).shape_ok(g, cfg, N, K)
