"""`opgen build`: spec -> generated .cu + cubin per kernel + a JSON plan.

For a dynamic M the plan holds one kernel per M bucket's heuristic pick (the
same kernel serves several buckets when their picks agree), like a Tensile
logic file: the runtime matches the call's M against it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

from .. import __version__
from . import planner
from .buckets import BUCKETS, representative_M
from .compiler import compile_config, compile_kernel, nvrtc_version
from .errors import UserError
from .spec import Spec

# Where the plan is made for N or K left "any": the kernels take N and K at
# run time (within the alignment rules), the tile choice assumes this size.
DEFAULT_NK = 4096

ARGUMENTS = [
    ("a", "const void*", "activations [M, K] (row-major, spec a.dtype)"),
    ("a_scale", "const float*", "per-row activation scales [M] (int8/fp8 activations) or null"),
    ("b", "const void*", "stored weight (qweight) in the spec's layout"),
    ("s", "const void*", "weight scales in the spec's layout, or null"),
    ("z", "const void*", "weight zero points in the spec's layout, or null"),
    ("bias", "const void*", "bias [N] (out dtype) or null"),
    ("out", "void*", "output [M, N] (row-major, spec out.dtype)"),
    ("ws", "float*", "split-K workspace [M*N] fp32, zero-initialised once (kernels leave it zeroed)"),
    ("counters", "int*", "split-K tile counters, zero-initialised once"),
    ("M", "int", ""), ("N", "int", ""), ("K", "int", ""),
]
# The TMA GEMM (launches whose "tma" entry is set) takes its operands as
# tensor maps passed by value instead of a / b.
TMA_ARGUMENTS = [
    ("tmA", "const __grid_constant__ CUtensorMap",
     "activations [M, K]: cuTensorMapEncodeTiled, 2-D, box = tma.box_a, 128-byte swizzle, zero OOB fill"),
    ("tmB", "const __grid_constant__ CUtensorMap",
     "weights: dense [N, K] (for predecode: the dequant launch's output), box = tma.box_b, same "
     "settings; or the stored words of decoded weights as 4-byte elements [rows, row bytes / 4] "
     "of their stored layout, box = tma.box_b, no swizzle"),
] + [a for a in ARGUMENTS if a[0] not in ("a", "b")]


def _tma_launch(cfg: planner.Config, geom: dict) -> Optional[dict]:
    """What a caller needs to build the tensor maps of a TMA launch: box sizes
    {rows, elements} and the element size (the map's data type: 1 = UINT8,
    2 = UINT16); cluster blocks along M are compiled in (__cluster_dims__)."""
    if not geom.get("tma"):
        return None
    out = dict(elem_bytes=geom["ce"], box_a=list(planner.tma_box_a(cfg, geom["ce"])), box_b=[cfg.BN // cfg.cluster, cfg.BK],
               swizzle="128B", oob_fill="zeros", cluster=[1, cfg.cluster, 1],
               arguments=[dict(name=n, type=t, doc=d) for n, t, d in TMA_ARGUMENTS])
    if not geom["dense"]:           # the stored words: 4-byte elements, unswizzled boxes of the raw tile
        out.update(b_elem_bytes=4, box_b=[geom["b_rows"], geom["b_rowb"] // 4], b_swizzle="none")
    return out


def build_spec(spec: Spec, out_dir, arch: str, M: Optional[int] = None,
               N: Optional[int] = None, K: Optional[int] = None) -> List[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if spec.op == "quantize":
        return _build_quantize(spec, out, arch)
    N = N or spec.shape.N or DEFAULT_NK
    K = K or spec.shape.K or DEFAULT_NK
    try:
        planner.check_shape(spec, N, K)
    except planner.PlanError as e:
        raise UserError(f"{spec.name}: {e}") from None
    buckets = {str(M): M} if M else {label: representative_M(label) for _, _, label in BUCKETS}
    kernels: Dict[str, dict] = {}
    dispatch = {}
    written: List[Path] = []
    for label, m in buckets.items():
        cfg = planner.heuristic(spec, arch, m, N, K)
        dispatch[label] = cfg.name
        if cfg.name in kernels:
            continue
        launches = []
        for (_, stage_cfg), c in zip(planner.stages(spec, cfg), compile_config(spec, cfg, arch)):
            stem = cfg.name if stage_cfg.family != "dequant" else f"{cfg.name}.{stage_cfg.name}"
            written += _write(out, stem, c)
            launches.append(dict(
                entry=c.name, source=f"{stem}.cu", cubin=f"{stem}.{_target(c)}.cubin",
                target=_target(c),   # sm_90a cubins (wgmma) run on compute capability 9.0 only
                config=stage_cfg.to_dict(), block=[c.geometry["threads"], 1, 1],
                dynamic_smem=planner.launch_smem(c.geometry, stage_cfg, K),
                grid=_grid_rule(stage_cfg, c.geometry), ptxas=c.resources,
                **({"tma": _tma_launch(stage_cfg, c.geometry)} if c.geometry.get("tma") else {})))
        *before, kernels[cfg.name] = launches
        if before:
            # Launched first, on the same stream: writes the dense [N, K] weights
            # (activation dtype) that the GEMM then reads as its `b` (s, z null).
            kernels[cfg.name] = dict(kernels[cfg.name], config=cfg.to_dict(), before=before)
    plan = dict(opgen=__version__, spec=spec.name, spec_hash=spec.content_hash(), arch=arch,
                nvrtc=nvrtc_version(), N=N, K=K,
                alignment=f"K % {planner.K_ALIGN} == 0, N % {planner.N_ALIGN} == 0, "
                          "K % group == 0 (see docs/spec.md)",
                arguments=[dict(name=n, type=t, doc=d) for n, t, d in ARGUMENTS],
                dispatch=dispatch, kernels=kernels)
    p = out / "plan.json"
    p.write_text(json.dumps(plan, indent=1) + "\n")
    return written + [p]


def _target(c) -> str:
    """The NVRTC target a kernel was compiled for (sm_90a for wgmma kernels)."""
    return c.geometry.get("target", c.arch)


def _write(out: Path, stem: str, c) -> List[Path]:
    """The generated source and its cubin, side by side."""
    cu, cb = out / f"{stem}.cu", out / f"{stem}.{_target(c)}.cubin"
    cu.write_text(c.source)
    cb.write_bytes(c.cubin)
    return [cu, cb]


def _grid_rule(cfg: planner.Config, geom: dict) -> str:
    if cfg.family == "gemm" and cfg.cluster > 1:
        return f"[ceil(N/{cfg.BN}), ceil(M/{cfg.BM}) rounded up to a multiple of {cfg.cluster}, 1]"
    if cfg.family == "gemm":
        return f"[ceil(N/{cfg.BN}), ceil(M/{cfg.BM}), {cfg.split_k}]"
    if cfg.family == "dequant":
        return f"[ceil(N/{cfg.BN}), {planner.DEQUANT_KSPLIT}, 1]"
    if geom["scheme"] == "row":
        return f"[ceil(N/{cfg.warps * (16 if cfg.tc else cfg.cols)}), {cfg.split_k}, 1]"
    return f"[ceil(N/{geom['vec'].n_extent}/32), {cfg.split_k}, 1]"


def _build_quantize(spec: Spec, out: Path, arch: str) -> List[Path]:
    c = compile_kernel(spec, None, arch)
    name = c.name
    cu, cb = _write(out, name, c)
    plan = dict(opgen=__version__, spec=spec.name, spec_hash=spec.content_hash(), arch=arch,
                kernels={name: dict(entry=name, source=cu.name, cubin=cb.name,
                                    block=[c.geometry["threads"], 1, 1], grid="[M, 1, 1]",
                                    ptxas=c.resources)},
                alignment="K % 8 == 0",
                arguments=[dict(name="x", type="const void*", doc="input [M, K]"),
                           dict(name="codes", type="void*", doc="codes [M, K] (out dtype)"),
                           dict(name="scale", type="float*", doc="per-row scales [M]"),
                           dict(name="M", type="int", doc=""), dict(name="K", type="int", doc="")])
    p = out / "plan.json"
    p.write_text(json.dumps(plan, indent=1) + "\n")
    return [cu, cb, p]
