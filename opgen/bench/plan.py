"""What `opgen bench` runs: the default and --quick sets of specs, shapes
(N x K) and token counts (M), the peers, and the resolution of the command
line's choices into a Plan (the options themselves: opgen/cli/bench.py).
Pure Python: no torch, no cupy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..codegen.errors import UserError
from ..codegen.spec import Spec
from ..codegen.resolve import as_spec, load_spec, shipped_specs

DEFAULT_SHAPES: Tuple[Tuple[int, int], ...] = (
    (4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672), (14336, 57344))
DEFAULT_MS: Tuple[int, ...] = (1, 16, 32, 64, 128, 256, 1024, 4096)
QUICK_SHAPES: Tuple[Tuple[int, int], ...] = ((8192, 8192),)
QUICK_MS: Tuple[int, ...] = (1, 16, 64, 256, 4096)
QUICK_SPECS: Tuple[str, ...] = (
    "gptq_v2_w4a16_g128", "gptq_v2_w4a16_g128_repacked", "w4a16_sym_g128", "w2a16_g128",
    "w1a16_g128", "bitnet_b158",
    "bnb_nf4", "mxfp4", "w8a8_int8", "fp8_e4m3_w8a8")
DEFAULT_BUDGET_MS = 20.0       # device time per measurement (the tuner uses 30)
DEFAULT_MEM_CAP_GB = 4.0       # most memory the rotating copies of one problem may take

# Peers, in table order.  Each is timed once per (N, K, M) and shared by all specs.
PEERS: Tuple[str, ...] = ("cublas_fp16", "cublas_bf16", "tinygemm_int4", "gemlite_w4", "int_mm",
                          "scaled_mm", "bminf_w8a8")
PEER_LABELS = {
    "cublas_fp16": "cuBLAS fp16", "cublas_bf16": "cuBLAS bf16",
    "tinygemm_int4": "tinygemm int4", "gemlite_w4": "gemlite W4 g128", "int_mm": "torch._int_mm",
    "scaled_mm": "torch._scaled_mm", "bminf_w8a8": "BMINF W8A8 (unfused)",
}
BASELINE = "cublas_fp16"


@dataclass(frozen=True)
class Plan:
    specs: Tuple[str, ...]          # as given (names or paths); None entries never
    shapes: Tuple[Tuple[int, int], ...]
    Ms: Tuple[int, ...]
    peers: Tuple[str, ...]
    graph: bool = True              # graph mode too (graph.py; --no-graph: isolated only)
    pdl: bool = True                # graph mode's PDL variant too, sm_90+ (--no-pdl: without)


def resolve_plan(args, shipped_matmul: Optional[Sequence[str]] = None) -> Plan:
    """The specs, shapes, Ms and peers to run (args: the command line's
    specs, shapes, Ms, peers, quick, no_graph and no_pdl): --quick's set,
    else the full defaults; an explicit --specs/--shapes/--Ms/--peers wins
    over both. Graph mode is on unless --no-graph, its PDL variant unless
    --no-pdl.
    shipped_matmul: the default spec list (asked of the shipped specs if None)."""
    if args.specs:
        specs = tuple(args.specs)
    elif args.quick:
        specs = QUICK_SPECS
    else:
        specs = tuple(shipped_matmul if shipped_matmul is not None else shipped_matmul_specs())
    shapes = tuple(args.shapes) if args.shapes else (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    Ms = tuple(sorted(args.Ms)) if args.Ms else (QUICK_MS if args.quick else DEFAULT_MS)
    peers = tuple(args.peers) if args.peers else PEERS
    if BASELINE not in peers:
        peers = (BASELINE,) + peers
    return Plan(specs, shapes, Ms, peers, graph=not args.no_graph, pdl=not args.no_pdl)


def shipped_matmul_specs() -> List[str]:
    """The names of every shipped matmul spec (`opgen bench`'s and `opgen tune
    --all`'s default)."""
    return [name for name, path in shipped_specs().items() if load_spec(path).op == "matmul"]


def matmul_specs(names: Sequence[str], command: str = "opgen bench") -> List[Spec]:
    """Spec arguments (shipped names or YAML files) -> Specs, each a matmul
    (a UserError names the one that is not)."""
    specs = []
    for arg in names:
        spec = as_spec(arg)
        if spec.op != "matmul":
            raise UserError(f"{arg}: op {spec.op!r} is not a matmul; {command} takes matmuls")
        specs.append(spec)
    return specs
