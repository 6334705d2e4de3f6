"""`opgen build`: spec -> generated .cu + cubin per kernel + a JSON plan.

For a dynamic M the plan holds one kernel per M bucket's heuristic pick (the
same kernel serves several buckets when their picks agree), like a Tensile
logic file: the runtime matches the call's M against it.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, List, Optional

from .version import __version__
from . import hw, planner
from .buckets import BUCKETS, representative_M
from .compiler import compile_config, compile_kernel, default_config, nvrtc_version
from .errors import UserError
from .files import write_atomic
from .canonical import spec_to_yaml_dict
from .kernel_args import ARGUMENTS, TMA_ARGUMENTS
from .planner.config import QUANTIZE_K_ALIGN, shape_problems
from .spec import Spec
from .transcode import steps

# Where the plan is made for N or K left "any": the kernels take N and K at
# run time (within the alignment rules), the tile choice assumes this size.
DEFAULT_NK = 4096


def _tma_launch(boxes: planner.TmaBoxes) -> dict:
    """What a caller needs to build the tensor maps of a TMA launch (the
    plan's boxes): box sizes {rows, elements} and the element size (the map's
    data type: 1 = UINT8, 2 = UINT16); cluster blocks along M are compiled in
    (__cluster_dims__)."""
    out = dict(elem_bytes=boxes.elem_bytes, box_a=list(boxes.box_a), box_b=list(boxes.box_b),
               swizzle="128B", oob_fill="zeros", cluster=[1, boxes.cluster, 1],
               arguments=[a.describe() for a in TMA_ARGUMENTS])
    if boxes.stored is not None:    # the stored words: 4-byte elements, unswizzled boxes of the raw tile
        out.update(b_elem_bytes=boxes.b_elem_bytes, b_swizzle="none")
    return out


def build_spec(spec: Spec, out_dir, arch: str, M: Optional[int] = None,
               N: Optional[int] = None, K: Optional[int] = None) -> List[Path]:
    given = {"N": spec.shape.N if N is None else N, "K": spec.shape.K if K is None else K}
    if spec.op != "quantize":
        N, K = (DEFAULT_NK if given[d] is None else given[d] for d in ("N", "K"))
    problems = shape_problems(spec, N=N, K=K, M=M)
    if problems:
        # A size the user never gave is named as build's default, with the way to set it.
        raise UserError(f"{spec.name}: " + "; ".join(
            p + (f" ({dim}={DEFAULT_NK} is the default: the spec leaves shape.{dim} any; give "
                 f"--{dim} or fix shape.{dim})" if dim in given and given[dim] is None else "")
            for dim, p in problems))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if spec.op == "quantize":
        return _build_quantize(spec, out, arch)
    buckets = {str(M): M} if M else {label: representative_M(label) for _, _, label in BUCKETS}
    sms = hw.planned_device(arch).sms       # no GPU to ask: the device the arch is planned for
    stored, spec = spec, planner.execution_spec(spec, arch)     # the kernels read the latter
    kernels: Dict[str, dict] = {}
    dispatch = {}
    written: List[Path] = []
    for label, m in buckets.items():
        cfg = default_config(spec, arch, m, N, K, sms)
        dispatch[label] = cfg.name
        if cfg.name in kernels:
            continue
        launches = []
        for (_, stage_cfg), c in zip(planner.stages(spec, cfg), compile_config(spec, cfg, arch)):
            stem = cfg.name if stage_cfg.family != "dequant" else f"{cfg.name}.{stage_cfg.name}"
            written += _write(out, stem, c)
            launches.append(dict(
                entry=c.name, source=f"{stem}.cu", cubin=f"{stem}.{c.plan.target}.cubin",
                cubin_sha256=hashlib.sha256(c.cubin).hexdigest(),
                target=c.plan.target,   # sm_90a cubins (wgmma) run on compute capability 9.0 only
                config=stage_cfg.to_dict(), block=[c.plan.threads, 1, 1],
                dynamic_smem=c.plan.smem_at(K), grid=c.plan.grid.text(), ptxas=c.resources,
                **({"tma": _tma_launch(c.plan.tma)} if c.plan.tma else {})))
        *before, kernels[cfg.name] = launches
        if before:
            # Launched first, on the same stream: writes the dense [N, K] weights
            # (activation dtype) that the GEMM then reads as its `b` (s, z null).
            kernels[cfg.name] = dict(kernels[cfg.name], config=cfg.to_dict(), before=before)
    plan = dict(opgen=__version__, spec=stored.name, spec_hash=stored.content_hash(), arch=arch,
                nvrtc=nvrtc_version(), N=N, K=K, execution=_execution(stored, spec),
                alignment=f"K % {planner.K_ALIGN} == 0, N % {planner.N_ALIGN} == 0, "
                          "K % group == 0 (see docs/spec.md)",
                arguments=[a.describe() for a in ARGUMENTS],
                dispatch=dispatch, kernels=kernels)
    return written + [_write_plan(out, plan)]


def _execution(stored: Spec, spec: Spec) -> dict:
    """plan.json's account of the execution layout: the spec the kernels
    read, its weight's storage, and what the one-time transcode does to each
    stored tensor (opgen.load's prepare)."""
    weight = spec_to_yaml_dict(spec)["b"]
    return dict(spec=spec.name, spec_hash=spec.content_hash(),
                weight={k: weight[k] for k in ("layout", "pack", "scale", "zero") if k in weight},
                transcode=steps(stored, spec))


def _write(out: Path, stem: str, c) -> List[Path]:
    """The generated source and its cubin (named for its NVRTC target: sm_90a
    for wgmma kernels), side by side; each written whole or not at all."""
    cu, cb = out / f"{stem}.cu", out / f"{stem}.{c.plan.target}.cubin"
    write_atomic(cu, c.source)
    write_atomic(cb, c.cubin)
    return [cu, cb]


def _write_plan(out: Path, plan: dict) -> Path:
    """plan.json, written last: a build cut short (or another build into the
    same folder) leaves cubins that its cubin_sha256 values tell apart."""
    p = out / "plan.json"
    write_atomic(p, json.dumps(plan, indent=1) + "\n")
    return p


def _build_quantize(spec: Spec, out: Path, arch: str) -> List[Path]:
    c = compile_kernel(spec, None, arch)
    name = c.name
    cu, cb = _write(out, name, c)
    plan = dict(opgen=__version__, spec=spec.name, spec_hash=spec.content_hash(), arch=arch,
                kernels={name: dict(entry=name, source=cu.name, cubin=cb.name,
                                    cubin_sha256=hashlib.sha256(c.cubin).hexdigest(),
                                    block=[c.plan.threads, 1, 1], grid=c.plan.grid.text(),
                                    ptxas=c.resources)},
                alignment=f"K % {QUANTIZE_K_ALIGN} == 0",
                arguments=[dict(name="x", type="const void*", doc="input [M, K]"),
                           dict(name="codes", type="void*", doc="codes [M, K] (out dtype)"),
                           dict(name="scale", type="float*", doc="per-row scales [M]"),
                           dict(name="M", type="int", doc=""), dict(name="K", type="int", doc="")])
    return [cu, cb, _write_plan(out, plan)]
