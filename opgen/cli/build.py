"""`opgen build SPEC`: the CUDA sources (and a manifest) of a spec, no GPU needed."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

from ..codegen import hw
from ..codegen.build import build_spec
from ..codegen.errors import UserError
from ..codegen.resolve import as_spec
from ..codegen.validate import specialize_shape
from .args import positive_int
from .command import Command

DEFAULT_ARCH = "sm_90"


def _build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="spec file (.yaml) or shipped spec name")
    p.add_argument("-o", "--out", dest="out_dir", default=None, metavar="DIR",
                   help="output directory (default: build/<spec name>)")
    p.add_argument("--arch", choices=tuple(hw.ARCHS), default=DEFAULT_ARCH,
                   help=f"target GPU architecture (default {DEFAULT_ARCH})")
    for dim in ("M", "N", "K"):
        p.add_argument(f"--{dim}", type=positive_int, default=None, metavar=dim,
                       help=f"fix {dim} (must agree with the spec's shape)")


def cmd_build(args: argparse.Namespace) -> int:
    if args.out_dir == "":
        raise UserError("--out: an empty path; give the output directory")
    spec = as_spec(args.spec)
    shape = specialize_shape(spec, M=args.M, N=args.N, K=args.K)
    out_dir = Path(args.out_dir) if args.out_dir else Path("build") / spec.name
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out_dir}: cannot make the output directory ({e.strerror or e}"
                        + (f": {e.filename}" if e.filename and str(e.filename) != str(out_dir) else "")
                        + ")") from None
    if not os.access(out_dir, os.W_OK):
        raise UserError(f"--out {out_dir}: the output directory is not writable")
    try:
        result = build_spec(spec, out_dir, args.arch, M=shape.M, N=shape.N, K=shape.K)
    except OSError as e:
        # (the error may name the absolute temporary file of a relative --out)
        if e.filename and Path(os.path.abspath(e.filename)).is_relative_to(os.path.abspath(out_dir)):
            target = e.filename2 or e.filename
            raise UserError(f"--out {out_dir}: cannot write {target} ({e.strerror or e})") from None
        raise
    paths = _paths(result)
    for p in paths:
        print(p)
    for line in spill_warnings(next((Path(p) for p in paths if p.endswith("plan.json")), None)):
        print(f"opgen: warning: {line}", file=sys.stderr)
    return 0


def spill_warnings(plan_path: Optional[Path]) -> List[str]:
    """One line per kernel of plan.json that ptxas gave local memory (spills
    or a stack frame): it runs correctly, but slower than it should."""
    if plan_path is None or not plan_path.is_file():
        return []
    out = []

    def walk(x):
        if isinstance(x, dict):
            res = x.get("ptxas")
            if isinstance(res, dict) and (res.get("spill_bytes", 0) or res.get("stack", 0)):
                out.append(f"{x.get('entry', '?')}: ptxas spills {res.get('spill_bytes', 0)} bytes "
                           f"(stack frame {res.get('stack', 0)} bytes); see plan.json")
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(json.loads(plan_path.read_text()).get("kernels", {}))
    return out


def _paths(result) -> List[str]:
    if result is None:
        return []
    if isinstance(result, (str, Path)):
        return [str(result)]
    if isinstance(result, dict):
        return [str(v) for v in result.values()]
    return [str(p) for p in result]


COMMANDS = (Command("build", "generate CUDA sources for a spec", _build_args, cmd_build),)
