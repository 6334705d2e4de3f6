"""The dequant kernel (dequant.cu.j2): the first stage of a predecode
config, which decodes the weights once into a dense [N, K] tensor that the
dense GEMM of the spec's twin then reads (large M)."""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Tuple

from .. import hw
from ..lower import Layout, Numerics
from ..spec import A8_DTYPES, Shape, Spec, Weight
from .config import Config, PlanError
from .launch import Axis, Family, GridRule
from .tiles import decoded_tile

# The dequant stage of every predecode config: one 128 x 64 tile per block
# (8-bit codes: 128 x 128, rows of 128 bytes as the decoded tile needs).
DEQUANT = Config("dequant", BN=128, BK=64)
DEQUANT_8BIT = Config("dequant", BN=128, BK=128)
DEQUANT_THREADS = 256
DEQUANT_KSPLIT = 16          # blocks along k (each walks every 16th k-tile of its rows)


def geometry(spec: Spec, cfg: Config, a: hw.Arch, num: Numerics, lay: Layout) -> Dict:
    """The dequant kernel: a tile of stored words -> the K-major decoded tile
    (the GEMM's decode, shared) -> dense [N, K] rows in global memory: values
    of the activation dtype (scales and zero points applied), or for
    sub-byte codes with 8-bit activations (num.widen) their q - z as 8-bit
    codes, whose channel or tensor scale the dense GEMM's epilogue applies."""
    if num.dense:
        raise PlanError("dense weights need no dequant stage")
    if num.widen:
        if num.scale_gran == "group":
            raise PlanError("predecoded 8-bit codes take channel or tensor scales (a group's "
                            "scale applies to its partial sums)")
        ce = 1
    elif spec.a.dtype not in ("float16", "bfloat16"):
        raise PlanError("predecoded weights are float16/bfloat16 (the activation dtype), or "
                        "8-bit codes widened for 8-bit activations")
    else:
        ce = 2
    g = decoded_tile(lay, num, cfg.BN, cfg.BK, kmajor=True, ce=ce)
    smem = g["b_rows"] * g["b_rowb"] + g["bs_rows"] * g["bs_rowb"]
    return dict(g, threads=DEQUANT_THREADS, smem=smem, a_decode=False, dense=False, ce=ce)


def dequant_config(spec: Spec) -> Config:
    """The dequant stage's config for spec (8-bit outputs: 128-deep tiles)."""
    return DEQUANT_8BIT if spec.a.dtype in A8_DTYPES else DEQUANT


@functools.lru_cache(maxsize=None)
def dense_twin(spec: Spec) -> Spec:
    """What the GEMM of a predecode config multiplies: the same op on dense
    weights of the activation dtype, stored [N, K]: scales already applied;
    for 8-bit activations the codes' q - z, which keep their channel or
    tensor scale (numerics.widen)."""
    # Named by what the dense kernel depends on, so formats share its kernels.
    epi = spec.epilogue
    s = spec.b.scale if spec.a.dtype in A8_DTYPES else None
    name = "_".join(["dense", spec.a.dtype, spec.out.dtype]
                    + ([f"s{s.dtype}", s.granularity] if s is not None else [])
                    + (["bias"] if epi.bias else [])
                    + ([epi.activation] if epi.activation != "none" else []))
    return dataclasses.replace(spec, name=name, description="", shape=Shape(),
                               b=Weight(dtype=spec.a.dtype, layout="nt", scale=s))


def stages(spec: Spec, cfg: Config) -> List[Tuple[Spec, Config]]:
    """The kernels one config launches, in order, each a (spec, config) that
    compiles on its own: the config itself, or for predecode the dequant
    stage of spec and then the dense GEMM of its twin."""
    if not cfg.predecode:
        return [(spec, cfg)]
    return [(spec, dequant_config(spec)), (dense_twin(spec), dataclasses.replace(cfg, predecode=False))]


def grid(spec: Spec, cfg: Config) -> GridRule:
    """Blocks of BN weight rows by DEQUANT_KSPLIT slices of k."""
    return GridRule(Axis("N", cfg.BN), Axis("", DEQUANT_KSPLIT))


FAMILY = Family("dequant", geometry, kind=lambda cfg, g: "dequant", grid=grid)
