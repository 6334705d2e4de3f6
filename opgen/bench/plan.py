"""What `opgen bench` runs: its command-line options, the default and --quick
sets of specs, shapes (N x K) and token counts (M), the peers, and the
resolution of all that into a Plan.  Pure Python: no torch, no cupy."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

# --- what to run ------------------------------------------------------------------

DEFAULT_SHAPES: Tuple[Tuple[int, int], ...] = (
    (4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672), (14336, 57344))
DEFAULT_MS: Tuple[int, ...] = (1, 16, 32, 64, 128, 256, 1024, 4096)
QUICK_SHAPES: Tuple[Tuple[int, int], ...] = ((8192, 8192),)
QUICK_MS: Tuple[int, ...] = (1, 16, 64, 256, 4096)
QUICK_SPECS: Tuple[str, ...] = (
    "gptq_v2_w4a16_g128", "gptq_v2_w4a16_g128_repacked", "w4a16_sym_g128", "w2a16_g128",
    "w1a16_g128", "bitnet_b158",
    "bnb_nf4", "mxfp4", "w8a8_int8", "fp8_e4m3_w8a8")
DEFAULT_OUT = os.path.join("bench", "results", "h200")
DEFAULT_BUDGET_MS = 20.0       # device time per measurement (the tuner uses 30)
DEFAULT_MEM_CAP_GB = 4.0       # most memory the rotating copies of one problem may take

# Peers, in table order.  Each is timed once per (N, K, M) and shared by all specs.
PEERS: Tuple[str, ...] = ("cublas_fp16", "cublas_bf16", "tinygemm_int4", "int_mm",
                          "scaled_mm", "bminf_w8a8")
PEER_LABELS = {
    "cublas_fp16": "cuBLAS fp16", "cublas_bf16": "cuBLAS bf16",
    "tinygemm_int4": "tinygemm int4", "int_mm": "torch._int_mm",
    "scaled_mm": "torch._scaled_mm", "bminf_w8a8": "BMINF W8A8 (unfused)",
}
BASELINE = "cublas_fp16"


# --- argument parsing -------------------------------------------------------------

def parse_ints(text: str) -> List[int]:
    """'1,16,64' -> [1, 16, 64] (positive, duplicates dropped, order kept)."""
    try:
        vals = [int(v, 0) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return list(dict.fromkeys(vals))


def parse_shapes(text: str) -> List[Tuple[int, int]]:
    """'8192x8192,4096x14336' -> [(N, K), ...] (N x K, as in the tuning DB)."""
    out = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        parts = item.lower().replace("*", "x").split("x")
        try:
            n, k = (int(p, 0) for p in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(f"shape {item!r}: expected NxK, e.g. 8192x8192") from None
        if n < 1 or k < 1:
            raise argparse.ArgumentTypeError(f"shape {item!r}: N and K must be positive")
        out.append((n, k))
    if not out:
        raise argparse.ArgumentTypeError(f"expected NxK[,NxK...], got {text!r}")
    return list(dict.fromkeys(out))


def parse_names(text: str) -> List[str]:
    names = [v for v in text.replace(" ", "").split(",") if v]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return list(dict.fromkeys(names))


def _peer_names(text: str) -> List[str]:
    names = parse_names(text)
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(bad)} (known: {', '.join(PEERS)})")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `opgen bench` / `python -m opgen.bench`."""
    p.add_argument("--quick", action="store_true",
                   help=f"{'/'.join(f'{n}x{k}' for n, k in QUICK_SHAPES)}, M in "
                        f"{','.join(map(str, QUICK_MS))}, {len(QUICK_SPECS)} specs "
                        "(--specs/--shapes/--Ms still override)")
    p.add_argument("--specs", type=parse_names, default=None, metavar="A,B",
                   help="specs (shipped names or YAML files; default: every shipped matmul spec)")
    p.add_argument("--shapes", type=parse_shapes, default=None, metavar="NxK,...",
                   help="weight shapes N x K (default: "
                        + ",".join(f"{n}x{k}" for n, k in DEFAULT_SHAPES) + ")")
    p.add_argument("--Ms", type=parse_ints, default=None, metavar="M,...",
                   help="token counts (default: " + ",".join(map(str, DEFAULT_MS)) + ")")
    p.add_argument("--peers", type=_peer_names, default=None, metavar="A,B",
                   help="peers to time (default: all of " + ",".join(PEERS) + "; "
                        f"{BASELINE} is always timed)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--budget-ms", type=float, default=DEFAULT_BUDGET_MS,
                   help=f"device time per measurement (default {DEFAULT_BUDGET_MS:g})")
    p.add_argument("--db", default=None, metavar="PATH",
                   help="tuning DB (default: $OPGEN_TUNING_DB or ~/.cache/opgen/tuning.json)")
    p.add_argument("--no-db", action="store_true", help="ignore the tuning DB: heuristic configs only")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking opgen's output rows against the numpy reference")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--workers", type=int, default=None,
                   help="compile processes (default: all cores)")
    p.add_argument("--mem-cap-gb", type=float, default=DEFAULT_MEM_CAP_GB,
                   help="memory for the rotating input copies of one problem")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(entry="opgen bench")


@dataclass(frozen=True)
class Plan:
    specs: Tuple[str, ...]          # as given (names or paths); None entries never
    shapes: Tuple[Tuple[int, int], ...]
    Ms: Tuple[int, ...]
    peers: Tuple[str, ...]


def resolve_plan(args: argparse.Namespace, shipped_matmul: Optional[Sequence[str]] = None) -> Plan:
    """The specs, shapes, Ms and peers to run: --quick's set, else the full
    defaults; an explicit --specs/--shapes/--Ms/--peers wins over both.
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
    return Plan(specs, shapes, Ms, peers)


def shipped_matmul_specs() -> List[str]:
    from opgen.codegen.validate import load_spec, shipped_specs
    return [name for name, path in shipped_specs().items() if load_spec(path).op == "matmul"]


def _load_specs(names: Sequence[str], command: str = "opgen bench"):
    """Spec arguments (shipped names or YAML files) -> Specs, each a matmul
    (a UserError names the one that is not)."""
    from opgen.codegen.errors import UserError
    from opgen.codegen.validate import load_spec, resolve_spec
    specs = []
    for arg in names:
        p = resolve_spec(arg)
        spec = load_spec(p, filename=arg if Path(arg).is_file() else str(p))
        if spec.op != "matmul":
            raise UserError(f"{arg}: op {spec.op!r} is not a matmul; {command} takes matmuls")
        specs.append(spec)
    return specs
