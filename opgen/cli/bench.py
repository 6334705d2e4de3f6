"""`opgen bench` (also `python -m opgen.bench`): its options, and the run
(opgen/bench/entry.py) they start."""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import List, Optional, Sequence

from ..bench import entry
from ..bench.plan import (BASELINE, DEFAULT_BUDGET_MS, DEFAULT_MEM_CAP_GB, DEFAULT_MS,
                          DEFAULT_SHAPES, PEERS, QUICK_MS, QUICK_SHAPES, QUICK_SPECS)
from ..codegen.errors import SpecErrors, UserError
from .args import parse_ints, parse_names, parse_shapes
from .command import Command

HELP = "time opgen's kernels against cuBLAS/torch peers on this GPU (JSON, Markdown, plots)"


def _peer_names(text: str) -> List[str]:
    names = parse_names(text)
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(bad)} (known: {', '.join(PEERS)})")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `opgen bench` / `python -m opgen.bench`."""
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory for bench.json, bench.md and the plots (required: "
                        "a run writes nowhere it is not told to)")
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
    p.add_argument("--budget-ms", type=float, default=DEFAULT_BUDGET_MS,
                   help=f"device time per measurement (default {DEFAULT_BUDGET_MS:g})")
    p.add_argument("--db", default=None, metavar="PATH",
                   help="tuning DB (default: $OPGEN_TUNING_DB or ~/.cache/opgen/tuning.json)")
    p.add_argument("--no-db", action="store_true", help="ignore the tuning DB: heuristic configs only")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking opgen's output rows against the numpy reference")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--no-graph", action="store_true",
                   help="skip graph mode (L layers back to back in one CUDA graph, rows with M <= 16)")
    p.add_argument("--workers", type=int, default=None,
                   help="compile processes (default: all cores but one)")
    p.add_argument("--mem-cap-gb", type=float, default=DEFAULT_MEM_CAP_GB,
                   help="memory for the rotating input copies of one problem")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(entry="opgen bench")


def command_line(args: argparse.Namespace) -> str:
    """The command as typed (for bench.json)."""
    name = getattr(args, "entry", "opgen bench")
    rest = sys.argv[1:]
    if name == "opgen bench" and rest[:1] == ["bench"]:
        rest = rest[1:]
    return " ".join([name, shlex.join(rest)]).strip()


def cmd_bench(args: argparse.Namespace) -> int:
    return entry.run(args, command_line(args))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m opgen.bench [options]` (the same as `opgen bench`)."""
    p = argparse.ArgumentParser(prog="python -m opgen.bench", description=HELP)
    add_arguments(p)
    p.set_defaults(entry="python -m opgen.bench")
    args = p.parse_args(argv)
    try:
        return cmd_bench(args)
    except SpecErrors as e:
        sys.stdout.flush()
        for err in e.errors:
            print(err, file=sys.stderr)
        return 2
    except UserError as e:
        sys.stdout.flush()
        print(f"opgen bench: error: {e}", file=sys.stderr)
        return 2


COMMANDS = (Command("bench", HELP, add_arguments, cmd_bench),)
